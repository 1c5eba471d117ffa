"""Threads creating, chatting, cancelling and releasing sessions on one model (torch backend, the
real default model), for a bounded number of iterations: no deadlock (a watchdog join, not a speed
bound), no leaked session or sequence, and every reply that ran to the end equal, token for token,
to the same prompt answered alone at temperature 0. A cancelled reply is a prefix of it.
"""
from __future__ import annotations

import faulthandler
import os
import random
import sys
import threading

import pytest

from engine.engine import Finished, TextDelta
from engine.sampling import SamplingParams

THREADS = int(os.environ.get("HEARTH_CONCURRENCY_THREADS", "4"))
ITERATIONS = int(os.environ.get("HEARTH_CONCURRENCY_ITERATIONS", "4"))
WATCHDOG_S = 1200           # a deadlock ends the test; a slow machine does not
PROMPTS = ["Name three colors.", "What is 2 + 2?", "Write a haiku about the sea.", "Say hello in French.",
           "List two planets.", "What is the capital of Italy?"]
GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def engine(default_model, hearth_home):
    from engine import Engine

    eng = Engine(backend="torch", home=hearth_home, context_length=512)
    eng.load_model(default_model.id)
    yield eng, default_model.id
    eng.unload(default_model.id)


def _reply(eng, sid, prompt, cancel_after=None):
    text, tokens, stats = "", [], None
    for event in eng.chat(sid, prompt, GREEDY):
        if isinstance(event, TextDelta):
            text += event.text
            tokens.append(event.token_id)
            if cancel_after is not None and len(tokens) == cancel_after:
                eng.cancel(sid)
        elif isinstance(event, Finished):
            stats = event.stats
    return text, tokens, stats


def test_threads_on_one_model_match_each_alone(engine):
    eng, model_id = engine
    alone = {}
    for prompt in PROMPTS:
        sid = eng.create_session(model_id)
        alone[prompt] = _reply(eng, sid, prompt)[1]
        eng.release_session(sid)
    assert eng.sessions(model_id) == []

    failures: list = []
    done = []

    def worker(index: int):
        rng = random.Random(index)
        try:
            for it in range(ITERATIONS):
                prompt = PROMPTS[(index + it) % len(PROMPTS)]
                sid = eng.create_session(model_id)
                action = rng.choice(["full", "full", "cancel", "two-turns", "release-early"])
                if action == "release-early":
                    eng.release_session(sid)
                    continue
                cancel_after = rng.randrange(1, 6) if action == "cancel" else None
                _, tokens, stats = _reply(eng, sid, prompt, cancel_after)
                if action == "cancel":
                    if tokens != alone[prompt][:len(tokens)] or stats.stop_reason not in ("cancelled", "eos", "max-tokens"):
                        failures.append((index, it, "cancelled reply is not a prefix", tokens, alone[prompt]))
                elif tokens != alone[prompt]:
                    failures.append((index, it, prompt, tokens, alone[prompt]))
                if action == "two-turns":       # the second turn reuses the cached prefix
                    _reply(eng, sid, "Thanks. " + prompt)
                eng.release_session(sid)
            done.append(index)
        except BaseException as exc:  # noqa: BLE001 - reported below with the thread's index
            failures.append((index, "raised", repr(exc)))

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WATCHDOG_S)
    stuck = [t for t in threads if t.is_alive()]
    if stuck:
        faulthandler.dump_traceback(file=sys.stderr)
    assert not stuck, f"{len(stuck)} threads deadlocked"
    assert not failures, failures
    assert sorted(done) == list(range(THREADS))
    assert eng.sessions(model_id) == []
    assert eng.runner(model_id).memory()["sequences"] == 0
    print(f"\nconcurrency: {THREADS} threads x {ITERATIONS} iterations on {model_id}: no deadlock, "
          f"0 sessions and 0 sequences left, every full reply equal to its prompt alone")
