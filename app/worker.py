"""EngineWorker: the one object that touches the Engine, living in its own QThread.

The GUI never calls the engine. It talks to the worker through `EngineClient`, which turns method
calls into queued signals (so every engine call runs in the worker thread) and re-emits the worker's
signals in the GUI thread (so views and tests observe them there).

Long work and cancellation:
- A load is one blocking engine call in the worker thread. Cancel sets a threading.Event straight
  from the GUI thread; the engine checks it between tensors and raises Cancelled.
- A reply is stepped from the worker's event loop: one token per `_step`, then the next step is
  posted behind any queued call (stop, unload, a new request). Stop also calls engine.cancel(sid),
  which is thread-safe, so even a long prefill ends within one step.
- Several chats reply at once (up to MAX_PARALLEL): each has its own engine session, the engine's
  loop batches their decode steps, and `_step` takes the running replies in turn, one event each.
  A second request for a chat that is still replying waits for it.
- Tokens are coalesced: text is emitted at most once per frame (16 ms), whatever the token rate.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time
import traceback
from dataclasses import asdict, is_dataclass
from typing import Optional

from . import qtcompat  # noqa: F401  (must run before the app makes Qt calls)
from PySide6.QtCore import QObject, Qt, QThread, QTimer, Signal, Slot

log = logging.getLogger("hearth.app")

FRAME_S = 0.016
MAX_PARALLEL = 4          # chats replying at once; more wait their turn
STATS_FIELDS = ("prompt_tokens", "prefilled_tokens", "generated_tokens", "ttft_s", "tokens_per_s",
                "stop_reason", "context_used", "context_limit")
PARAM_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed", "max_tokens", "stop")
DEFAULT_MODEL_ID = "smollm2-135m-instruct"
# What to do when a chat outgrows the loaded context (a chat's params["context_policy"]):
#   stop        refuse the message, say so (the engine's ContextOverflow)
#   drop-oldest drop the oldest turns, just enough to fit (the system prompt always stays)
#   rolling     drop the oldest turns down to half the context, so the next turns reuse the cached
#               prefix instead of shifting it every turn
CONTEXT_POLICIES = ("stop", "drop-oldest", "rolling")


def fit_turns(turns: list, count, limit: int, reserve: int, policy: str) -> tuple:
    """(turns kept, number dropped): the oldest turns dropped, in whole user+reply pairs, until
    count(turns) + reserve fits in limit (rolling: in half of it). The last user message always stays."""
    if policy not in ("drop-oldest", "rolling"):
        return turns, 0
    budget = limit - reserve if policy == "drop-oldest" else max(limit // 2, limit - reserve - limit // 2)
    if count(turns) + reserve <= limit:
        return turns, 0
    kept = list(turns)
    dropped = 0
    while len(kept) > 1 and count(kept) > budget:
        cut = 2 if len(kept) > 2 and kept[0]["role"] == "user" and kept[1]["role"] == "assistant" else 1
        del kept[:cut]
        dropped += cut
    return kept, dropped


def plain_backend_note(backend: str, note: str, build: Optional[dict]) -> str:
    """What the status bar says about where replies run, in words a user understands.

    The CUDA runtime's own reason ("CUDA driver version is insufficient for CUDA runtime version")
    is what a machine with no NVIDIA GPU at all reports; it belongs in the diagnostics, not here.
    """
    if backend != "torch" or build is None:
        return note
    if not build.get("cuda_compiled"):
        return "this build has no GPU support, so replies run on the CPU (slower)"
    if not build.get("device_count"):
        return "no NVIDIA GPU found, so replies run on the CPU (slower)"
    return note


def stats_dict(stats) -> dict:
    if stats is None:
        return {}
    if isinstance(stats, dict):
        source = stats
    elif is_dataclass(stats):
        source = asdict(stats)
    else:
        source = {name: getattr(stats, name) for name in STATS_FIELDS if hasattr(stats, name)}
    return {k: v for k, v in source.items() if isinstance(v, (int, float, str, bool, type(None)))}


def sampling_params(params: dict):
    from engine.sampling import SamplingParams
    kwargs = {k: v for k, v in params.items() if k in PARAM_FIELDS}
    if "stop" in kwargs:
        kwargs["stop"] = tuple(kwargs["stop"] or ())
    return SamplingParams(**kwargs)


class _Generation:
    def __init__(self, request, sid, events, context_note: str = ""):
        self.request = request
        self.sid = sid
        self.events = events
        self.context_note = context_note     # what the context policy dropped, shown under the reply
        self.buffer: list[str] = []
        self.tokens = 0
        self.t_start = time.perf_counter()
        self.t_first: Optional[float] = None
        self.t_last_emit = 0.0


class EngineWorker(QObject):
    # --- the fixed vocabulary (emitted in the worker thread) ---
    started = Signal(str, str)              # op, key
    done = Signal(str, str)                 # op, key: after every op, whether it worked or not
    #                                         (key: the path or model id; for "generate", the reply id)
    failed = Signal(str, str)               # kind, message (a HearthError's, or "internal")
    ready = Signal(str)                     # the engine is up; backend description
    progress = Signal(object)               # engine.progress.ProgressEvent (loads and imports)
    inspected = Signal(str, object)         # key (path or model id), CheckpointInfo
    memory_planned = Signal(str, object)    # key, {plan fields, free, total, device, ok, message}
    imported = Signal(object)               # ModelManifest
    removed = Signal(str)                   # model id
    library_changed = Signal(list)          # [ModelManifest]
    loaded = Signal(object)                 # ModelHandle
    unloaded = Signal(str)                  # model id
    token = Signal(str, str)                # chat id, text (coalesced: at most one per frame)
    metrics = Signal(str, object)           # chat id, live {"ttft_s", "tokens", "tokens_per_s", "context_used",
    #                                         "context_limit"}
    context_counted = Signal(str, object)   # chat id, {"context_used", "context_limit"} (count_context)
    diagnosed = Signal(object)              # {"build", "backend", "versions", "home"} (Logs & diagnostics)
    finished = Signal(str, object)          # chat id, stats dict
    # the OpenAI-compatible server and remote endpoints (app/widgets/server_panel.py)
    server_state = Signal(object)           # {"running", "url", "models", "api_key", "error"}
    server_request = Signal(object)         # engine.server.RequestRecord as a dict
    remotes_changed = Signal(object)        # [{"name", "base_url", "models", "error"}]

    def __init__(self, engine_factory=None):
        super().__init__()
        self._engine_factory = engine_factory
        self.engine = None
        self._load_cancel = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, _Generation] = {}      # chat id -> its reply; read from the GUI thread under _lock
        self._turns: collections.deque = collections.deque()   # chat ids, round-robin order of _step
        self._step_posted = False
        self._stop_requested: set[str] = set()          # chat ids, written from the GUI thread
        self._pending: collections.deque = collections.deque()
        self._sessions: dict[str, tuple] = {}           # chat id -> (sid, model id, system prompt)
        self._contexts: dict[str, int] = {}             # model id -> context length chosen by the user
        self._trims: dict[str, int] = {}                # chat id -> oldest messages its context policy left out
        self.default_context = 0                        # Settings: 0 = the engine's default
        self.precision = ""                             # Settings: "" = the engine's default
        self._flush_timer = QTimer(self)                # moves with the worker to its thread
        self._flush_timer.setSingleShot(True)
        self._flush_timer.timeout.connect(self._flush_active)

    # ---------------------------------------------------------------- thread-safe, any thread
    def cancel_load(self) -> None:
        self._load_cancel.set()

    @property
    def _active(self) -> Optional[_Generation]:
        """A reply being written (any one), or None."""
        with self._lock:
            return next(iter(self._running.values()), None)

    def running_chats(self) -> list:
        with self._lock:
            return list(self._running)

    def stop(self, chat_id: str) -> None:
        """Stop the reply for this chat (or the queued request): honoured within one step."""
        with self._lock:
            self._stop_requested.add(chat_id)
            active = self._running.get(chat_id)
        if active is not None and self.engine is not None:
            try:
                self.engine.cancel(active.sid)
            except Exception:  # the session may have just finished
                log.debug("cancel after finish", exc_info=True)

    def reply_progress(self, chat_id: str) -> Optional[dict]:
        """The reply being written for this chat: its prompt read so far, tokens, context (any thread)."""
        with self._lock:
            active = self._running.get(chat_id)
        if active is None or self.engine is None:
            return None
        try:
            return self.engine.reply_progress(active.sid)
        except Exception:   # the session ended between the two reads
            return None

    # ---------------------------------------------------------------- slots (worker thread)
    def _run(self, op: str, key: str, fn) -> None:
        self.started.emit(op, key)
        logged = op in ("load", "import", "install-default", "quantize", "remove", "unload")
        if logged:
            log.info("%s %s: started", op, key)
        t0 = time.perf_counter()
        try:
            fn()
            if logged:
                log.info("%s %s: done in %.1f s", op, key, time.perf_counter() - t0)
        except Exception as exc:  # every failure becomes a signal the window shows
            log.warning("%s %s: failed: %s", op, key, getattr(exc, "message", None) or exc)
            self._report(exc)
        finally:
            self.done.emit(op, key)

    def _report(self, exc: BaseException) -> None:
        kind = getattr(exc, "kind", None)
        message = getattr(exc, "message", None)
        if kind is None or message is None:
            log.error("engine call failed\n%s", "".join(traceback.format_exception(exc)))
            kind, message = "internal", f"{type(exc).__name__}: {exc}"
        self.failed.emit(kind, message)

    @Slot(str, str)
    def start_engine(self, backend: str, home: str) -> None:
        def go():
            if self._engine_factory is not None:
                self.engine = self._engine_factory()
            else:
                from engine import Engine
                self.engine = Engine(backend=backend or "auto", home=home or None)
            name = str(getattr(self.engine, "backend", None) or getattr(self.engine, "backend_name", None)
                       or backend or "auto")
            try:
                from engine import _native
                build = _native.build_info()
            except Exception:
                build = None
            note = plain_backend_note(name, getattr(self.engine, "backend_note", ""), build)
            self.ready.emit(f"{name} ({note})" if note else name)
            log.info("engine started: %s backend%s", name, f" ({note})" if note else "")
            self._emit_library()
            self._warm_imports(name)
            self.diagnosed.emit(self._diagnostics(name, getattr(self.engine, "backend_note", ""), build, home))
        self._run("start", backend, go)

    @staticmethod
    def _diagnostics(backend: str, note: str, build: Optional[dict], home: str) -> dict:
        import platform
        import sys
        build = dict(build or {})
        versions = [f"Python {sys.version.split()[0]}"]
        try:
            from importlib.metadata import version
            versions.insert(0, f"Hearth {version('hearth')}")
            versions.append(f"PySide6 {version('PySide6_Essentials')}")
        except Exception:
            pass
        try:
            torch = sys.modules.get("torch")     # named only if the backend imported it: never imported here
            if torch is None:
                raise ImportError
            versions.append(f"torch {torch.__version__}")
            if torch.cuda.is_available():
                build["device_names"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception:
            pass
        if build.get("cuda_compiled"):
            try:
                import ctypes
                from engine.backends import cuda_native
                cuda_native._preload_cublaslt()
                ctypes.CDLL("libcublasLt.so.13")
                build["cublaslt"] = True
            except Exception:
                build["cublaslt"] = False
        return {"build": build, "backend": f"{backend} ({note})" if note else backend,
                "versions": ", ".join(versions) + f" on {platform.system()} {platform.machine()}",
                "home": home or os.environ.get("HEARTH_HOME", "")}

    def resources(self) -> dict:
        """Memory now (any thread, cheap): free/total where weights live, this process's RAM, and the KV
        cache fill of each loaded model."""
        engine = self.engine
        if engine is None:
            return {}
        out = {}
        try:
            free, total, where = engine.free_memory()
            out.update(free_bytes=free, total_bytes=total, device=where)
        except Exception:
            log.debug("free_memory", exc_info=True)
        try:
            with open("/proc/self/statm") as f:
                out["process_bytes"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            pass
        fills = []
        for handle in list(getattr(engine, "loaded_models", lambda: [])()):
            try:
                used, capacity = engine.kv_fill(handle.id)
                fills.append({"model_id": handle.id, "used": used, "capacity": capacity})
            except Exception:
                log.debug("kv_fill", exc_info=True)
        out["kv"] = fills
        return out

    @staticmethod
    def _warm_imports(backend: str) -> None:
        """Import the backend now, while the user looks at the window, not during their first load.

        Importing torch and its op registry holds the GIL for long stretches (the GUI thread then
        waits 100+ ms at a time); here it happens once, right after start-up, before any load.
        """
        modules = {"torch": ["engine.backends.torch_ref", "engine.tokenizer", "engine.chat_template"],
                   "cuda-native": ["engine.backends.cuda_native", "engine.tokenizer", "engine.chat_template"]}
        import gc
        import importlib
        for name in modules.get(backend, []):
            try:
                importlib.import_module(name)
            except Exception:   # a missing backend is reported when it is used, not here
                log.debug("warm import of %s failed", name, exc_info=True)
        # Everything imported so far lives as long as the app: move it out of the cyclic collector's
        # reach, so a full collection later scans thousands of objects instead of millions (a full
        # collection holds the GIL; with torch imported it took 50 ms, a visible freeze).
        gc.collect()
        gc.freeze()

    @Slot()
    def refresh_library(self) -> None:
        self._run("library", "", self._emit_library)

    def _emit_library(self) -> None:
        if self.engine is not None:
            self.library_changed.emit(list(self.engine.library.list()))

    @Slot(str)
    def inspect(self, key: str) -> None:
        self._run("inspect", key, lambda: self.inspected.emit(key, self.engine.inspect(key)))

    @Slot(str, int)
    def set_context(self, model_id: str, tokens: int) -> None:
        """The context length the next plan and load of this model use (0 = the engine's default)."""
        if tokens > 0:
            self._contexts[model_id] = tokens
        else:
            self._contexts.pop(model_id, None)
        self.plan_memory(model_id)

    @Slot(str)
    def plan_memory(self, key: str) -> None:
        def go():
            plan = self.engine.memory_plan(key, context_length=self._contexts.get(key) or self.default_context or None,
                                           **({"precision": self.precision} if self.precision else {}))
            free, total, device = self.engine.free_memory()
            try:
                fit = plan.fits(free, device)
            except TypeError:
                fit = plan.fits(free)
            self.memory_planned.emit(key, {
                "weight_bytes": plan.weight_bytes, "kv_bytes_per_token": plan.kv_bytes_per_token,
                "kv_bytes": plan.kv_bytes, "workspace_bytes": plan.workspace_bytes,
                "total_bytes": plan.total_bytes, "context_length": getattr(plan, "context_length", None),
                "free_bytes": free, "device_total_bytes": total, "device": device,
                "max_context": plan.max_context,
                # a tenth kept spare: free memory moves (other programs), and a suggestion that fits
                # only at this instant would fail at the load a moment later
                "suggested_context": 0 if fit.ok else plan.max_context_for(int(free * 0.9)),
                "ok": bool(fit.ok), "message": fit.message})
        self._run("plan", key, go)

    def _progress_callback(self):
        last = {"stage": None, "t": 0.0}

        def callback(event) -> None:
            now = time.perf_counter()
            # Every stage change, every stage's last event, and otherwise at most one per frame.
            if (event.stage != last["stage"] or event.current_bytes >= event.total_bytes
                    or now - last["t"] >= FRAME_S):
                last["stage"], last["t"] = event.stage, now
                self.progress.emit(event)
        return callback

    @Slot(str)
    def import_path(self, path: str) -> None:
        def go():
            check = getattr(self.engine, "check_importable", None)
            if check is not None:     # an architecture Hearth cannot run is refused before any copy
                check(path)
            manifest = self.engine.library.import_path(path, progress=self._progress_callback())
            self.imported.emit(manifest)
            self._emit_library()
        self._run("import", path, go)

    @Slot(str)
    def quantize(self, model_id: str) -> None:
        """Write an NVFP4 copy of a library model into the library (engine.quantize)."""
        def go():
            from engine.quantize import quantize_model

            manifest = quantize_model(model_id, library=self.engine.library, progress=self._progress_callback())
            self.imported.emit(manifest)
            self._emit_library()
        self._run("quantize", model_id, go)

    @Slot(bool)
    def install_default(self, then_load: bool) -> None:
        def go():
            manifest = self.engine.install_default_model(progress=self._progress_callback())
            self.imported.emit(manifest)
            self._emit_library()
            if then_load:
                self._load(manifest.id)
        self._run("install-default", DEFAULT_MODEL_ID, go)

    @Slot(str)
    def remove(self, model_id: str) -> None:
        def go():
            if any(h.id == model_id for h in self.engine.loaded_models()):
                self._unload(model_id)
            self.engine.library.remove(model_id)
            self.removed.emit(model_id)
            self._emit_library()
        self._run("remove", model_id, go)

    @Slot(str)
    def load(self, model_id: str) -> None:
        self._run("load", model_id, lambda: self._load(model_id))

    def _load(self, model_id: str) -> None:
        self._load_cancel.clear()
        progress = self._progress_callback()

        def logged(event) -> None:
            if event.stage != getattr(logged, "stage", None):
                logged.stage = event.stage
                log.info("load %s: %s%s", model_id, event.stage, f" ({event.detail})" if event.detail else "")
            progress(event)
        kwargs = {"context_length": self._contexts.get(model_id) or self.default_context or None}
        if self.precision:
            kwargs["precision"] = self.precision
        handle = self.engine.load_model(model_id, progress=logged, cancel=self._load_cancel, **kwargs)
        self.loaded.emit(handle)

    @Slot(int, str)
    def set_defaults(self, context: int, precision: str) -> None:
        """The Settings page: the context length for models without their own, and the precision."""
        self.default_context = int(context) if context and context > 0 else 0
        self.precision = precision or ""

    @Slot(str)
    def unload(self, model_id: str) -> None:
        self._run("unload", model_id, lambda: self._unload(model_id))

    def _unload(self, model_id: str) -> None:
        with self._lock:
            using = [g for g in self._running.values() if g.request.model_id == model_id]
        for active in using:
            # The suspended reply still uses this model's runner: end it (cancel stops it within a step).
            self.stop(active.request.chat_id)
            self._drain(active)
        for chat_id, (sid, mid, _) in list(self._sessions.items()):
            if mid == model_id:
                self._sessions.pop(chat_id, None)
        try:
            self.engine.clear_sessions(model_id)
        except Exception:
            log.debug("clear_sessions", exc_info=True)
        self.engine.unload(model_id)
        self.unloaded.emit(model_id)

    @Slot(str, str, str, object)
    def count_context(self, chat_id: str, model_id: str, system_prompt: str, turns) -> None:
        """How much of the model's context this conversation takes (a reopened chat whose last reply
        was cut off has no stats to say so)."""
        def go():
            if not any(h.id == model_id for h in self.engine.loaded_models()):
                return
            prefix = [{"role": "system", "content": system_prompt}] if system_prompt else []
            tokens = self.engine.conversation_tokens(model_id, prefix + list(turns), add_generation_prompt=False)
            self.context_counted.emit(chat_id, {"context_used": len(tokens),
                                                "context_limit": self.engine.context_limit(model_id)})
        self._run("count", chat_id, go)

    @Slot(str)
    def release_chat(self, chat_id: str) -> None:
        entry = self._sessions.pop(chat_id, None)
        if entry is not None and self.engine is not None:
            try:
                self.engine.release_session(entry[0])
            except Exception:
                log.debug("release_session", exc_info=True)

    # ---------------------------------------------------------------- generation
    @Slot(object)
    def generate(self, request) -> None:
        """Queue one reply (app.models.GenerationRequest); chats reply side by side, one reply per chat."""
        self._pending.append(request)
        self._start_next()

    def _next_startable(self):
        with self._lock:
            if len(self._running) >= MAX_PARALLEL:
                return None
            for request in self._pending:
                if request.chat_id not in self._running:
                    self._pending.remove(request)
                    return request
        return None

    def _start_next(self) -> None:
        while True:
            request = self._next_startable()
            if request is None:
                return
            self.started.emit("generate", str(request.reply_id))
            with self._lock:
                stopped_early = request.chat_id in self._stop_requested
                self._stop_requested.discard(request.chat_id)
            if stopped_early:
                self.finished.emit(request.chat_id, {"stop_reason": "cancelled", "generated_tokens": 0})
                self.done.emit("generate", str(request.reply_id))
                continue
            try:
                if str(request.model_id).startswith("remote:"):   # engine.remote.model_ref: over HTTP
                    sid, events, note = "", self._remote_reply(request), ""
                else:
                    request, note = self._apply_context_policy(request)
                    sid = self._session_for(request)
                    events = iter(self.engine.respond(sid, sampling_params(request.params)))
            except Exception as exc:
                self._report(exc)
                self.done.emit("generate", str(request.reply_id))
                continue
            with self._lock:
                self._running[request.chat_id] = _Generation(request, sid, events, note)
                self._turns.append(request.chat_id)
            self._post_step()

    def _post_step(self) -> None:
        if not self._step_posted:
            self._step_posted = True
            QTimer.singleShot(0, self._step)

    def _drain(self, gen: "_Generation") -> None:
        """Run a cancelled reply to its end now (used before its model goes away)."""
        stats = {"stop_reason": "cancelled"}
        try:
            for event in gen.events:
                if hasattr(event, "stats"):
                    stats = stats_dict(event.stats)
                    break
                if getattr(event, "text", None):
                    gen.buffer.append(event.text)
        except Exception:
            log.debug("draining a cancelled reply", exc_info=True)
        self._end(gen, stats)

    def _apply_context_policy(self, request) -> tuple:
        """The request with its oldest turns dropped if the chat's policy says so; and a note saying what."""
        policy = (request.params or {}).get("context_policy", "stop")
        if policy == "stop" or not hasattr(self.engine, "conversation_tokens"):
            return request, ""
        system = [{"role": "system", "content": request.system_prompt}] if request.system_prompt else []
        limit = self.engine.context_limit(request.model_id)
        reserve = min(int(request.params.get("max_tokens") or 256), limit // 4)

        def count(turns):
            return len(self.engine.conversation_tokens(request.model_id, system + list(turns)))
        # Start where this chat's last trim left off: the kept turns stay a stable prefix (KV reuse),
        # and a rolling window only moves when it is full again.
        turns = list(request.turns)
        offset = self._trims.get(request.chat_id, 0)
        if offset >= len(turns) or (offset and turns[offset]["role"] != "user"):
            offset = 0
        kept, dropped = fit_turns(turns[offset:], count, limit, reserve, policy)
        dropped += offset
        self._trims[request.chat_id] = dropped
        if not dropped:
            return request, ""
        import dataclasses
        note = (f"the {dropped} oldest message{'s' if dropped != 1 else ''} left out to fit the "
                f"{limit:,}-token context" + (" (system prompt kept)" if system else ""))
        return dataclasses.replace(request, turns=kept), note

    def _session_for(self, request) -> str:
        entry = self._sessions.get(request.chat_id)
        system = request.system_prompt or None
        if entry is not None and entry[1] == request.model_id and entry[2] == system:
            try:
                # set_history replaces the whole conversation, the system message included
                prefix = [{"role": "system", "content": system}] if system else []
                self.engine.set_history(entry[0], prefix + list(request.turns))
                return entry[0]
            except Exception:  # e.g. UnknownSession after an unload: start afresh
                log.debug("set_history failed; new session", exc_info=True)
        if entry is not None:
            self.release_chat(request.chat_id)
        sid = self.engine.create_session(request.model_id, system_prompt=system, history=list(request.turns))
        self._sessions[request.chat_id] = (sid, request.model_id, system)
        return sid

    @Slot()
    def _step(self) -> None:
        """One event of the next running reply (round robin), then the next step is posted."""
        self._step_posted = False
        with self._lock:
            if not self._turns:
                return
            chat_id = self._turns[0]
            self._turns.rotate(-1)
            gen = self._running.get(chat_id)
        if gen is None:
            return
        self._step_one(gen)
        if self._running:
            self._post_step()

    def _step_one(self, gen: "_Generation") -> None:
        chat_id = gen.request.chat_id
        with self._lock:
            stop = chat_id in self._stop_requested
        if stop:
            try:
                self.engine.cancel(gen.sid)
            except Exception:
                log.debug("cancel", exc_info=True)
        try:
            event = next(gen.events)
        except StopIteration:
            self._end(gen, {"stop_reason": "cancelled" if stop else "eos"})
            return
        except Exception as exc:
            self._flush(gen)
            self._report(exc)
            self._end(gen, None)
            return
        text = getattr(event, "text", None)
        if text is not None and not hasattr(event, "stats"):
            now = time.perf_counter()
            if gen.t_first is None:
                gen.t_first = now
            gen.tokens += 1
            gen.buffer.append(text)
            if now - gen.t_last_emit >= FRAME_S:
                self._flush(gen)
            elif not self._flush_timer.isActive():
                self._flush_timer.start(max(1, int((FRAME_S - (now - gen.t_last_emit)) * 1000)))
            return
        if hasattr(event, "stats"):
            self._flush(gen)
            self._end(gen, stats_dict(event.stats))
            return
        # an event kind this app does not know: skip it

    def _flush_active(self) -> None:
        with self._lock:
            running = list(self._running.values())
        for gen in running:
            self._flush(gen)

    def _flush(self, gen: _Generation) -> None:
        with self._lock:
            others_waiting = any(g.buffer for g in self._running.values() if g is not gen)
        if not others_waiting:       # the one timer serves every running reply
            self._flush_timer.stop()
        gen.t_last_emit = time.perf_counter()
        if not gen.buffer:
            return
        text = "".join(gen.buffer)
        gen.buffer.clear()
        self.token.emit(gen.request.chat_id, text)
        live = {"tokens": gen.tokens}
        if gen.t_first is not None:
            live["ttft_s"] = gen.t_first - gen.t_start
            span = gen.t_last_emit - gen.t_first
            if gen.tokens > 1 and span > 0:
                live["tokens_per_s"] = (gen.tokens - 1) / span
        try:
            progress = self.engine.reply_progress(gen.sid)
            live["context_used"], live["context_limit"] = progress["context_used"], progress["context_limit"]
        except Exception:   # an engine without reply_progress (or the session just ended)
            pass
        self.metrics.emit(gen.request.chat_id, live)

    def _end(self, gen: _Generation, stats: Optional[dict]) -> None:
        chat_id = gen.request.chat_id
        with self._lock:
            if self._running.get(chat_id) is gen:
                del self._running[chat_id]
                self._turns.remove(chat_id)
            self._stop_requested.discard(chat_id)
        self._flush(gen)
        if stats is not None:
            if gen.context_note:
                stats = {**stats, "context_note": gen.context_note}
            self.finished.emit(chat_id, stats)
        self.done.emit("generate", str(gen.request.reply_id))
        if self._pending:
            QTimer.singleShot(0, self._start_next)

    # ---------------------------------------------------------------- server and remote endpoints
    @Slot(object)
    def start_server(self, options: dict) -> None:
        def go():
            from engine.server import Server, ServerConfig

            self._stop_server()
            config = ServerConfig(host=options.get("host") or "127.0.0.1", port=int(options.get("port", 8765)),
                                  api_key=options.get("api_key") or None)
            try:
                server = Server(self.engine, config)
                server.host.listeners.append(lambda record: self.server_request.emit(record.to_dict()))
                self._server = server.start()
            except Exception as exc:
                self.server_state.emit({"running": False, "error": getattr(exc, "message", str(exc))})
                raise
            self.server_state.emit({"running": True, "url": server.url, "api_key": bool(config.api_key),
                                    "models": [m["id"] for m in server.host.served_models()], "error": ""})
        self._run("serve", "", go)

    @Slot()
    def stop_server(self) -> None:
        self._run("serve", "", self._stop_server)

    def _stop_server(self) -> None:
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            server.stop()
            self.server_state.emit({"running": False, "error": ""})

    def _remote_endpoints(self):
        if getattr(self, "_remotes", None) is None:
            from engine.remote import RemoteEndpoints

            self._remotes = RemoteEndpoints(getattr(self.engine, "home", None))
        return self._remotes

    @Slot(object)
    def add_remote(self, spec: dict) -> None:
        def go():
            try:
                self._remote_endpoints().add(spec.get("name", ""), spec.get("base_url", ""), spec.get("api_key"))
            finally:
                self._emit_remotes()
        self._run("remote", spec.get("name", ""), go)

    @Slot(str)
    def remove_remote(self, name: str) -> None:
        self._run("remote", name, lambda: (self._remote_endpoints().remove(name), self._emit_remotes()))

    @Slot()
    def refresh_remotes(self) -> None:
        self._run("remote", "", self._emit_remotes)

    def _emit_remotes(self) -> None:
        endpoints, rows = self._remote_endpoints(), []
        for e in endpoints.list():
            try:
                models, error = endpoints.client(e.name, timeout=10).models(), ""
            except Exception as exc:
                models, error = [], getattr(exc, "message", str(exc))
            rows.append({"name": e.name, "base_url": e.base_url, "models": models, "error": error})
        self.remotes_changed.emit(rows)

    def _remote_reply(self, request):
        """A remote model's reply as engine events; one cut by a dropped connection ends as stopped."""
        from dataclasses import replace

        prefix = [{"role": "system", "content": request.system_prompt}] if request.system_prompt else []
        chat_id = request.chat_id
        endpoints = self._remote_endpoints()
        stream = endpoints.chat_stream(request.model_id, prefix + list(request.turns),
                                       sampling_params(request.params), cancel=lambda: chat_id in self._stop_requested)

        def events():
            for event in stream:
                stats = getattr(event, "stats", None)
                if stats is not None and stats.stop_reason == "connection-lost":
                    self.failed.emit("remote-connection-lost", "The connection to the remote endpoint dropped "
                                     "mid-reply; what arrived is kept as a stopped reply.")
                    event = replace(event, stats=replace(stats, stop_reason="cancelled"))
                yield event
        return events()

    @Slot()
    def shutdown(self) -> None:
        """Drop the engine in its own thread (frees device memory), then stop the thread."""
        self._stop_server()
        with self._lock:
            running = list(self._running.values())
            self._running.clear()
            self._turns.clear()
        for gen in running:
            try:
                self.engine.cancel(gen.sid)
            except Exception:
                pass
        self._pending.clear()
        engine, self.engine = self.engine, None
        try:
            close = getattr(engine, "close", None)
            if close is not None:
                close()
        except Exception:
            log.debug("engine close", exc_info=True)
        del engine
        QThread.currentThread().quit()


class EngineClient(QObject):
    """GUI-thread face of the worker: call its methods, connect to its signals."""

    started = Signal(str, str)
    done = Signal(str, str)
    failed = Signal(str, str)
    ready = Signal(str)
    progress = Signal(object)
    inspected = Signal(str, object)
    memory_planned = Signal(str, object)
    imported = Signal(object)
    removed = Signal(str)
    library_changed = Signal(list)
    loaded = Signal(object)
    unloaded = Signal(str)
    token = Signal(str, str)
    metrics = Signal(str, object)
    finished = Signal(str, object)
    server_state = Signal(object)
    server_request = Signal(object)
    remotes_changed = Signal(object)
    context_counted = Signal(str, object)
    diagnosed = Signal(object)

    # requests, delivered to the worker's slots in its thread (queued)
    _start_engine = Signal(str, str)
    _refresh = Signal()
    _inspect = Signal(str)
    _plan = Signal(str)
    _set_context = Signal(str, int)
    _import = Signal(str)
    _quantize = Signal(str)
    _install_default = Signal(bool)
    _remove = Signal(str)
    _load = Signal(str)
    _unload = Signal(str)
    _generate = Signal(object)
    _release = Signal(str)
    _count_context = Signal(str, str, str, object)
    _set_defaults = Signal(int, str)
    _shutdown = Signal()

    SIGNALS = ("started", "done", "failed", "ready", "progress", "inspected", "memory_planned", "imported",
               "removed", "library_changed", "loaded", "unloaded", "token", "metrics", "finished",
               "context_counted", "diagnosed")
    SIGNALS = SIGNALS + ("server_state", "server_request", "remotes_changed")
    _start_server = Signal(object)
    _stop_server = Signal()
    _add_remote = Signal(object)
    _remove_remote = Signal(str)
    _refresh_remotes = Signal()

    def __init__(self, engine_factory=None, parent=None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-engine")
        self.worker = EngineWorker(engine_factory)
        self.worker.moveToThread(self.thread)
        q = Qt.ConnectionType.QueuedConnection
        for name in self.SIGNALS:   # re-emitted here, in the GUI thread
            getattr(self.worker, name).connect(getattr(self, name), q)
        for request, slot in ((self._start_engine, self.worker.start_engine),
                              (self._refresh, self.worker.refresh_library),
                              (self._inspect, self.worker.inspect), (self._plan, self.worker.plan_memory),
                              (self._set_context, self.worker.set_context),
                              (self._import, self.worker.import_path),
                              (self._quantize, self.worker.quantize),
                              (self._install_default, self.worker.install_default),
                              (self._remove, self.worker.remove), (self._load, self.worker.load),
                              (self._unload, self.worker.unload), (self._generate, self.worker.generate),
                              (self._release, self.worker.release_chat),
                              (self._count_context, self.worker.count_context),
                              (self._set_defaults, self.worker.set_defaults),
                              (self._shutdown, self.worker.shutdown)):
            request.connect(slot, q)
        for request, slot in ((self._start_server, self.worker.start_server),
                              (self._stop_server, self.worker.stop_server),
                              (self._add_remote, self.worker.add_remote),
                              (self._remove_remote, self.worker.remove_remote),
                              (self._refresh_remotes, self.worker.refresh_remotes)):
            request.connect(slot, q)
        # NB: never connect a callable that returns a bool: PySide6 6.12 then corrupts the refcount
        # of True/False and the interpreter aborts (bool_dealloc). Slots here return None.
        self.busy: dict[str, str] = {}   # op -> key, for ops running now
        self.started.connect(self._op_started)
        self.done.connect(self._op_done)
        self.thread.start()

    def _op_started(self, op: str, key: str) -> None:
        self.busy[op] = key

    def _op_done(self, op: str, key: str) -> None:
        self.busy.pop(op, None)

    def start(self, backend: str = "auto", home: Optional[str] = None) -> None:
        self._start_engine.emit(backend, home or os.environ.get("HEARTH_HOME", ""))

    def refresh_library(self): self._refresh.emit()
    def inspect(self, key: str): self._inspect.emit(key)
    def plan_memory(self, key: str): self._plan.emit(key)
    def set_context(self, model_id: str, tokens: int): self._set_context.emit(model_id, tokens)
    def import_path(self, path: str): self._import.emit(path)
    def quantize(self, model_id: str): self._quantize.emit(model_id)
    def install_default(self, then_load: bool = True): self._install_default.emit(then_load)
    def remove(self, model_id: str): self._remove.emit(model_id)
    def load(self, model_id: str): self._load.emit(model_id)
    def unload(self, model_id: str): self._unload.emit(model_id)
    def generate(self, request): self._generate.emit(request)
    def release_chat(self, chat_id: str): self._release.emit(chat_id)

    def set_defaults(self, context: int, precision: str): self._set_defaults.emit(int(context), precision)
    def start_server(self, options: dict): self._start_server.emit(dict(options))
    def stop_server(self): self._stop_server.emit()
    def add_remote(self, spec: dict): self._add_remote.emit(dict(spec))
    def remove_remote(self, name: str): self._remove_remote.emit(name)
    def refresh_remotes(self): self._refresh_remotes.emit()

    def count_context(self, chat_id: str, model_id: str, system_prompt: str, turns: list):
        self._count_context.emit(chat_id, model_id, system_prompt, list(turns))

    # direct, thread-safe: the worker may be busy in a load or a step
    def cancel_load(self): self.worker.cancel_load()
    def stop(self, chat_id: str): self.worker.stop(chat_id)
    def reply_progress(self, chat_id: str): return self.worker.reply_progress(chat_id)
    def resources(self): return self.worker.resources()

    def shutdown(self, timeout_ms: int = 10000) -> None:
        if not self.thread.isRunning():
            return
        self.worker.cancel_load()
        for chat_id in self.worker.running_chats():
            self.worker.stop(chat_id)
        self._shutdown.emit()
        if not self.thread.wait(timeout_ms):
            log.warning("engine thread did not stop in %d ms", timeout_ms)
