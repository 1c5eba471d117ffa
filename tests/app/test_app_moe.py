"""The app with a mixture-of-experts checkpoint: import, inspect (total and active parameters), load and chat."""
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel

from app.store import COMPLETE
from app.windows.main_window import CHAT, INSPECT

SLOW = 180_000   # ms: CPU-only machines in CI are slow and shared


def _form_text(form) -> dict:
    rows = {}
    for i in range(form.rowCount()):
        key = form.itemAt(i, form.ItemRole.LabelRole)
        value = form.itemAt(i, form.ItemRole.FieldRole)
        if key is not None and value is not None and isinstance(key.widget(), QLabel):
            rows[key.widget().text()] = value.widget().text()
    return rows


def test_import_inspect_load_and_chat_with_a_tiny_moe(qtbot, make_app, tmp_path_factory, moe_chat_checkpoint):
    home = tmp_path_factory.mktemp("hearth-app-moe")
    win, client, store = make_app(home)
    qtbot.waitSignal(client.done, timeout=60_000, check_params_cb=lambda op, key: op == "start").wait()

    with qtbot.waitSignal(client.imported, timeout=SLOW) as imported:
        win.manager.import_requested.emit(str(moe_chat_checkpoint))
    model_id = imported.args[0].id
    qtbot.waitUntil(lambda: win.library.row(model_id) is not None, timeout=10_000)
    assert win.library.row(model_id).architecture == "Qwen3MoeForCausalLM"

    # inspect: the MoE block and its total / active parameters, from the headers alone
    win.manager.select(model_id)
    with qtbot.waitSignal(client.inspected, timeout=60_000, check_params_cb=lambda key, info: key == model_id) as ins:
        win.manager.inspect_button.click()
    plan = ins.args[1].plan
    assert win.pages.currentIndex() == INSPECT
    rows = _form_text(win.inspector.plan_form)
    assert rows["Archetype"] == "moe"
    assert rows["Block"] == "MoE SwiGLU, 8 experts, top-2 (renormalised), 2 of 3 layers (the rest dense SwiGLU)"
    assert f"({plan.parameters:,} / {plan.active_parameters:,})" in rows["Parameters"]
    assert "active per token" in rows["Parameters"] and plan.active_parameters < plan.parameters
    win.inspector.filter.setText("experts.7 down")
    assert win.inspector.proxy.rowCount() == 2          # expert 7's down projection in the two MoE layers

    # load and chat on the torch backend
    with qtbot.waitSignal(client.loaded, timeout=SLOW):
        win.manager.load_button.click()
    assert win.library.row(model_id).loaded and win.current_model_id() == model_id
    win.show_page(CHAT)
    win.new_chat()
    tokens = []
    client.token.connect(lambda chat_id, text: tokens.append(text))
    win.side.set_params({"temperature": 0.0, "max_tokens": 10})
    with qtbot.waitSignal(client.finished, timeout=SLOW) as finished:
        qtbot.keyClicks(win.composer.edit, "Hello, experts!")
        qtbot.keyClick(win.composer.edit, Qt.Key_Return)
    stats = finished.args[1]
    assert stats["generated_tokens"] > 0 and tokens
    msgs = store.messages(win.chat.chat.id)
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[1].state == COMPLETE
    assert msgs[1].content == "".join(tokens) != "" and msgs[1].model_id == model_id
