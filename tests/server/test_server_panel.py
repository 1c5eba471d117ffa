"""The app's Server page, offscreen with pytest-qt: start Hearth's server from the panel, use it with the
official client, watch the request log, then add that same server as a remote endpoint and chat with its
model in the chat window (the app as a client of a remote endpoint)."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import openai  # noqa: E402
import pytest  # noqa: E402

import app.qtcompat  # noqa: E402,F401  (PySide6 6.12 on Python 3.11 drops references to None/True)

from conftest_helpers import MODEL, Relay  # noqa: E402


@pytest.fixture
def window(qapp, hearth_home, default_model, qtbot):
    import keyring
    from keyring.backends import fail

    from PySide6.QtCore import QCoreApplication, QEvent

    from app.main import build

    # Windows other tests left behind are re-styled by every build (theme.apply): with their big
    # tensor tables that takes minutes. They are done with: delete them first.
    for leftover in qapp.topLevelWidgets():
        leftover.close()
        leftover.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())            # CI has no keyring: the key stays in memory
    _, win, client, store = build(["--home", str(hearth_home), "--backend", "torch", "--no-model"], app=qapp)
    win.resize(1300, 850)
    win.show()
    qtbot.waitUntil(lambda: client.worker.engine is not None, timeout=120_000)
    yield win
    win.close()
    client.shutdown()
    store.close()
    win.deleteLater()
    keyring.set_keyring(before)
    (hearth_home / "remotes.json").unlink(missing_ok=True)     # endpoints added here point at stopped servers


def test_server_panel_serves_and_the_app_chats_through_a_remote_endpoint(window, qtbot):
    client, panel = window.client, window.server_panel
    window.show_page(3)
    assert window.pages.currentWidget() is panel
    panel.port.setValue(0)                         # any free port
    panel.require_key.setChecked(True)
    key = panel.key.text()
    with qtbot.waitSignal(client.server_state, timeout=60_000) as started:
        panel.toggle.click()
    state = started.args[0]
    assert state["running"] and state["api_key"] and MODEL in state["models"]
    assert panel.status.text().startswith(f"Serving at {state['url']}") and panel.toggle.text() == "Stop server"

    api = openai.OpenAI(base_url=state["url"], api_key=key, max_retries=0, timeout=300)
    reply = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                        temperature=0)
    assert reply.usage.completion_tokens == 4
    qtbot.waitUntil(lambda: f"200  POST /v1/chat/completions  {MODEL}" in panel.log.toPlainText(), timeout=10_000)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=state["url"], api_key="wrong", max_retries=0).models.list()

    # the same server as a remote endpoint: its model joins the chat's list, marked remote
    panel.remote_name.setText("own")
    panel.remote_url.setText(state["url"])
    panel.remote_key.setText(key)
    with qtbot.waitSignal(client.remotes_changed, timeout=60_000, check_params_cb=lambda rows: any(
            r["name"] == "own" for r in rows)) as listed:
        panel.add_remote.click()
    row = [r for r in listed.args[0] if r["name"] == "own"][0]
    assert row["models"] == [MODEL] and not row["error"]
    qtbot.waitUntil(lambda: "session only" in window.banner.message.text(), timeout=10_000)   # no keyring here
    ref = f"remote:own/{MODEL}"
    index = window.model_combo.findData(ref)
    assert index >= 0 and "remote" in window.model_combo.itemText(index)
    window.model_combo.setCurrentIndex(index)
    window.show_page(0)
    with qtbot.waitSignal(client.finished, timeout=120_000) as finished:
        window.send("Name a colour.")
    stats = finished.args[1]
    assert stats["generated_tokens"] > 0 and stats["ttft_s"] > 0
    reply = window.chat.messages[-1]
    assert reply.role == "assistant" and reply.content and reply.model_id == ref
    qtbot.waitUntil(lambda: panel.log.toPlainText().count("POST /v1/chat/completions") >= 2, timeout=10_000)

    with qtbot.waitSignal(client.server_state, timeout=30_000) as stopped:
        panel.toggle.click()
    assert not stopped.args[0]["running"] and panel.toggle.text() == "Start server"


def test_a_port_in_use_is_reported_in_the_panel(window, qtbot):
    import socket

    client, panel = window.client, window.server_panel
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        panel.port.setValue(s.getsockname()[1])
        with qtbot.waitSignal(client.server_state, timeout=60_000) as state:
            panel.toggle.click()
    assert not state.args[0]["running"]
    assert "could not listen" in panel.status.text() and panel.toggle.isEnabled()


def test_a_remote_reply_cut_by_a_dropped_connection_is_kept_as_stopped(window, qtbot, default_engine):
    from engine.server import Server, ServerConfig

    client, panel = window.client, window.server_panel
    remote = Server(default_engine, ServerConfig(port=0)).start()     # another machine's server, say
    relay = Relay(remote.port)                                        # and the network in between
    try:
        panel.remote_name.setText("cluster")
        panel.remote_url.setText(relay.url)
        with qtbot.waitSignal(client.remotes_changed, timeout=60_000, check_params_cb=lambda rows: any(
                r["name"] == "cluster" and r["models"] for r in rows)):
            panel.add_remote.click()
        window.model_combo.setCurrentIndex(window.model_combo.findData(f"remote:cluster/{MODEL}"))
        assert window.current_model_id() == f"remote:cluster/{MODEL}"
        window.show_page(0)
        with qtbot.waitSignal(client.token, timeout=120_000):
            window.send("Write a very long story about a lighthouse keeper and the sea.")
        with qtbot.waitSignal(client.finished, timeout=120_000) as finished:
            relay.sever()                                            # the connection drops mid-reply
    finally:
        relay.sever()
        remote.stop()
    assert finished.args[1]["stop_reason"] == "cancelled"
    reply = window.chat.messages[-1]
    assert reply.role == "assistant" and reply.content and reply.state == "stopped"
    qtbot.waitUntil(lambda: "dropped" in window.banner.message.text(), timeout=10_000)
