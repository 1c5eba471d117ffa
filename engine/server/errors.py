"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the matching status."""
from __future__ import annotations

from typing import Optional

from ..errors import (ChatTemplateError, ContextOverflow, EngineOutOfMemory, HearthError, InvalidOption,
                      TokenizerMissing, UnknownModel, UnsupportedArchitecture)


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_param(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def from_engine_error(exc: HearthError, model: Optional[str] = None) -> APIError:
    """The API error for an engine error raised while serving a request."""
    if isinstance(exc, UnknownModel):
        return APIError(404, exc.message, param="model", code="model_not_found")
    if isinstance(exc, ContextOverflow):
        return APIError(400, exc.message, param="messages", code="context_length_exceeded")
    if isinstance(exc, EngineOutOfMemory):
        return APIError(503, exc.message, type="server_error", code="out_of_memory")
    if isinstance(exc, InvalidOption):
        return APIError(400, exc.message, code="invalid_value")
    if isinstance(exc, (ChatTemplateError, TokenizerMissing, UnsupportedArchitecture)):
        return APIError(400, exc.message, param="model" if not isinstance(exc, ChatTemplateError) else "messages",
                        code=exc.kind)
    return APIError(500, exc.message, type="server_error", code=exc.kind)
