"""The engine facade: the one API the CLI, the app and the tests call.

    eng = Engine(backend="auto")
    handle = eng.load_model("smollm2-135m-instruct", progress=print)
    sid = eng.create_session(handle.id, system_prompt="Be brief.")
    for event in eng.chat(sid, "Hello!", SamplingParams(temperature=0)):
        ...

A session keeps its KV cache between turns: each turn's tokens are compared with what the cache
already holds, and only the part after the common prefix is prefilled. Regenerating or editing a
message (`set_history` + `respond`) therefore reuses everything before the change.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np

from . import progress as stages
from .backends.base import ModelRunner, RunnerOptions
from .chat_template import ChatTemplate
from .checkpoint import CheckpointInfo, inspect as inspect_checkpoint
from .errors import (BackendUnavailable, Cancelled, ChatTemplateError, ContextOverflow, EngineOutOfMemory,
                     HearthError, InvalidOption, TokenizerMissing, UnknownModel, UnknownSession,
                     UnsupportedArchitecture)
from .plan import DEFAULT_GPU_RESERVE, DEFAULT_RESIDENT_SESSIONS, MemoryPlan, check_dtypes_loadable
from .progress import ProgressCallback, ProgressEvent
from .sampling import SamplerState, SamplingParams
from .scheduler import ModelLoop, Request
from .tokenizer import Tokenizer

log = logging.getLogger("hearth.engine")

BACKENDS = ("auto", "torch", "cuda-native")
DEFAULT_CONTEXT = 8192


@dataclass(frozen=True)
class ModelHandle:
    id: str
    backend: str


@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int          # tokens of the whole conversation before the reply
    prefilled_tokens: int       # of those, how many had to be computed (the rest came from the KV cache)
    generated_tokens: int
    ttft_s: float               # time to first token
    tokens_per_s: float         # decode speed after the first token
    stop_reason: str            # eos | stop | max-tokens | cancelled | context-full
    context_used: int
    context_limit: int
    seed: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TextDelta:
    text: str
    token_id: int


@dataclass(frozen=True)
class Finished:
    stats: GenerationStats
    text: str


ChatEvent = Union[TextDelta, Finished]


@dataclass
class _Session:
    id: str
    model_id: str
    messages: list
    seq: int
    tokens: list = field(default_factory=list)      # exactly the tokens held in the KV cache
    cancel: threading.Event = field(default_factory=threading.Event)
    request: Optional[Request] = None               # the reply being produced, for reply_progress()


@dataclass
class _LoadedModel:
    id: str
    info: CheckpointInfo
    runner: ModelRunner
    backend: str
    context_length: int
    tokenizer: Optional[Tokenizer]
    tokenizer_error: str
    template: Optional[ChatTemplate]
    template_error: str
    lock: threading.RLock = field(default_factory=threading.RLock)
    sessions: set = field(default_factory=set)
    loop: Optional[ModelLoop] = None
    kv_capacity_tokens: int = 0                      # tokens the KV pool holds (all sessions together)


def _available_memory() -> tuple[int, int]:
    """(available, total) bytes of system RAM."""
    try:
        with open("/proc/meminfo") as f:
            values = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return values.get("MemAvailable", values.get("MemFree", 0)), values.get("MemTotal", 0)
    except OSError:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total


PRECISIONS = ("fast", "exact")


def _check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise InvalidOption(f"Precision {precision!r} is not one of {', '.join(PRECISIONS)}: fast (the default) "
                            "multiplies in 16 bits like every local engine, exact keeps fp32-accurate activations.")
    return precision


class Engine:
    def __init__(self, backend: str = "auto", device: Optional[str] = None, home: Optional[os.PathLike] = None,
                 context_length: Optional[int] = None, compute_dtype: str = "float32", max_batch: int = 8,
                 decode_priority_burst: int = 4, prefill_chunk: int = 512, precision: str = "fast",
                 resident_sessions: int = DEFAULT_RESIDENT_SESSIONS, gpu_reserve_bytes: Optional[int] = None):
        """precision: "fast" (one 16-bit product per projection, the default) or "exact" (fp32-accurate
        activations), cuda-native only; resident_sessions: full-length contexts the KV cache holds at
        once; gpu_reserve_bytes: GPU memory a load leaves free for the desktop (default 1 GiB)."""
        if backend not in BACKENDS:
            raise BackendUnavailable(f"Unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}.")
        self.requested_backend = backend
        self.backend, self.backend_note = self._choose_backend(backend)
        self.device = device
        self.home = Path(home) if home else None
        self.context_length = context_length
        self.compute_dtype = compute_dtype
        self.max_batch = max_batch
        self.decode_priority_burst = decode_priority_burst
        self.prefill_chunk = prefill_chunk
        self.precision = _check_precision(precision)
        if int(resident_sessions) < 1:
            raise InvalidOption("resident_sessions must be at least 1.")
        self.resident_sessions = int(resident_sessions)
        self.gpu_reserve_bytes = DEFAULT_GPU_RESERVE if gpu_reserve_bytes is None else max(0, int(gpu_reserve_bytes))
        self._models: dict[str, _LoadedModel] = {}
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.RLock()
        self._library = None

    # ----------------------------------------------------------------------------- backends
    @staticmethod
    def _choose_backend(requested: str) -> tuple[str, str]:
        if requested == "torch":
            return "torch", ""
        try:
            from .backends import cuda_native

            ok, reason = cuda_native.available()
        except ImportError as exc:
            ok, reason = False, f"the cuda-native backend is not built ({exc})"
        if ok:
            return "cuda-native", ""
        if requested == "cuda-native":
            raise BackendUnavailable(f"The cuda-native backend cannot run here: {reason}.")
        note = f"{reason}: using the torch backend"
        log.info(note)
        return "torch", note

    # ----------------------------------------------------------------------------- library
    @property
    def library(self):
        if self._library is None:
            from .library import ModelLibrary

            self._library = ModelLibrary(self.home)
        return self._library

    def install_default_model(self, progress: Optional[ProgressCallback] = None):
        from .default_model import install_default_model

        return install_default_model(self.library, progress=progress)

    def _resolve(self, path_or_id) -> tuple[Path, str]:
        """A checkpoint path and the model id it is known by."""
        candidate = Path(str(path_or_id)).expanduser()
        if candidate.exists():
            for manifest in self.library.list():
                if Path(manifest.path).resolve() == candidate.resolve():
                    return candidate, manifest.id
            return candidate, candidate.stem if candidate.is_file() else candidate.name
        if isinstance(path_or_id, str) and os.sep not in path_or_id:
            manifest = self.library.get(path_or_id)   # UnknownModel lists the ids the library has
            return Path(manifest.path), manifest.id
        return candidate, candidate.name  # inspect() reports the missing path

    # ----------------------------------------------------------------------------- inspection
    def inspect(self, path_or_id) -> CheckpointInfo:
        path, _ = self._resolve(path_or_id)
        return inspect_checkpoint(path)

    def check_importable(self, path) -> CheckpointInfo:
        """Refuse, before anything is copied, a checkpoint whose architecture Hearth cannot run."""
        from .registry import family_for

        info = inspect_checkpoint(Path(str(path)).expanduser())
        try:
            family_for(info.metadata.architecture)
        except UnsupportedArchitecture as exc:
            raise UnsupportedArchitecture(f"{exc.message} It was not added to the library.") from None
        return info

    def _weight_bytes_resident(self, info: CheckpointInfo, backend: str) -> int:
        per = 4 if backend == "torch" and self.compute_dtype == "float32" else 2
        if info.quant_scheme is not None:
            from .nvfp4_checkpoint import resident_bytes

            # torch dequantizes NVFP4 projections; a native engine keeps them packed
            return resident_bytes(info, per, packed=backend == "cuda-native")
        numel = sum(t.numel for t in info.tensors)
        return numel * per

    def memory_plan(self, path_or_id, context_length: Optional[int] = None,
                    precision: Optional[str] = None) -> MemoryPlan:
        info = self.inspect(path_or_id)
        return self._plan(info, self._context_for(info, context_length), _check_precision(precision or self.precision))

    def _plan(self, info: CheckpointInfo, context: int, precision: str) -> MemoryPlan:
        """The one memory plan: what the load of `info` at `context` will take."""
        if self.backend == "cuda-native" and info.plan is not None:
            from .backends import cuda_native

            native = cuda_native.memory_plan(info, context, self.max_batch, self.resident_sessions, precision)
            if native is not None:
                return MemoryPlan.from_native(info.decoder, native, context, 16, self.resident_sessions,
                                              self.gpu_reserve_bytes, precision)
        return MemoryPlan.for_model(info.decoder, self._weight_bytes_resident(info, self.backend), context,
                                    max_batch=self.max_batch, precision=precision)

    def free_memory(self) -> tuple[int, int, str]:
        """(free bytes, total bytes, "GPU" or "RAM") where the current backend keeps its weights."""
        if self.backend == "cuda-native":
            from .backends import cuda_native

            free, total = cuda_native.device_memory()
            return free, total, "GPU"
        if self.device and self.device.startswith("cuda"):
            import torch

            free, total = torch.cuda.mem_get_info()
            return free, total, "GPU"
        free, total = _available_memory()
        return free, total, "RAM"

    def _context_for(self, info: CheckpointInfo, requested: Optional[int]) -> int:
        limit = info.decoder.max_position_embeddings
        return max(16, min(limit, int(requested or self.context_length or DEFAULT_CONTEXT)))

    # ----------------------------------------------------------------------------- loading
    def load_model(self, path_or_id, progress: Optional[ProgressCallback] = None,
                   cancel: Optional[threading.Event] = None, context_length: Optional[int] = None,
                   precision: Optional[str] = None) -> ModelHandle:
        report = progress or stages.no_progress

        def emit(event: ProgressEvent) -> None:
            if cancel is not None and cancel.is_set():
                raise Cancelled("Loading was cancelled.")
            report(event)

        path, model_id = self._resolve(path_or_id)
        emit(ProgressEvent(stages.INSPECTING, 0, 0, str(path)))
        info = inspect_checkpoint(path)
        if info.format == "gguf":
            raise UnsupportedArchitecture(
                f"{path.name} is a GGUF file: import it into the model library first "
                "(hearth models import PATH), which converts it for the engine.")
        if info.plan is None:
            raise UnsupportedArchitecture(info.plan_error)
        check_dtypes_loadable(info)
        if model_id in self._models:
            return ModelHandle(model_id, self._models[model_id].backend)
        context = self._context_for(info, context_length)
        precision = _check_precision(precision or self.precision)
        plan = self._plan(info, context, precision)
        free, _, where = self.free_memory()
        fit = plan.fits(free, where)
        if not fit.ok:
            raise EngineOutOfMemory(fit.message, plan.total_bytes, free)
        total = info.weight_bytes
        emit(ProgressEvent(stages.INSPECTING, 0, total, f"{len(info.tensors)} tensors, {info.plan.family}"))
        options = RunnerOptions(context_length=context, max_batch=self.max_batch, compute_dtype=self.compute_dtype,
                                kv_blocks=plan.kv_blocks, precision=precision)
        runner = self._load_runner(info, options, emit)
        try:
            emit(ProgressEvent(stages.PREPARING_RUNNER, total, total, "tokenizer and chat template"))
            tokenizer, tokenizer_error = None, ""
            template, template_error = None, ""
            try:
                tokenizer = Tokenizer.from_folder(info.path, info.config)
                template = ChatTemplate(tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token)
            except TokenizerMissing as exc:
                tokenizer_error = exc.message
            except ChatTemplateError as exc:
                template_error = exc.message
            emit(ProgressEvent(stages.WARMING_UP, total, total, "first forward pass"))
            seq = runner.allocate_sequence()
            try:
                runner.prefill(seq, [info.decoder.bos_token_id or 0])
                runner.sample([SamplerState.start(SamplingParams(temperature=0))])
            finally:
                runner.release_sequence(seq)
        except BaseException:
            runner.close()
            raise
        loaded = _LoadedModel(model_id, info, runner, runner.backend_name, context, tokenizer,
                              tokenizer_error, template, template_error)
        loaded.loop = ModelLoop(runner, loaded.lock, self.max_batch, self.decode_priority_burst, self.prefill_chunk)
        loaded.kv_capacity_tokens = int(getattr(plan, "kv_blocks", 0) or 0) * int(getattr(plan, "kv_block_size", 0) or 0) \
            or context * max(1, self.resident_sessions)
        with self._lock:
            self._models[model_id] = loaded
        report(ProgressEvent(stages.RESIDENT, total, total, f"resident on {runner.backend_name}"))
        return ModelHandle(model_id, runner.backend_name)

    def _load_runner(self, info: CheckpointInfo, options: RunnerOptions, emit) -> ModelRunner:
        if self.backend == "cuda-native":
            from .backends import cuda_native

            return cuda_native.load_runner(info, info.plan, options, emit)
        from .backends import torch_ref

        return torch_ref.load_runner(info, info.plan, options, emit, device=self.device)

    def unload(self, model_id: str) -> None:
        with self._lock:
            loaded = self._model(model_id)
            for sid in list(loaded.sessions):
                self._sessions.pop(sid, None)
            del self._models[model_id]
        loaded.loop.close()
        with loaded.lock:
            loaded.runner.close()

    def loaded_models(self) -> list[ModelHandle]:
        return [ModelHandle(m.id, m.backend) for m in self._models.values()]

    def model_info(self, model_id: str) -> CheckpointInfo:
        return self._model(model_id).info

    def context_limit(self, model_id: str) -> int:
        return self._model(model_id).context_length

    def _model(self, model_id: str) -> _LoadedModel:
        try:
            return self._models[model_id]
        except KeyError:
            loaded = ", ".join(self._models) or "none"
            raise UnknownModel(f"The model {model_id!r} is not loaded (loaded: {loaded}).") from None

    def runner(self, model_id: str) -> ModelRunner:
        """The backend runner of a loaded model (tests and benchmarks)."""
        return self._model(model_id).runner

    # ----------------------------------------------------------------------------- scoring
    def score(self, model_id: str, token_ids: Sequence[int]) -> np.ndarray:
        loaded = self._model(model_id)
        if len(token_ids) > loaded.context_length:
            raise ContextOverflow(f"{len(token_ids):,} tokens exceed the loaded context of {loaded.context_length:,}.")
        with loaded.lock:
            return loaded.runner.score(list(token_ids))

    def tokenizer(self, model_id: str) -> Tokenizer:
        loaded = self._model(model_id)
        if loaded.tokenizer is None:
            raise TokenizerMissing(loaded.tokenizer_error)
        return loaded.tokenizer

    # ----------------------------------------------------------------------------- sessions
    def create_session(self, model_id: str, system_prompt: Optional[str] = None,
                       history: Optional[list] = None) -> str:
        loaded = self._model(model_id)
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages += [dict(m) for m in (history or [])]
        with loaded.lock:
            seq = loaded.runner.allocate_sequence()
        session = _Session(str(uuid.uuid4()), model_id, messages, seq)
        with self._lock:
            self._sessions[session.id] = session
            loaded.sessions.add(session.id)
        return session.id

    def _session(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSession(f"There is no chat session {session_id!r}; it was released or never created.") from None

    def release_session(self, session_id: str) -> None:
        with self._lock:
            session = self._session(session_id)
            del self._sessions[session_id]
            loaded = self._models.get(session.model_id)
        if loaded is not None:
            loaded.sessions.discard(session_id)
            with loaded.lock:
                loaded.runner.release_sequence(session.seq)

    def clear_sessions(self, model_id: str) -> None:
        for sid in list(self._model(model_id).sessions):
            self.release_session(sid)

    def sessions(self, model_id: Optional[str] = None) -> list[str]:
        return [s.id for s in self._sessions.values() if model_id in (None, s.model_id)]

    def history(self, session_id: str) -> list[dict]:
        return [dict(m) for m in self._session(session_id).messages]

    def set_history(self, session_id: str, messages: list) -> None:
        """Replace the whole conversation, system message included; the cached prefix it shares
        with the old one is kept."""
        self._session(session_id).messages = [dict(m) for m in messages]

    def cancel(self, session_id: str) -> None:
        """Ask a running reply to stop; it ends within one decode step (thread-safe)."""
        self._session(session_id).cancel.set()

    def reply_progress(self, session_id: str) -> dict:
        """Where the session's current reply stands (thread-safe, for a live display): the prompt's
        length, how much of it is in the cache (a long prompt is read in chunks), tokens generated,
        and the context used of its limit."""
        session = self._session(session_id)
        request = session.request
        limit = self._model(session.model_id).context_length
        if request is None:
            return {"prompt_tokens": 0, "prompt_done": 0, "generated_tokens": 0,
                    "context_used": len(session.tokens), "context_limit": limit}
        prompt = request.start_length + len(request.prompt)
        return {"prompt_tokens": prompt, "prompt_done": request.start_length + request.prefilled,
                "generated_tokens": request.generated, "context_used": request.cached, "context_limit": limit}

    def kv_fill(self, model_id: str) -> tuple[int, int]:
        """(tokens cached now over all of the model's sessions, tokens its KV pool holds); thread-safe."""
        loaded = self._model(model_id)
        used = 0
        for sid in list(loaded.sessions):
            session = self._sessions.get(sid)
            if session is None:
                continue
            request = session.request
            used += request.cached if request is not None and not request.done else len(session.tokens)
        return used, loaded.kv_capacity_tokens

    def session_tokens(self, session_id: str) -> list[int]:
        """The tokens held in the session's KV cache (tests)."""
        return list(self._session(session_id).tokens)

    # ----------------------------------------------------------------------------- conversation tokens
    def conversation_tokens(self, model_id: str, messages: list, add_generation_prompt: bool = True) -> list[int]:
        """The canonical token sequence of a conversation.

        Each message (and, before an assistant message, the generation prompt) is tokenized on its
        own, exactly as a live session builds it turn by turn, so a cached conversation and a fresh
        one given the same history hold the same tokens.
        """
        loaded = self._model(model_id)
        tokenizer = self.tokenizer(model_id)
        if loaded.template is None:
            raise ChatTemplateError(loaded.template_error or "This model has no chat template.")
        render = loaded.template.render

        def safe_render(msgs, gen):
            if not msgs:
                return ""
            return render(msgs, add_generation_prompt=gen)

        final = render(messages, add_generation_prompt=add_generation_prompt)
        cuts = []
        for k in range(1, len(messages) + 1):
            if messages[k - 1]["role"] == "assistant":
                cuts.append(safe_render(messages[:k - 1], True))
            cuts.append(safe_render(messages[:k], False))
        pieces, previous = [], ""
        for cut in cuts + [final]:
            if not cut.startswith(previous):   # the template is not prefix-stable: one piece
                pieces = [final]
                break
            pieces.append(cut[len(previous):])
            previous = cut
        tokens = []
        if tokenizer.add_bos and tokenizer.bos_token and not final.startswith(tokenizer.bos_token):
            tokens.append(tokenizer.inner.token_to_id(tokenizer.bos_token))
        for piece in pieces:
            if piece:
                tokens.extend(tokenizer.encode(piece))
        return tokens

    # ----------------------------------------------------------------------------- generation
    def chat(self, session_id: str, user_text: str, params: SamplingParams = SamplingParams()) -> Iterator[ChatEvent]:
        """Append the user's message and stream the reply. A message refused before the reply starts
        (too long for the context, a template error) is not kept in the history."""
        session = self._session(session_id)
        session.messages.append({"role": "user", "content": user_text})
        try:
            return self.respond(session_id, params)
        except HearthError:
            session.messages.pop()
            raise

    def respond(self, session_id: str, params: SamplingParams = SamplingParams()) -> Iterator[ChatEvent]:
        """Stream a reply to the session's current history; the reply is appended when it ends."""
        session = self._session(session_id)
        if not session.messages or session.messages[-1]["role"] != "user":
            raise ChatTemplateError("The conversation must end with a user message before a reply.")
        tokens = self.conversation_tokens(session.model_id, session.messages)
        self._check_context(session.model_id, tokens)
        session.cancel.clear()
        return self._stream(session, tokens, params, record=True)

    def generate(self, model_id: str, prompt: str, params: SamplingParams = SamplingParams(),
                 chat: bool = False) -> Iterator[ChatEvent]:
        """Raw text continuation (or, with chat=True, one user turn) in a throwaway session."""
        tokenizer = self.tokenizer(model_id)
        if chat:
            tokens = self.conversation_tokens(model_id, [{"role": "user", "content": prompt}])
        else:
            tokens = tokenizer.encode(prompt)
            bos = tokenizer.inner.token_to_id(tokenizer.bos_token) if tokenizer.bos_token else None
            if tokenizer.add_bos and bos is not None:
                tokens = [bos] + tokens
        return self.generate_tokens(model_id, tokens, params)

    def generate_tokens(self, model_id: str, tokens: Sequence[int], params: SamplingParams = SamplingParams(),
                        cancel: Optional[threading.Event] = None, constraint=None,
                        observer=None) -> Iterator[ChatEvent]:
        """Continue exactly these prompt tokens in a throwaway session (the server's entry point).

        `cancel`, set from any thread, ends the reply within one decode step; `constraint` (a
        sampling.TokenConstraint) masks every sampled token (structured output); `observer(logits,
        token)` is called after every draw (logprobs)."""
        tokens = list(tokens)
        if not tokens:
            raise ChatTemplateError("The prompt is empty.")
        self._check_context(model_id, tokens)
        sid = self.create_session(model_id)
        session = self._session(sid)
        if cancel is not None:
            session.cancel = cancel

        def run():
            try:
                yield from self._stream(session, tokens, params, record=False, constraint=constraint,
                                        observer=observer)
            finally:
                self.release_session(sid)

        return run()

    def activity(self, model_id: str) -> dict:
        """Live counts of a loaded model: sessions open, requests waiting for prefill and decoding."""
        loaded = self._model(model_id)
        return {"sessions": len(loaded.sessions), "waiting": len(loaded.loop.scheduler.waiting),
                "running": len(loaded.loop.scheduler.running)}

    def _check_context(self, model_id: str, tokens: list) -> None:
        limit = self._model(model_id).context_length
        if len(tokens) >= limit:
            raise ContextOverflow(f"The conversation is {len(tokens):,} tokens, and this model was loaded with a "
                                  f"context of {limit:,}. Start a new chat or load it with a longer context.")

    def _stream(self, session: _Session, tokens: list, params: SamplingParams, record: bool,
                constraint=None, observer=None) -> Iterator[ChatEvent]:
        loaded = self._model(session.model_id)
        limit = loaded.context_length
        tokenizer = loaded.tokenizer
        started = time.perf_counter()
        with loaded.lock:
            common = 0
            for a, b in zip(session.tokens, tokens):
                if a != b:
                    break
                common += 1
            common = min(common, len(tokens) - 1)   # at least one token is fed to get logits
            loaded.runner.truncate(session.seq, common)
            session.tokens = session.tokens[:common]
        state = SamplerState.start(params, history=tokens)
        state.constraint, state.observer = constraint, observer
        request = Request(seq=session.seq, prompt=tokens[common:], state=state, max_tokens=params.max_tokens,
                          eos_ids=tokenizer.eos_ids, context_limit=limit, start_length=common, cancel=session.cancel)
        session.request = request
        loaded.loop.submit(request)
        stream = tokenizer.stream()
        text, held, stopped = "", "", False
        hold = max((len(s) for s in params.stop), default=1) - 1
        first_at, stop_reason = None, "cancelled"
        try:
            while True:
                kind, value = request.events.get()
                if kind == "error":
                    raise value
                if kind == "finished":
                    stop_reason = "stop" if stopped else value
                    break
                if first_at is None:
                    first_at = time.perf_counter()
                if stopped or session.cancel.is_set():
                    continue                   # decoded before the loop saw the stop: not shown
                held += stream.push(value)
                stop_at = self._find_stop(text + held, params.stop)
                if stop_at is not None:
                    held = (text + held)[len(text):stop_at] if stop_at > len(text) else ""
                    if held:
                        text += held
                        yield TextDelta(held, value)
                    held, stopped = "", True
                    request.stop("stop")
                    continue
                if len(held) > hold:
                    out, held = (held[:len(held) - hold], held[len(held) - hold:]) if hold else (held, "")
                    text += out
                    yield TextDelta(out, value)
        finally:
            if not request.done:               # the consumer walked away: stop and wait for the loop
                request.stop("cancelled")
                while request.events.get()[0] not in ("finished", "error"):
                    pass
            session.tokens = list(tokens) + list(request.fed)
        if not stopped:
            tail = held + stream.flush()
            if tail:
                text += tail
                yield TextDelta(tail, -1)
        ended = time.perf_counter()
        if record:
            session.messages.append({"role": "assistant", "content": text})
        first_at = first_at or ended
        decode_time = ended - first_at
        generated = request.generated
        stats = GenerationStats(
            prompt_tokens=len(tokens), prefilled_tokens=len(tokens) - common, generated_tokens=generated,
            ttft_s=first_at - started,
            tokens_per_s=(generated - 1) / decode_time if generated > 1 and decode_time > 0 else 0.0,
            stop_reason=stop_reason, context_used=len(session.tokens), context_limit=limit, seed=state.seed)
        yield Finished(stats, text)

    @staticmethod
    def _find_stop(text: str, stops: Sequence[str]) -> Optional[int]:
        found = [text.find(s) for s in stops if s and s in text]
        return min(found) if found else None
