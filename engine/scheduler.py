"""Continuous batching with decode priority.

One `ModelLoop` thread per resident model owns its runner's steps. Requests (one reply each) join at
any time. Every step is either one batched decode step for the running requests, or one prefill chunk
of the oldest waiting prompt. While prompts wait, decoding keeps priority for `decode_priority_burst`
steps, then one prefill chunk runs: running chats never stall behind a long prompt, and a waiting
prompt is never starved. More running requests than `max_batch` take turns, round-robin.

`Scheduler` is pure bookkeeping (tested on its own); `ModelLoop` executes its decisions on a runner.
"""
from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .sampling import SamplerState


@dataclass(eq=False)
class Request:
    seq: int                              # the runner sequence the reply extends
    prompt: list                          # tokens still to be fed before the first sample
    state: SamplerState
    max_tokens: int
    eos_ids: frozenset
    context_limit: int                    # the sequence may hold at most this many tokens
    start_length: int                     # tokens already in the sequence's cache
    events: queue.Queue = field(default_factory=queue.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    stop_reason_on_cancel: str = "cancelled"
    prefilled: int = 0
    generated: int = 0
    fed: list = field(default_factory=list)   # tokens fed to the cache after the prompt
    pending: Optional[int] = None         # sampled, not yet fed
    done: bool = False

    @property
    def cached(self) -> int:
        return self.start_length + self.prefilled + len(self.fed)

    def stop(self, reason: str) -> None:
        """Ask the loop to end this request (thread-safe); it ends within one step."""
        self.stop_reason_on_cancel = reason
        self.cancel.set()


@dataclass(frozen=True)
class Decode:
    batch: tuple


@dataclass(frozen=True)
class Prefill:
    request: Request
    chunk: tuple
    last: bool                            # the prompt's final chunk: sample afterwards


class Scheduler:
    def __init__(self, max_batch: int = 8, decode_priority_burst: int = 4, prefill_chunk: int = 512):
        if max_batch < 1 or decode_priority_burst < 1 or prefill_chunk < 1:
            raise ValueError("max_batch, decode_priority_burst and prefill_chunk must be positive")
        self.max_batch = max_batch
        self.burst = decode_priority_burst
        self.prefill_chunk = prefill_chunk
        self.waiting: deque = deque()
        self.running: list = []
        self._decodes_since_prefill = 0
        self._rotation = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def cancelled(self) -> list:
        """Requests whose cancel flag is set; they leave the queues."""
        out = [r for r in list(self.waiting) + self.running if r.cancel.is_set()]
        for r in out:
            self._remove(r)
        return out

    def _remove(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)

    def next_action(self):
        if self.running and (not self.waiting or self._decodes_since_prefill < self.burst):
            if self.waiting:
                self._decodes_since_prefill += 1
            n = len(self.running)
            if n <= self.max_batch:
                return Decode(tuple(self.running))
            start = self._rotation % n
            self._rotation += self.max_batch
            order = self.running[start:] + self.running[:start]
            return Decode(tuple(order[:self.max_batch]))
        if self.waiting:
            self._decodes_since_prefill = 0
            request = self.waiting[0]
            chunk = request.prompt[request.prefilled:request.prefilled + self.prefill_chunk]
            return Prefill(request, tuple(chunk), request.prefilled + len(chunk) >= len(request.prompt))
        return None

    def prefilled(self, request: Request, n: int, last: bool) -> None:
        request.prefilled += n
        if last:
            self.waiting.remove(request)
            self.running.append(request)

    def finish(self, request: Request) -> None:
        request.done = True
        self._remove(request)


class ModelLoop:
    """Runs a Scheduler's steps on one runner, in a thread of its own.

    Events put on each request's queue: ("token", id), ("finished", reason), ("error", exception).
    `lock` serialises the runner with other callers (scoring, session release).
    """

    def __init__(self, runner, lock: threading.RLock, max_batch: int = 8, decode_priority_burst: int = 4,
                 prefill_chunk: int = 512):
        self.runner = runner
        self.lock = lock
        self.scheduler = Scheduler(max_batch, decode_priority_burst, prefill_chunk)
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hearth-model-loop", daemon=True)
        self._thread.start()

    def submit(self, request: Request) -> Request:
        with self._wake:
            if self._closed:
                raise RuntimeError("the model was unloaded")
            self.scheduler.add(request)
            self._wake.notify()
        return request

    def close(self) -> None:
        with self._wake:
            self._closed = True
            for r in list(self.scheduler.waiting) + self.scheduler.running:
                r.stop("cancelled")
            self._wake.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._wake:
                while self.scheduler.idle and not self._closed:
                    self._wake.wait()
                for r in self.scheduler.cancelled():
                    self._end(r, r.stop_reason_on_cancel)
                if self._closed and self.scheduler.idle:
                    return
                action = self.scheduler.next_action()
            if action is None:
                continue
            try:
                with self.lock:
                    self._execute(action)
            except BaseException as exc:  # the requests in this step fail; the loop lives on
                batch = action.batch if isinstance(action, Decode) else (action.request,)
                with self._wake:
                    for r in batch:
                        self.scheduler.finish(r)
                        r.events.put(("error", exc))

    def _execute(self, action) -> None:
        runner = self.runner
        if isinstance(action, Prefill):
            r = action.request
            runner.prefill(r.seq, list(action.chunk))
            with self._wake:
                self.scheduler.prefilled(r, len(action.chunk), action.last)
            if action.last:
                self._accept([r], self._sample([r.state]))
            return
        batch = action.batch
        states = [r.state for r in batch]
        if self._host_sampling(states):
            runner.decode([r.seq for r in batch], [r.pending for r in batch])
            tokens = self._sample(states)
        else:
            tokens = runner.decode_and_sample([r.seq for r in batch], [r.pending for r in batch], states)
        for r in batch:
            r.fed.append(r.pending)
            r.pending = None
        self._accept(batch, tokens)

    def _host_sampling(self, states) -> bool:
        """An observer (logprobs) needs the host sampler, and so does a token mask (structured output)
        where the device sampler takes none (`device_masks`; cuda-native's does): such a step reads
        the logits back and samples here."""
        if getattr(self.runner, "backend_name", "?") == "torch":
            return False
        masks_on_device = getattr(self.runner, "device_masks", False)
        return any(st.observer is not None or (st.constraint is not None and not masks_on_device)
                   for st in states)

    def _sample(self, states) -> list:
        if not self._host_sampling(states):
            return self.runner.sample(states)
        import torch

        from .sampling import sample_token

        logits = torch.from_numpy(self.runner.last_logits())
        return [sample_token(logits[i], st) for i, st in enumerate(states)]

    def _accept(self, batch: Sequence[Request], tokens: Sequence[int]) -> None:
        for r, token in zip(batch, tokens):
            if token in r.eos_ids:
                self._end(r, "eos")
                continue
            r.state.advance(token)
            r.generated += 1
            r.events.put(("token", token))
            if r.generated >= r.max_tokens:
                self._end(r, "max-tokens")
            elif r.cached + 1 >= r.context_limit:
                self._end(r, "context-full")
            else:
                r.pending = token

    def _end(self, request: Request, reason: str) -> None:
        with self._wake:
            self.scheduler.finish(request)
        request.events.put(("finished", reason))
