"""Issue 14 on the real app, the real default model and the torch backend: the defects a first try found,
and what users of the peers' apps expect (copy, export/import, edit any message, alternatives)."""
import json
import shutil

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMessageBox

from app.store import ERROR
from app.windows.main_window import CHAT, MODELS
from conftest import close

SLOW = 180_000   # ms: CPU-only machines in CI are slow and shared
DEFAULT = "smollm2-135m-instruct"


def started(qtbot, client):
    qtbot.waitSignal(client.done, timeout=60_000, check_params_cb=lambda op, key: op == "start").wait()


def load_default(qtbot, win, client):
    with qtbot.waitSignal(client.loaded, timeout=SLOW):
        win.load_model(DEFAULT)
    qtbot.waitUntil(lambda: win.current_model_id() == DEFAULT, timeout=10_000)


def reply(qtbot, win, client, action, **params):
    win.side.set_params({"temperature": 0.0, "max_tokens": 10, **params})
    with qtbot.waitSignal(client.finished, timeout=SLOW) as blocker:
        action()
    return blocker.args[1]


def type_and_enter(qtbot, win, text):
    qtbot.keyClicks(win.composer.edit, text)
    qtbot.keyClick(win.composer.edit, Qt.Key_Return)


def test_messages_copy_edit_any_alternatives_export_import(qtbot, make_app, ready_home, tmp_path):
    win, client, store = make_app(ready_home)
    started(qtbot, client)
    load_default(qtbot, win, client)
    win.show_page(CHAT)
    win.new_chat()
    chat_id = win.chat.chat.id

    reply(qtbot, win, client, lambda: win.send("Write a Python function that adds two numbers, in a code block."),
          max_tokens=60)
    reply(qtbot, win, client, lambda: win.send("Name a colour."))
    reply(qtbot, win, client, lambda: win.send("Name a fruit."))
    msgs = store.messages(chat_id)
    assert [m.role for m in msgs] == ["user", "assistant"] * 3

    # copy: the message's own text (Markdown source), and each code block's code alone
    first_reply = win.chat_view.widgets[1]
    first_reply.copy_button.click()
    assert QGuiApplication.clipboard().text() == msgs[1].content
    if "```" in msgs[1].content:
        block = first_reply.code_blocks()[0]
        block.copy_button.click()
        assert QGuiApplication.clipboard().text() == block.code and "```" not in block.code
        assert block.view.lineWrapMode() == block.view.LineWrapMode.NoWrap   # scrolls sideways, never wraps

    # edit an earlier message (not the last): what came after goes, the reply reuses the cached prefix
    second_user = win.chat_view.widgets[2]
    assert second_user.edit_button.isVisible()
    second_user.edit_button.click()
    assert win.composer.editing and win.composer.edit.toPlainText() == "Name a colour."
    assert "earlier message" in win.composer.edit_hint.text()
    win.composer.edit.clear()
    stats = reply(qtbot, win, client, lambda: type_and_enter(qtbot, win, "Name an animal."))
    msgs = store.messages(chat_id)
    assert [m.content for m in msgs if m.role == "user"] == [msgs[0].content, "Name an animal."]
    assert len(msgs) == 4 and stats["prefilled_tokens"] < stats["prompt_tokens"]

    # regenerate keeps the earlier reply as an alternative; ‹ › pages between them
    before = msgs[-1].content
    reply(qtbot, win, client, win.composer.regenerate_button.click, temperature=1.0, seed=11, max_tokens=12)
    last = store.messages(chat_id)[-1]
    assert last.alternatives["others"][0]["content"] == before and last.alternatives["index"] == 1
    widget = win.chat_view.widgets[-1]
    assert widget.alternatives.text() == "2 / 2" and widget.previous_button.isEnabled()
    newer = last.content
    widget.previous_button.click()
    assert store.messages(chat_id)[-1].content == before and win.chat_view.widgets[-1].alternatives.text() == "1 / 2"
    win.chat_view.widgets[-1].next_button.click()
    assert store.messages(chat_id)[-1].content == newer

    # export (JSON and Markdown) with the provenance of every reply; import the JSON back: equal
    path = tmp_path / "chat.json"
    win.export_chat(chat_id, str(path), "json")
    data = json.loads(path.read_text())
    replies = [m for m in data["messages"] if m["role"] == "assistant"]
    assert all(m["model_id"] == DEFAULT and m["weights_sha256"] and m["seed"] is not None
               and m["params"]["temperature"] is not None for m in replies)
    md = tmp_path / "chat.md"
    win.export_chat(chat_id, str(md), "md")
    text = md.read_text()
    assert "## You" in text and "Name an animal." in text and f"seed {replies[-1]['seed']}" in text
    imported = win.import_chats(str(path))
    assert len(imported) == 1 and imported[0].id != chat_id and win.chat.chat.id == imported[0].id

    def comparable(export):
        return {k: v for k, v in export.items() if k != "updated_at"}
    assert comparable(store.export_chat(imported[0].id)) == comparable(data)

    # export all, import all: every chat again
    everything = tmp_path / "all.json"
    win.export_all(str(everything))
    count = len(store.list_chats())
    assert len(win.import_chats(str(everything))) == count and len(store.list_chats()) == 2 * count
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert win.import_chats(str(bad)) == [] and win.banner.kind == "import-failed"
    assert "not a Hearth chat export" in win.banner.message.text()


def test_chat_list_new_delete_drafts_and_stop_per_chat(qtbot, make_app, ready_home, monkeypatch):
    win, client, store = make_app(ready_home)
    started(qtbot, client)
    load_default(qtbot, win, client)
    win.show_page(CHAT)

    # Ctrl+N on an empty chat stays on it instead of adding another "New chat"
    win.new_chat()
    first = win.chat.chat.id
    chats = len(store.list_chats())
    qtbot.keyClick(win, Qt.Key_N, Qt.ControlModifier)
    qtbot.keyClick(win, Qt.Key_N, Qt.ControlModifier)
    assert win.chat.chat.id == first and len(store.list_chats()) == chats

    # the draft stays with its chat
    reply(qtbot, win, client, lambda: win.send("Hello."))
    win.composer.edit.setPlainText("a draft for the first chat")
    win.new_chat()
    second = win.chat.chat.id
    assert second != first and win.composer.edit.toPlainText() == ""
    win.open_chat(first)
    assert win.composer.edit.toPlainText() == "a draft for the first chat"
    win.composer.edit.clear()

    # a reply streaming in the first chat: the second chat's composer has no Stop, and Esc there stops nothing
    win.side.set_params({"temperature": 0.0, "max_tokens": 200})
    win.send("Count from one to fifty in words.")
    qtbot.waitSignal(client.token, timeout=SLOW).wait()
    win.open_chat(second)
    assert win.composer.stop_button.isHidden() and "1 other chat" in win.composer.status.text()
    win.stop()
    qtbot.keyClick(win.composer.edit, Qt.Key_Escape)
    assert first in win.chat.streams and not client.worker._stop_requested
    win.open_chat(first)
    assert not win.composer.stop_button.isHidden()
    with qtbot.waitSignal(client.finished, timeout=SLOW) as done:
        win.stop()
    assert done.args[1]["stop_reason"] == "cancelled"

    # Delete in the chat list asks first (No keeps the chat, Yes deletes it)
    win.sessions.list.setFocus()
    win.refresh_sessions()
    answers = [QMessageBox.No, QMessageBox.Yes]
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: answers.pop(0))
    target = win.sessions.current_id()
    qtbot.keyClick(win.sessions.list, Qt.Key_Delete)
    assert any(c.id == target for c in store.list_chats())
    qtbot.keyClick(win.sessions.list, Qt.Key_Delete)
    assert not any(c.id == target for c in store.list_chats()) and not answers


def test_a_failed_reply_can_be_removed_and_context_is_shown_while_streaming(qtbot, make_app, tmp_path_factory,
                                                                             default_gguf):
    home = tmp_path_factory.mktemp("hearth-app-fail")
    from engine.default_model import install_default_model
    from engine.library import ModelLibrary
    install_default_model(ModelLibrary(home))
    win, client, store = make_app(home)
    started(qtbot, client)
    client.set_context(DEFAULT, 256)
    load_default(qtbot, win, client)
    win.show_page(CHAT)
    win.new_chat()

    # the live figures include the context while the reply streams
    contexts = []
    client.metrics.connect(lambda chat_id, live: contexts.append(live.get("context_used")))
    reply(qtbot, win, client, lambda: win.send("Hi."), max_tokens=20)
    assert contexts and contexts[0] is not None and "/ 256 tokens" in win.side.context_label.text()

    # a message longer than the context fails; the failed reply has Remove, and Remove takes it away
    with qtbot.waitSignal(client.done, timeout=SLOW, check_params_cb=lambda op, key: op == "generate"):
        win.send("word " * 400)
    failed = store.messages(win.chat.chat.id)[-1]
    assert failed.state == ERROR
    widget = win.chat_view.widgets[-1]
    assert widget.remove_button.isVisible() and "Failed" in widget.footer.text()
    widget.remove_button.click()
    assert all(m.state != ERROR for m in store.messages(win.chat.chat.id))
    assert len(win.chat_view.widgets) == len(store.messages(win.chat.chat.id))

    # a reopened chat whose last reply was cut off (no stats) still shows its context use
    chat_id = win.chat.chat.id
    store.add_message(chat_id, "assistant", "A reply cut off by a crash", state="stopped", model_id=DEFAULT)
    win.new_chat()
    win.side.clear_figures()
    with qtbot.waitSignal(client.context_counted, timeout=60_000):
        win.open_chat(chat_id)
    assert "/ 256 tokens" in win.side.context_label.text()


def test_first_start_banner_goes_once_loaded_and_a_long_prompt_shows_its_reading(qtbot, make_app, tmp_path_factory):
    home = tmp_path_factory.mktemp("hearth-app-first")
    win, client, store = make_app(home, "--model", "auto")
    with qtbot.waitSignal(client.loaded, timeout=SLOW):
        started(qtbot, client)
    assert not win.banner.isVisible() or win.banner.title.text() != "Default model installed"
    win.show_page(CHAT)
    win.new_chat()
    win.side.set_params({"temperature": 0.0, "max_tokens": 2})
    finished = []
    client.finished.connect(lambda chat_id, stats: finished.append(stats))
    win.send("Summarize: " + "The lighthouse keeper wrote in his log every evening. " * 300)   # ~3,300 tokens
    widget = win.chat_view.widgets[-1]
    qtbot.waitUntil(lambda: widget.waiting_text.startswith("Reading your message"), timeout=SLOW)
    assert "tokens…" in widget.waiting_text and " of 3," in widget.waiting_text
    qtbot.waitUntil(lambda: bool(finished), timeout=SLOW)
    assert finished[0]["prompt_tokens"] > 3000


def test_library_labels_inspector_and_status_after_import_and_load(qtbot, make_app, tmp_path_factory, default_gguf,
                                                                    synth, tmp_path):
    home = tmp_path_factory.mktemp("hearth-app-labels")
    win, client, store = make_app(home)
    started(qtbot, client)
    assert "no NVIDIA GPU" in win.backend_label.text() or "no GPU support" in win.backend_label.text() \
        or "cuda" in win.backend_label.text().lower()
    assert "insufficient" not in win.backend_label.text()
    assert win.inspector.summary.text().startswith("Nothing inspected yet")

    # an unknown architecture is refused at import, and the library stays as it was
    gpt2 = tmp_path / "gpt2ish"
    shutil.copytree(synth("tiny", tokenizer=True), gpt2)
    cfg = json.loads((gpt2 / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (gpt2 / "config.json").write_text(json.dumps(cfg))
    with qtbot.waitSignal(client.done, timeout=SLOW, check_params_cb=lambda op, key: op == "import"):
        win.manager.import_requested.emit(str(gpt2))
    assert win.banner.kind == "unsupported-architecture" and "not added to the library" in win.banner.message.text()
    assert win.library.rows == []

    # a synthetic model first, then the default GGUF: the details card follows the new import
    with qtbot.waitSignal(client.imported, timeout=SLOW):
        win.manager.import_requested.emit(str(synth("tiny", tokenizer=True)))
    with qtbot.waitSignal(client.imported, timeout=SLOW) as imported:
        win.manager.import_requested.emit(str(default_gguf))
    model_id = imported.args[0].id
    qtbot.waitUntil(lambda: win.manager.selected_id() == model_id, timeout=30_000)
    assert win.manager.detail_title.text() == win.library.row(model_id).name

    # one truth for the quantization and the size
    qtbot.waitUntil(lambda: win.library.row(model_id).stored_quantization != "", timeout=60_000)
    assert win.library.row(model_id).quantization_label == "bf16 (from Q4_1)"
    size = win.manager.table_model.data(win.manager.table_model.index(
        [r.id for r in win.library.rows].index(model_id), 4))
    assert size.endswith("MiB")

    # load: the inspector shows the loaded model (tensor names in natural order), the context field says why
    # it cannot change, and the status bar never cuts a word at the minimum width
    with qtbot.waitSignal(client.loaded, timeout=SLOW):
        win.load_model(model_id)
    qtbot.waitUntil(lambda: win.inspector.key == model_id, timeout=60_000)
    names = [win.inspector.tensor_model.tensors[i].name for i in range(win.inspector.tensor_model.rowCount())]
    layer_order = [n.split(".")[2] for n in names if n.startswith("model.layers.")]
    seen = list(dict.fromkeys(int(x) for x in layer_order))
    assert seen == sorted(seen)
    assert "(imported from Q4_1)" in " ".join(
        win.inspector.meta_form.itemAt(i).widget().text() for i in range(win.inspector.meta_form.count())
        if win.inspector.meta_form.itemAt(i).widget())
    qtbot.waitUntil(lambda: not win.manager.busy, timeout=30_000)
    win.show_page(MODELS)
    win.manager.select(model_id)
    assert not win.manager.context_box.isEnabled() and win.manager.context_reason.isVisible()
    assert "Unload" in win.manager.context_reason.text()
    win.resize(win.minimumSize())
    qtbot.wait(50)
    for label in (win.backend_label, win.model_label):
        shown = label.shown_text()
        assert shown == label.text() or shown.endswith("…")
        assert label.toolTip() == label.text()


def test_removing_the_loaded_model_says_so_and_the_next_start_loads_the_default(qtbot, make_app, tmp_path_factory,
                                                                                 synth, monkeypatch):
    home = tmp_path_factory.mktemp("hearth-app-remove")
    from engine.default_model import install_default_model
    from engine.library import ModelLibrary
    install_default_model(ModelLibrary(home))
    win, client, store = make_app(home)
    started(qtbot, client)
    with qtbot.waitSignal(client.imported, timeout=SLOW) as imported:
        win.manager.import_requested.emit(str(synth("tiny", tokenizer=True)))
    other = imported.args[0].id
    with qtbot.waitSignal(client.loaded, timeout=SLOW):
        win.load_model(other)
    assert win.settings.value("chat/last_model") == other
    failures = []
    client.failed.connect(lambda kind, message: failures.append((kind, message)))
    win.manager.select(other)
    qtbot.waitUntil(lambda: not win.manager.busy, timeout=30_000)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    with qtbot.waitSignal(client.done, timeout=SLOW, check_params_cb=lambda op, key: op == "remove"):
        win.manager.remove_button.click()
    qtbot.waitUntil(lambda: win.library.row(other) is None, timeout=30_000)
    qtbot.wait(200)
    assert failures == [] and win.banner.title.text() == "Model removed"
    close(win, client, store)

    win, client, store = make_app(home, "--model", "auto")
    with qtbot.waitSignal(client.loaded, timeout=SLOW) as loaded:
        started(qtbot, client)
    assert loaded.args[0].id == DEFAULT


def test_each_context_policy_on_a_small_context(qtbot, make_app, tmp_path_factory):
    """256 tokens of context: stop refuses and says so; drop-oldest drops just enough (the system prompt
    stays); a rolling window drops to half and the next turn reuses the cached prefix."""
    home = tmp_path_factory.mktemp("hearth-app-policy")
    from engine.default_model import install_default_model
    from engine.library import ModelLibrary
    install_default_model(ModelLibrary(home))
    win, client, store = make_app(home)
    started(qtbot, client)
    client.set_context(DEFAULT, 256)
    load_default(qtbot, win, client)
    win.show_page(CHAT)
    filler = "Here is a note about the weather in a small town by the sea, for the record. " * 3

    def fill_until_trimmed(policy):
        win.new_chat() if win.chat.messages else None
        win.side.set_system_prompt("You are terse.")
        win._system_prompt_changed("You are terse.")
        results = []
        for turn in range(8):
            win.side.set_params({"temperature": 0.0, "max_tokens": 8, "context_policy": policy})
            win.chat.set_params(win.side.params())
            with qtbot.waitSignal(client.done, timeout=SLOW, check_params_cb=lambda op, key: op == "generate"):
                win.send(f"{turn}: {filler}")
            last = store.messages(win.chat.chat.id)[-1]
            results.append(last)
            if last.state == ERROR or (last.stats or {}).get("context_note"):
                return results
        raise AssertionError(f"{policy}: the chat never outgrew the context")

    stopped = fill_until_trimmed("stop")[-1]
    assert stopped.state == ERROR and win.banner.kind == "context-overflow"
    assert "rolling window" in win.banner.message.text() and "256" in stopped.stats["error"]
    win.banner.dismiss()

    win.new_chat()
    dropped = fill_until_trimmed("drop-oldest")[-1]
    note = dropped.stats["context_note"]
    assert dropped.state != ERROR and "oldest message" in note and "system prompt kept" in note
    sid = client.worker._sessions[win.chat.chat.id][0]
    history = client.worker.engine.history(sid)
    assert history[0] == {"role": "system", "content": "You are terse."}
    assert dropped.stats["prompt_tokens"] + 8 <= 256

    win.new_chat()
    rolled = fill_until_trimmed("rolling")[-1]
    assert "oldest message" in rolled.stats["context_note"] and rolled.stats["prompt_tokens"] <= 256 // 2 + 8
    win.side.set_params({"temperature": 0.0, "max_tokens": 8, "context_policy": "rolling"})
    stats = reply(qtbot, win, client, lambda: win.send("And one more short one."), max_tokens=8,
                  context_policy="rolling")
    assert stats["prefilled_tokens"] < stats["prompt_tokens"]      # the window did not move: prefix reused
    assert stats["context_note"] == rolled.stats["context_note"]


def test_two_chats_reply_at_once_equal_to_each_alone_and_two_models_resident(qtbot, make_app, ready_home, synth):
    win, client, store = make_app(ready_home)
    started(qtbot, client)
    load_default(qtbot, win, client)
    win.show_page(CHAT)
    prompts = ["Count from one to thirty in words.", "List ten colours, one per line."]
    greedy = {"temperature": 0.0, "max_tokens": 40}

    def chat_with(prompt):
        win.new_chat() if win.chat.messages else None
        win.side.set_params(greedy)
        win.send(prompt)
        return win.chat.chat.id

    # each alone
    alone = []
    for prompt in prompts:
        with qtbot.waitSignal(client.finished, timeout=SLOW):
            chat_id = chat_with(prompt)
        alone.append(store.messages(chat_id)[-1].content)

    # both at once: the second starts while the first streams; both stream (tokens for both chats)
    tokens_for, order = {}, []

    def on_token(chat_id, text):
        tokens_for.setdefault(chat_id, []).append(text)
        order.append(chat_id)
    client.token.connect(on_token)
    finished = []
    client.finished.connect(lambda chat_id, stats: finished.append(chat_id))
    win.new_chat()
    a = chat_with(prompts[0])
    qtbot.waitUntil(lambda: a in tokens_for, timeout=SLOW)
    win.new_chat()
    b = chat_with(prompts[1])
    qtbot.waitUntil(lambda: {a, b} <= set(finished), timeout=SLOW)
    assert store.messages(a)[-1].content == alone[0] and store.messages(b)[-1].content == alone[1]
    # the two streamed side by side: the first chat still received text after the second's first piece
    assert order.index(b) < len(order) - 1 - order[::-1].index(a)

    # a second model beside the first; each chat names its model; switching a chat's model keeps its history
    with qtbot.waitSignal(client.imported, timeout=SLOW) as imported:
        win.manager.import_requested.emit(str(synth("tiny", tokenizer=True)))
    tiny = imported.args[0].id
    with qtbot.waitSignal(client.loaded, timeout=SLOW):
        win.load_model(tiny)
    assert {h.id for h in client.worker.engine.loaded_models()} == {DEFAULT, tiny}
    assert win.model_combo.count() == 2
    win.show_page(CHAT)
    win.open_chat(a)
    assert win.current_model_id() == DEFAULT
    win.model_combo.setCurrentIndex(win.model_combo.findData(tiny))
    reply(qtbot, win, client, lambda: win.send("And now?"), max_tokens=4)
    msgs = store.messages(a)
    assert [m.role for m in msgs] == ["user", "assistant"] * 2 and msgs[0].content == prompts[0]
    assert msgs[1].model_id == DEFAULT and msgs[3].model_id == tiny and store.chat(a).model_id == tiny
    assert win.chat_view.widgets[1].role.text() != win.chat_view.widgets[3].role.text()
    win.open_chat(b)
    assert win.current_model_id() == DEFAULT       # the other chat still names its own model


def test_logs_diagnostics_resources_settings_and_accessibility(qtbot, make_app, tmp_path_factory, tmp_path, synth):
    from PySide6.QtWidgets import (QAbstractButton, QAbstractItemView, QAbstractSpinBox, QApplication, QComboBox,
                                   QLineEdit, QPlainTextEdit, QTextEdit)
    from app import theme
    from app.windows.main_window import LOGS, SETTINGS

    home = tmp_path_factory.mktemp("hearth-app-diag")
    from engine.default_model import install_default_model
    from engine.library import ModelLibrary
    install_default_model(ModelLibrary(home))
    win, client, store = make_app(home)
    with qtbot.waitSignal(client.diagnosed, timeout=60_000):
        started(qtbot, client)

    # Settings: a default context length for the next load, and Ctrl+Enter to send
    win.show_page(SETTINGS)
    win.preferences.context.setValue(1024)
    win.preferences.send_key.setCurrentIndex(win.preferences.send_key.findData("ctrl-enter"))
    assert json.loads(win.settings.value("app/preferences"))["context"] == 1024
    from PySide6.QtWidgets import QLabel
    telemetry = next(l for l in win.preferences.findChildren(QLabel) if l.accessibleName() == "Telemetry")
    assert telemetry.text().startswith("None.") and "sends nothing" in telemetry.text()

    # the log shows the load's lines, stage by stage; the resources show the KV cache and the memory
    with qtbot.waitSignal(client.done, timeout=SLOW, check_params_cb=lambda op, key: op == "load"):
        win.load_model(DEFAULT)
    assert client.worker.engine.context_limit(DEFAULT) == 1024
    win.show_page(LOGS)
    qtbot.waitUntil(lambda: "done in" in win.diagnostics.log.toPlainText(), timeout=10_000)
    text = win.diagnostics.log.toPlainText()
    assert f"load {DEFAULT}: started" in text and f"load {DEFAULT}: loading weights" in text
    assert f"load {DEFAULT}: done in" in text and "INFO" in text
    win.diagnostics.level.setCurrentIndex(win.diagnostics.level.findData("WARNING"))
    assert f"load {DEFAULT}: started" not in win.diagnostics.log.toPlainText()
    saved = tmp_path / "hearth.log"
    win.diagnostics.save_log(str(saved))
    assert f"load {DEFAULT}: resident" in saved.read_text()
    win.diagnostics.copy_diagnostics_button.click()
    report = QGuiApplication.clipboard().text()
    assert "build_info:" in report and "cuda_compiled=" in report and f"load {DEFAULT}" in report
    gpu = win.diagnostics.fields["gpu"].text()
    assert "insufficient" not in gpu and ("no NVIDIA GPU" in gpu or "no GPU support" in gpu or "driver" in gpu)

    win.show_page(CHAT)
    win.new_chat()
    qtbot.keyClicks(win.composer.edit, "Say hi.")
    qtbot.keyClick(win.composer.edit, Qt.Key_Return)              # Enter is a new line now
    assert win.composer.edit.toPlainText() == "Say hi.\n" and win.chat.streaming is None
    win.side.set_params({"temperature": 0.0, "max_tokens": 6})
    with qtbot.waitSignal(client.finished, timeout=SLOW):
        qtbot.keyClick(win.composer.edit, Qt.Key_Return, Qt.ControlModifier)
    assert win.last_announcement.startswith("New reply:")            # announced to screen readers
    win._show_resources()
    kv = win.resources_shown["kv"]
    assert kv and kv[0]["used"] > 0 and kv[0]["capacity"] >= 1024
    assert "KV" in win.memory_label.text() and "free" in win.memory_label.text()

    # a load that would not fit is warned about, with the plan's advice, and not started
    with qtbot.waitSignal(client.imported, timeout=SLOW) as imported:
        win.manager.import_requested.emit(str(synth("tiny", tokenizer=True, max_position_embeddings=2**30)))
    huge = imported.args[0].id
    win.show_page(MODELS)
    qtbot.waitUntil(lambda: win.library.row(huge) is not None, timeout=10_000)
    win.manager.select(huge)
    qtbot.waitUntil(lambda: huge in win.manager.plans, timeout=60_000)
    with qtbot.waitSignal(client.memory_planned, timeout=60_000, check_params_cb=lambda key, plan: not plan["ok"]):
        win.manager.context_box.setValue(win.manager.context_box.maximum())
    loads = []
    client.started.connect(lambda op, key: loads.append(key) if op == "load" else None)
    with qtbot.waitSignal(client.memory_planned, timeout=60_000):   # planned again, then warned
        win.load_model(huge)
    assert win.banner.kind == "out-of-memory" and "tokens fits" in win.banner.message.text() and loads == []

    # the theme follows the setting
    win.show_page(SETTINGS)
    win.preferences.theme.setCurrentIndex(win.preferences.theme.findData("dark"))
    assert theme.current().dark
    win.preferences.theme.setCurrentIndex(win.preferences.theme.findData("light"))
    assert not theme.current().dark

    # every control on every page has an accessible name
    nameless = []
    for page in range(win.pages.count()):
        win.show_page(page)
        for kind in (QAbstractButton, QLineEdit, QPlainTextEdit, QTextEdit, QComboBox, QAbstractSpinBox,
                     QAbstractItemView):
            for w in win.findChildren(kind):
                if w.objectName().startswith("qt_"):    # a spin box's or a scroll area's own parts
                    continue
                if w.isVisible() and not w.accessibleName() and not (isinstance(w, QAbstractButton) and w.text()):
                    nameless.append(f"{type(w).__name__} {w.objectName()} on page {page}")
    assert nameless == [], nameless

    # Tab never stays in the composer
    win.show_page(CHAT)
    win.composer.edit.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is win.composer.edit, timeout=5000)
    qtbot.keyClick(win.composer.edit, Qt.Key_Tab)
    assert QApplication.focusWidget() is not win.composer.edit
