"""The server's side of the engine: which models it serves, loading on first use, and the bridge
from the engine's blocking event streams to asyncio.

Generation itself runs where it always does: in each resident model's `ModelLoop` thread, the one
thread that steps the runner and batches every active request of all clients together. A request's
waiter thread here only moves that request's events from the engine onto the event loop; setting its
cancel event (client gone) ends the request within one engine step.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import AsyncIterator, Callable, Optional

from ..engine import Engine, Finished
from ..errors import HearthError, UnknownModel
from ..sampling import SamplingParams


@dataclass(frozen=True)
class RequestRecord:
    """One line of the live request log."""
    at: float
    method: str
    path: str
    model: str
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0
    duration_s: float = 0.0
    finish: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class EngineHost:
    def __init__(self, engine: Engine, models: Optional[list] = None, log_size: int = 500):
        """models: the ids served (None: every model in the library)."""
        self.engine = engine
        self.models = list(models) if models else None
        for model_id in self.models or []:
            engine.library.get(model_id)          # UnknownModel names the ids the library has
        self._load_lock = threading.Lock()
        self.log: deque = deque(maxlen=log_size)
        self.listeners: list[Callable[[RequestRecord], None]] = []
        self.active = 0
        self._active_lock = threading.Lock()
        self.finished: deque = deque(maxlen=log_size)   # GenerationStats of every reply, cancelled ones too

    # ----------------------------------------------------------------------------- models
    def served_models(self) -> list[dict]:
        loaded = {h.id for h in self.engine.loaded_models()}
        ids = self.models if self.models is not None else [m.id for m in self.engine.library.list()]
        for model_id in loaded:                     # a model the app loaded from a folder is served too
            if self.models is None and model_id not in ids:
                ids.append(model_id)
        return [{"id": i, "object": "model", "created": 0, "owned_by": "hearth",
                 "loaded": i in loaded} for i in ids]

    def _check_served(self, model_id: str) -> None:
        if self.models is not None and model_id not in self.models:
            raise UnknownModel(f"The model {model_id!r} is not served here (served: {', '.join(self.models)}).")

    def ensure_loaded(self, model_id: str) -> str:
        """Load the model on first use (blocking; the memory plan's check refuses what does not fit)."""
        self._check_served(model_id)
        if any(h.id == model_id for h in self.engine.loaded_models()):
            return model_id
        with self._load_lock:
            if not any(h.id == model_id for h in self.engine.loaded_models()):
                self.engine.library.get(model_id)
                self.engine.load_model(model_id)
        return model_id

    # ----------------------------------------------------------------------------- generation
    async def stream(self, model_id: str, tokens: list, params: SamplingParams,
                     constraint=None) -> AsyncIterator:
        """The engine's events for one reply; leaving the iteration early (a client that went away)
        cancels the reply within one engine step."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:                    # the event loop is gone (server shut down)
                cancel.set()

        def wait_for_engine() -> None:
            try:
                for event in self.engine.generate_tokens(model_id, tokens, params, cancel=cancel,
                                                         constraint=constraint):
                    if isinstance(event, Finished):
                        self.finished.append(event.stats)
                    put(("event", event))
            except BaseException as exc:            # noqa: BLE001 - handed to the request
                put(("error", exc))
            finally:
                put(("end", None))

        with self._active_lock:
            self.active += 1
        threading.Thread(target=wait_for_engine, name="hearth-serve-request", daemon=True).start()
        try:
            while True:
                kind, value = await queue.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            cancel.set()
            with self._active_lock:
                self.active -= 1

    async def complete(self, model_id: str, tokens: list, params: SamplingParams, constraint=None) -> Finished:
        finished = None
        async for event in self.stream(model_id, tokens, params, constraint):
            if isinstance(event, Finished):
                finished = event
        if finished is None:
            raise HearthError("The reply ended without a result.")
        return finished

    # ----------------------------------------------------------------------------- request log
    def record(self, record: RequestRecord) -> None:
        self.log.append(record)
        for listener in list(self.listeners):
            try:
                listener(record)
            except Exception:                        # a listener's bug must not fail a request
                pass


def now() -> float:
    return time.time()
