"""NVFP4 in the app: the model manager's quantize action and the inspector's per-tensor formats."""
from PySide6.QtCore import Qt

from engine.library import ModelLibrary


def started(qtbot, client):
    qtbot.waitSignal(client.done, timeout=60_000, check_params_cb=lambda op, key: op == "start").wait()


def test_quantize_action_then_inspect(qtbot, make_app, synth, tmp_path):
    home = tmp_path / "home"
    ModelLibrary(home).import_path(synth("tiny", tokenizer=True), model_id="tiny", name="Tiny")
    win, client, store = make_app(home)
    started(qtbot, client)
    qtbot.waitUntil(lambda: win.library.row("tiny") is not None, timeout=10_000)
    win.manager.select("tiny")
    assert win.manager.quantize_button.isEnabled()

    stages = []
    client.progress.connect(lambda e: stages.append(e.stage))
    with qtbot.waitSignal(client.imported, timeout=60_000) as imported:
        win.manager.quantize_button.click()
    manifest = imported.args[0]
    assert manifest.quantization == "nvfp4" and manifest.name == "Tiny NVFP4"
    assert "quantizing" in stages
    qtbot.waitUntil(lambda: win.library.row(manifest.id) is not None, timeout=10_000)
    qtbot.waitUntil(lambda: "quantize" not in client.busy, timeout=10_000)
    win.manager.select(manifest.id)
    assert not win.manager.quantize_button.isEnabled()          # already NVFP4
    assert win.library.row("tiny") is not None                  # the original stays

    with qtbot.waitSignal(client.inspected, timeout=60_000, check_params_cb=lambda key, info: key == manifest.id):
        win.manager.inspect_button.click()
    model = win.inspector.tensor_model
    texts = {model.tensors[r].name: model.data(model.index(r, 1), Qt.DisplayRole) for r in range(model.rowCount())}
    assert texts["model.layers.0.self_attn.q_proj.weight"] == "U8 · nvfp4 4.51 bpw"
    assert texts["model.layers.0.self_attn.q_proj.weight_scale"] == "F8_E4M3 · e4m3 block scale"
    assert texts["model.embed_tokens.weight"] == "BF16"
    form = win.inspector.meta_form
    labels = [form.itemAt(i).widget().text() for i in range(form.count()) if form.itemAt(i).widget()]
    assert "NVFP4 layout" in labels and any("modelopt, blocks of 16" in t for t in labels)
