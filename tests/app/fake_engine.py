"""A small stand-in for engine.Engine with the same API, for tests of the worker's mechanics
(ordering, coalescing, cancellation) that must not depend on model speed. The end-to-end tests use
the real engine."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from engine import errors
from engine.progress import ProgressEvent


@dataclass
class Manifest:
    id: str
    name: str
    path: str = "/models/fake.gguf"
    architecture: str = "LlamaForCausalLM"
    quantization: str = "Q4_1"
    context_length: int = 2048
    bytes: int = 90_000_000
    sha256: str = "ab" * 32
    source: str = "test"
    added_at: float = 0.0

    def to_dict(self):
        return dict(vars(self))


@dataclass
class Handle:
    id: str
    backend: str = "fake"


@dataclass
class TextDelta:
    text: str
    token_id: int


@dataclass
class Stats:
    prompt_tokens: int = 5
    prefilled_tokens: int = 5
    generated_tokens: int = 0
    ttft_s: float = 0.01
    tokens_per_s: float = 100.0
    stop_reason: str = "eos"
    context_used: int = 10
    context_limit: int = 2048


@dataclass
class Finished:
    stats: Stats


class FakeLibrary:
    def __init__(self):
        self.manifests = [Manifest("fake-1", "Fake One")]

    def list(self):
        return list(self.manifests)

    def import_path(self, path, progress=None):
        if "bad" in path:
            raise errors.NotACheckpoint(f"{path} holds no config.json/*.safetensors and is not a .gguf file")
        m = Manifest(path.rsplit("/", 1)[-1], path.rsplit("/", 1)[-1], path)
        self.manifests.append(m)
        return m

    def remove(self, model_id):
        self.manifests = [m for m in self.manifests if m.id != model_id]


class FakeEngine:
    def __init__(self, token_delay=0.0, n_tokens=50, load_steps=20, load_delay=0.005):
        self.library = FakeLibrary()
        self.token_delay = token_delay
        self.n_tokens = n_tokens
        self.load_steps = load_steps
        self.load_delay = load_delay
        self._loaded = {}
        self._sessions = {}
        self._cancel = {}
        self.backend_name = "fake"

    def load_model(self, model_id, progress=None, cancel=None, context_length=None):
        total = 1000 * self.load_steps
        progress(ProgressEvent("inspecting", 0, 0, ""))
        for i in range(self.load_steps + 1):
            if cancel is not None and cancel.is_set():
                raise errors.Cancelled("Loading was cancelled.")
            progress(ProgressEvent("loading weights", i * 1000, total, f"tensor {i}"))
            time.sleep(self.load_delay)
        for stage in ("preparing runner", "warming up", "resident"):
            progress(ProgressEvent(stage, 0, 0, ""))
        self._loaded[model_id] = Handle(model_id)
        return self._loaded[model_id]

    def loaded_models(self):
        return list(self._loaded.values())

    def unload(self, model_id):
        self._loaded.pop(model_id, None)

    def clear_sessions(self, model_id):
        pass

    def create_session(self, model_id, system_prompt=None, history=None):
        sid = f"s{len(self._sessions)}"
        self._sessions[sid] = list(history or [])
        self._cancel[sid] = threading.Event()
        return sid

    def set_history(self, sid, messages):
        self._sessions[sid] = list(messages)

    def release_session(self, sid):
        self._sessions.pop(sid, None)

    def cancel(self, sid):
        self._cancel[sid].set()

    def respond(self, sid, params):
        self._cancel[sid].clear()
        n = min(self.n_tokens, params.max_tokens)
        for i in range(n):
            if self._cancel[sid].is_set():
                yield Finished(Stats(generated_tokens=i, stop_reason="cancelled"))
                return
            if self.token_delay:
                time.sleep(self.token_delay)
            yield TextDelta(f"w{i} ", i)
        yield Finished(Stats(generated_tokens=n, stop_reason="max-tokens" if n == params.max_tokens else "eos"))
