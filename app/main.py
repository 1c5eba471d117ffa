"""Start the app: `python -m app`, or `hearth` with no arguments.

    python -m app                      # load the last model used; with an empty library, install
                                       # and load the small default model first
    python -m app --model ID           # load ID at start
    python -m app --no-model           # start without loading anything
    python -m app --self-test          # start, load the default model (installing it first), print
                                       # how long that took, and quit: 0 when it loaded (the bundle test)
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Optional, Sequence

from . import qtcompat  # noqa: F401  (PySide6 6.12 + Python 3.11 refcount bug)
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hearth", description="Hearth: chat with language models on your own machine.")
    p.add_argument("--model", metavar="ID", help="load this library model at start (the default model is "
                   "installed first if ID is smollm2-135m-instruct)")
    p.add_argument("--no-model", action="store_true", help="start without loading a model")
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "cuda-native"))
    p.add_argument("--home", help="Hearth's data folder (default: $HEARTH_HOME or the user data folder)")
    p.add_argument("--self-test", action="store_true",
                   help="load the default model, print the time from start to loaded, and quit (0: it loaded)")
    return p.parse_args(list(argv))


def settings_for(home) -> QSettings:
    """Settings live beside the chats, so one HEARTH_HOME is one complete profile."""
    return QSettings(str(home / "settings.ini"), QSettings.IniFormat)


def build(argv: Sequence[str], app: Optional[QApplication] = None, engine_factory=None):
    """(app, window, client, store) without entering the event loop: used by main, tests and screenshots."""
    args = parse_args(argv)
    if args.home:
        os.environ["HEARTH_HOME"] = os.path.abspath(os.path.expanduser(args.home))
    from . import theme
    from .store import ChatStore, hearth_home
    from .windows.main_window import MainWindow, app_icon
    from .worker import EngineClient

    if app is None:
        app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "hearth"])
    app.setApplicationName("Hearth")
    app.setOrganizationName("Hearth")
    app.setDesktopFileName("hearth")
    app.setWindowIcon(app_icon())
    theme.apply(app)
    home = hearth_home()
    home.mkdir(parents=True, exist_ok=True)
    store = ChatStore(home / "chats.sqlite3")
    client = EngineClient(engine_factory)
    start = None if args.no_model else (args.model or ("smollm2-135m-instruct" if args.self_test else "auto"))
    window = MainWindow(client, store, settings_for(home), start_model=start)

    def rescheme(*_):
        theme.apply(app)
        window.apply_theme()
    app.styleHints().colorSchemeChanged.connect(rescheme)
    client.start(args.backend, str(home))
    return app, window, client, store


def _self_test(app, window, client, t0: float) -> None:
    """Quit with 0 once the default model is loaded, 1 on the first failure or after 10 minutes."""
    import time
    from PySide6.QtCore import QTimer

    def loaded(handle) -> None:
        print(f"self-test: {handle.id} loaded on {handle.backend} {time.perf_counter() - t0:.1f} s after start",
              flush=True)
        app.exit(0)

    def failed(kind: str, message: str) -> None:
        print(f"self-test: failed ({kind}): {message}", file=sys.stderr, flush=True)
        app.exit(1)
    client.loaded.connect(loaded)
    client.failed.connect(failed)
    QTimer.singleShot(600_000, lambda: failed("timeout", "the default model did not load in 10 minutes"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    import time
    t0 = time.perf_counter()
    level = os.environ.get("HEARTH_LOG", "WARNING").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:   # the terminal gets HEARTH_LOG's level; the Logs page
        handler.setLevel(level)                      # keeps INFO and up whatever it is
    argv = sys.argv[1:] if argv is None else argv
    app, window, client, store = build(argv)
    if parse_args(argv).self_test:
        _self_test(app, window, client, t0)
    signal.signal(signal.SIGINT, lambda *_: window.close())   # Ctrl+C in a terminal closes cleanly
    window.show()
    try:
        return app.exec()
    finally:
        client.shutdown()
        store.close()


if __name__ == "__main__":
    sys.exit(main())
