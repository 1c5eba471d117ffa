"""Typed errors with messages a user understands.

Every error the engine raises on purpose derives from HearthError. Each carries a `kind`
(a short stable word the app uses to pick an icon or a hint) and a message written for a person.
"""
from __future__ import annotations


class HearthError(Exception):
    kind = "error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class CheckpointNotFound(HearthError):
    kind = "not-found"


class NotACheckpoint(HearthError):
    kind = "not-a-checkpoint"


class MissingConfig(HearthError):
    kind = "missing-config"


class CorruptCheckpoint(HearthError):
    """A file is truncated, its header is malformed, or it disagrees with itself."""
    kind = "corrupt"


class MissingTensors(HearthError):
    kind = "missing-tensors"


class UnsupportedArchitecture(HearthError):
    kind = "unsupported-architecture"


class UnsupportedTensorType(HearthError):
    kind = "unsupported-tensor-type"


class TokenizerMissing(HearthError):
    kind = "tokenizer-missing"


class ChatTemplateError(HearthError):
    kind = "chat-template"


class UnknownModel(HearthError):
    kind = "unknown-model"


class UnknownSession(HearthError):
    kind = "unknown-session"


class EngineOutOfMemory(HearthError):
    kind = "out-of-memory"

    def __init__(self, message: str, needed_bytes: int = 0, free_bytes: int = 0):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes


class BackendUnavailable(HearthError):
    kind = "backend-unavailable"


class ContextOverflow(HearthError):
    kind = "context-overflow"


class Cancelled(HearthError):
    kind = "cancelled"


class ImportFailed(HearthError):
    kind = "import-failed"


class InvalidOption(HearthError):
    """A load or run option outside what the engine accepts (the message names the choices)."""
