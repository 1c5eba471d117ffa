"""EngineWorker mechanics against a stand-in engine: signal order, coalescing, cancellation, errors."""
import time

import pytest

from app.models.chat import GenerationRequest
from app.worker import EngineClient
from fake_engine import FakeEngine


@pytest.fixture
def client_for(qtbot):
    made = []

    def make(**kw):
        engine = FakeEngine(**kw)
        client = EngineClient(lambda: engine)
        made.append(client)
        with qtbot.waitSignal(client.done, timeout=5000, check_params_cb=lambda op, key: op == "start"):
            client.start("fake")
        return client, engine

    yield make
    for client in made:
        client.shutdown()


def request(chat_id="c1", max_tokens=10_000):
    return GenerationRequest(chat_id, "fake-1", "", [{"role": "user", "content": "hi"}],
                             {"temperature": 0.0, "max_tokens": max_tokens, "seed": 1}, 1)


def test_load_signals_in_order(qtbot, client_for):
    client, _ = client_for()
    events = []
    client.progress.connect(events.append)
    with qtbot.waitSignals([client.started, client.loaded, client.done], order="strict", timeout=5000,
                           check_params_cbs=[lambda op, key: op == "load", lambda h: h.id == "fake-1",
                                             lambda op, key: op == "load"]):
        client.load("fake-1")
    stages = [e.stage for e in events]
    order = ["inspecting", "loading weights", "preparing runner", "warming up", "resident"]
    assert stages[-1] == "resident"
    assert [order.index(s) for s in stages] == sorted(order.index(s) for s in stages)
    weights = [e.current_bytes for e in events if e.stage == "loading weights"]
    assert weights == sorted(weights) and weights[-1] == 20_000


def test_cancel_load(qtbot, client_for):
    client, engine = client_for(load_steps=200, load_delay=0.02)
    loaded, failures = [], []
    client.loaded.connect(loaded.append)
    client.failed.connect(lambda kind, message: failures.append(kind))

    def cancel_during_weights(event):   # a slot must not return a bool (PySide6 6.12 refcount bug)
        if event.stage == "loading weights":
            client.cancel_load()
    client.progress.connect(cancel_during_weights)
    with qtbot.waitSignal(client.done, timeout=5000, check_params_cb=lambda op, key: op == "load"):
        client.load("fake-1")
    assert failures == ["cancelled"] and loaded == [] and engine.loaded_models() == []


def test_tokens_coalesced_to_frames(qtbot, client_for):
    client, _ = client_for(n_tokens=5000)
    chunks = []
    client.token.connect(lambda chat_id, text: chunks.append(text))
    t0 = time.perf_counter()
    with qtbot.waitSignal(client.finished, timeout=30_000) as blocker:
        client.generate(request())
    elapsed = time.perf_counter() - t0
    assert "".join(chunks) == "".join(f"w{i} " for i in range(5000))
    assert len(chunks) <= elapsed / 0.016 + 3, (len(chunks), elapsed)
    assert blocker.args[1]["generated_tokens"] == 5000


def test_stop_is_honoured_within_a_step(qtbot, client_for):
    client, _ = client_for(token_delay=0.01, n_tokens=100_000)
    seen = []

    def on_token(chat_id, text):
        seen.append(text)
        if len(seen) == 3:
            client.stop(chat_id)        # direct call from the GUI thread while the worker is busy
    client.token.connect(on_token)
    with qtbot.waitSignal(client.finished, timeout=10_000) as blocker:
        client.generate(request())
    stats = blocker.args[1]
    assert stats["stop_reason"] == "cancelled"
    tokens_shown = sum(t.count(" ") for t in seen)
    assert stats["generated_tokens"] <= tokens_shown + 2


def test_queued_calls_are_served_during_a_reply(qtbot, client_for):
    client, _ = client_for(token_delay=0.005, n_tokens=400)
    order = []
    client.library_changed.connect(lambda _: order.append("library"))
    client.finished.connect(lambda *_: order.append("finished"))
    client.token.connect(lambda *_: order.append("token"))
    with qtbot.waitSignal(client.finished, timeout=20_000):
        client.generate(request())
        qtbot.waitUntil(lambda: "token" in order, timeout=5000)
        client.refresh_library()
    assert order.index("library") < order.index("finished")


def test_errors_become_failed_signals(qtbot, client_for):
    client, _ = client_for()
    with qtbot.waitSignals([client.failed, client.done], order="strict", timeout=5000,
                           check_params_cbs=[lambda kind, msg: kind == "not-a-checkpoint" and "bad" in msg, lambda *a: True]):
        client.import_path("/tmp/bad-folder")
    with qtbot.waitSignal(client.failed, timeout=5000,
                          check_params_cb=lambda kind, msg: kind == "internal" and "inspect" in msg):
        client.inspect("fake-1")    # the stand-in has no inspect(): an unexpected error is still shown
    with qtbot.waitSignal(client.library_changed, timeout=5000):   # and the worker keeps working
        client.refresh_library()
