"""Continuous batching: decode priority with bursts, prefill chunks, round-robin, cancellation, no starvation."""
import threading

import pytest

from engine import Engine, SamplingParams, TextDelta
from engine.sampling import SamplerState
from engine.scheduler import Decode, ModelLoop, Prefill, Request, Scheduler


def request(prompt_len=10, max_tokens=5, seq=0):
    return Request(seq=seq, prompt=list(range(prompt_len)), state=SamplerState.start(SamplingParams(temperature=0)),
                   max_tokens=max_tokens, eos_ids=frozenset(), context_limit=10_000, start_length=0)


def drive(s: Scheduler, steps: int):
    """Run the bookkeeping only: prefills complete, decodes never finish anyone."""
    trace = []
    for _ in range(steps):
        action = s.next_action()
        if action is None:
            break
        if isinstance(action, Prefill):
            s.prefilled(action.request, len(action.chunk), action.last)
            trace.append(("P", action.request.seq, len(action.chunk)))
        else:
            trace.append(("D",) + tuple(r.seq for r in action.batch))
    return trace


def test_prefill_is_chunked_and_then_decodes():
    s = Scheduler(max_batch=4, decode_priority_burst=2, prefill_chunk=4)
    s.add(request(prompt_len=10, seq=1))
    assert drive(s, 5) == [("P", 1, 4), ("P", 1, 4), ("P", 1, 2), ("D", 1), ("D", 1)]


def test_decode_keeps_priority_for_a_burst_then_one_chunk():
    s = Scheduler(max_batch=4, decode_priority_burst=3, prefill_chunk=4)
    s.add(request(prompt_len=2, seq=1))
    drive(s, 1)                                  # seq 1 is now decoding
    s.add(request(prompt_len=12, seq=2))         # a long prompt arrives
    trace = drive(s, 12)
    assert trace[:4] == [("D", 1), ("D", 1), ("D", 1), ("P", 2, 4)]
    assert trace[4:8] == [("D", 1), ("D", 1), ("D", 1), ("P", 2, 4)]
    # the running chat never waits more than one step at a time
    gaps = [i for i, t in enumerate(trace) if t[0] == "P"]
    assert all(b - a > 1 for a, b in zip(gaps, gaps[1:]))


def test_no_starvation_of_waiting_prompts():
    s = Scheduler(max_batch=2, decode_priority_burst=4, prefill_chunk=8)
    for seq in range(3):
        s.add(request(prompt_len=4, seq=seq))
    trace = drive(s, 3)
    assert [t[:2] for t in trace] == [("P", 0), ("D", 0), ("D", 0)]
    for seq in range(3, 6):
        s.add(request(prompt_len=4, seq=seq))
    trace = drive(s, 60)
    prefilled = [t[1] for t in trace if t[0] == "P"]
    assert prefilled == [1, 2, 3, 4, 5]           # first come, first served, every one of them


def test_round_robin_beyond_max_batch():
    s = Scheduler(max_batch=2, decode_priority_burst=1, prefill_chunk=8)
    for seq in range(5):
        s.add(request(prompt_len=1, seq=seq))
    drive(s, 20)
    seen = {}
    for _ in range(10):
        action = s.next_action()
        assert isinstance(action, Decode) and len(action.batch) == 2
        for r in action.batch:
            seen[r.seq] = seen.get(r.seq, 0) + 1
    assert sorted(seen) == [0, 1, 2, 3, 4] and max(seen.values()) - min(seen.values()) <= 1


def test_cancelled_requests_leave_the_queues():
    s = Scheduler(max_batch=4, decode_priority_burst=2, prefill_chunk=4)
    a, b = request(seq=1), request(seq=2)
    s.add(a)
    s.add(b)
    b.stop("cancelled")
    assert s.cancelled() == [b]
    assert list(s.waiting) == [a] and s.cancelled() == []


@pytest.mark.parametrize("bad", [dict(max_batch=0), dict(decode_priority_burst=0), dict(prefill_chunk=0)])
def test_invalid_settings(bad):
    with pytest.raises(ValueError):
        Scheduler(**bad)


class CountingRunner:
    """A runner that records calls: the loop's own behaviour, with no model."""

    def __init__(self):
        self.calls = []
        self.gate = threading.Event()
        self.gate.set()

    def prefill(self, seq, tokens):
        self.calls.append(("prefill", seq, len(tokens)))

    def decode(self, seqs, tokens):
        self.gate.wait(5)
        self.calls.append(("decode", tuple(seqs)))

    def sample(self, states):
        return [7] * len(states)

    def decode_and_sample(self, seqs, tokens, states):
        self.decode(seqs, tokens)
        return self.sample(states)


def test_loop_cancels_within_one_step():
    runner = CountingRunner()
    loop = ModelLoop(runner, threading.RLock(), max_batch=4, decode_priority_burst=2, prefill_chunk=8)
    r = loop.submit(request(prompt_len=3, max_tokens=10_000, seq=9))
    assert r.events.get(timeout=5) == ("token", 7)
    runner.gate.clear()                    # hold the loop inside a decode step
    r.events.get(timeout=5)
    r.stop("cancelled")
    decodes_at_cancel = sum(1 for c in runner.calls if c[0] == "decode")
    runner.gate.set()
    while (event := r.events.get(timeout=5))[0] != "finished":
        pass
    assert event == ("finished", "cancelled")
    assert sum(1 for c in runner.calls if c[0] == "decode") <= decodes_at_cancel + 2
    loop.close()


def test_loop_reports_runner_errors_and_lives_on():
    class Failing(CountingRunner):
        def prefill(self, seq, tokens):
            if seq == 1:
                raise RuntimeError("boom")
            super().prefill(seq, tokens)

    loop = ModelLoop(Failing(), threading.RLock())
    bad = loop.submit(request(seq=1))
    kind, exc = bad.events.get(timeout=5)
    assert kind == "error" and "boom" in str(exc)
    good = loop.submit(request(seq=2, max_tokens=2))
    assert [good.events.get(timeout=5) for _ in range(3)] == [("token", 7), ("token", 7), ("finished", "max-tokens")]
    loop.close()


def test_concurrent_sessions_equal_each_alone(synth, tmp_path):
    """Batched greedy decoding gives exactly what each conversation gives on its own."""
    eng = Engine(backend="torch", home=tmp_path / "home", max_batch=4, decode_priority_burst=2, prefill_chunk=16)
    mid = eng.load_model(synth("tiny", tokenizer=True, seed=5)).id
    prompts = ["the cat", "in an inn", "there there " * 8, "a"]
    params = SamplingParams(temperature=0, max_tokens=24)

    def reply(sid, prompt):
        return "".join(e.text for e in eng.chat(sid, prompt, params) if isinstance(e, TextDelta))

    alone = [reply(eng.create_session(mid), p) for p in prompts]
    sids = [eng.create_session(mid) for _ in prompts]
    together = [None] * len(prompts)

    def run(i):
        together[i] = reply(sids[i], prompts[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert together == alone
