"""Re-create docs/screenshots/*.png from the real app and the real default model.

    xvfb-run -a -s "-screen 0 1600x1000x24" python -m app.screenshots [--out docs/screenshots] [--dark]

Uses a throwaway Hearth home (the default model is imported into it), the torch backend and
greedy sampling, so the pictures are reproducible.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "screenshots"))
    p.add_argument("--dark", action="store_true", help="also grab the chat in the dark theme (as chat-dark.png)")
    p.add_argument("--theme", choices=("light", "dark"), default="light")
    args = p.parse_args(argv)
    os.environ["HEARTH_THEME"] = args.theme
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.theme == "light" else "-dark"

    from . import qtcompat  # noqa: F401
    from PySide6.QtWidgets import QApplication
    app = QApplication(sys.argv[:1])

    home = Path(tempfile.mkdtemp(prefix="hearth-shots-"))
    from engine.default_model import install_default_model
    from engine.library import ModelLibrary
    model_id = install_default_model(ModelLibrary(home)).id

    from .main import build
    _, win, client, store = build(["--home", str(home), "--backend", "torch", "--no-model"], app=app)
    win.resize(1440, 900)
    win.show()

    def spin(pred, timeout=180.0):
        t0 = time.time()
        while not pred():
            if time.time() - t0 > timeout:
                raise TimeoutError("the app did not get there in time")
            app.processEvents()
            time.sleep(0.005)

    def settle(seconds=0.3):
        t0 = time.time()
        while time.time() - t0 < seconds:
            app.processEvents()
            time.sleep(0.01)

    def grab(name):
        settle()
        path = out / f"{name}{suffix}.png"
        win.grab().save(str(path))
        print("wrote", path)

    done = []
    client.done.connect(lambda op, key: done.append(op))
    spin(lambda: "start" in done and win.library.row(model_id) is not None)
    spin(lambda: win.library.row(model_id).parameter_count is not None)

    # model manager with the memory plan
    win.show_page(1)
    win.manager.select(model_id)
    spin(lambda: model_id in win.manager.plans)
    grab("model-manager")

    # inspector, filtered to one layer
    inspected = []
    client.inspected.connect(lambda key, info: inspected.append(key))
    win.inspect(model_id)
    spin(lambda: inspected)
    win.inspector.filter.setText("layers.0.")
    grab("inspector")

    # a load in progress: freeze the picture at about half the weights
    win.show_page(1)
    grabbed = []

    def on_progress(event):
        if not grabbed and event.stage == "loading weights" and event.fraction >= 0.45:
            grabbed.append(True)
            win.load_progress.update_event(event)
            path = out / f"load-progress{suffix}.png"
            win.grab().save(str(path))
            print("wrote", path)
    client.progress.connect(on_progress)
    win.load_model(model_id)
    spin(lambda: win.library.row(model_id).loaded and "load" not in client.busy)

    # a chat with a code block
    for title in ("Packing list for a hiking trip", "What is a KV cache?"):
        chat = store.create_chat(title, model_id)
        store.add_message(chat.id, "user", title)
        store.add_message(chat.id, "assistant", "…", model_id=model_id)
    win.refresh_sessions()
    win.new_chat()
    win.side.set_params({"temperature": 0.0, "max_tokens": 160, "seed": 7, "top_k": 40, "top_p": 0.95,
                         "min_p": 0.05, "repetition_penalty": 1.1})
    win.side.system_prompt.setPlainText("You are a helpful programming assistant.")
    finished = []
    client.finished.connect(lambda chat_id, stats: finished.append(stats))
    win.send("Write a Python function that checks whether a word is a palindrome.")
    spin(lambda: finished)
    win.composer.edit.setFocus()
    grab("chat")

    # regenerate keeps the first reply: ‹ 2 / 2 › under the new one
    win.side.set_params({"temperature": 0.9, "max_tokens": 80, "seed": 11, "top_k": 40, "top_p": 0.95,
                         "min_p": 0.05, "repetition_penalty": 1.1})
    finished.clear()
    win.regenerate()
    spin(lambda: finished)
    win._show_resources()
    grab("chat-alternatives")

    # logs & diagnostics, and the settings page
    from .windows.main_window import LOGS, SETTINGS
    win.show_page(LOGS)
    grab("logs")
    win.show_page(SETTINGS)
    grab("settings")

    win.close()
    client.shutdown()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
