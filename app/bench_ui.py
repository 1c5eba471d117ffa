"""`hearth bench --ui`: how long the GUI event loop stalls while a model loads and a reply streams.

    hearth bench --ui [--home DIR] [--backend torch|cuda-native|auto] [--runs N] [--max-tokens N]

Builds the real window (offscreen unless QT_QPA_PLATFORM says otherwise) over the real engine and
the default model (installed into DIR first if it is not there; default: a temporary home), and
runs a 5 ms QTimer beside it. Each tick's gap past its 5 ms is a stall of the event loop. Prints
p50 / p99 / max of the gaps while loading and while streaming, over --runs loads and replies.
A figure, not a test: the suite only checks that the loop turns (tests/app/test_app_e2e.py).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

INTERVAL_MS = 5
PROMPT = "Explain what a fireplace is, in detail, with a short code example in Python."


def percentile(values: list, q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class Ticks:
    """Every gap between ticks of a 5 ms timer on the GUI thread."""

    def __init__(self):
        from PySide6.QtCore import QTimer

        self.timer = QTimer()
        self.timer.setInterval(INTERVAL_MS)
        self.timer.timeout.connect(self._tick)
        self.last: Optional[float] = None
        self.gaps: list = []

    def _tick(self) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.gaps.append(now - self.last)
        self.last = now

    def start(self) -> None:
        self.last, self.gaps = None, []
        self.timer.start()

    def stop(self) -> list:
        self.timer.stop()
        return list(self.gaps)


def _wait(app, signal, timeout_s: float, accept=lambda *a: True) -> tuple:
    """Turn the event loop until `signal` fires with arguments `accept` takes (or time runs out)."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop, got = QEventLoop(), []

    def fired(*args):
        if accept(*args):
            got.append(args)
            loop.quit()
    signal.connect(fired)
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    loop.exec()
    signal.disconnect(fired)
    if not got:
        raise SystemExit(f"hearth bench --ui: gave up after {timeout_s:.0f} s waiting for {signal}")
    return got[0]


def _row(name: str, gaps: list) -> str:
    ms = [g * 1000 for g in gaps]
    return (f"  {name:<10} {len(ms):>7} ticks   p50 {percentile(ms, 50):7.1f} ms   p99 {percentile(ms, 99):7.1f} ms"
            f"   max {max(ms, default=0):7.1f} ms")


def run(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="hearth bench --ui", description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default=None, help="Hearth home to use (default: a temporary one)")
    parser.add_argument("--backend", default="torch", choices=["auto", "torch", "cuda-native"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(list(argv or []))
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    import app.qtcompat  # noqa: F401
    from PySide6.QtWidgets import QApplication

    from engine.default_model import DEFAULT_MODEL_ID, install_default_model
    from engine.library import ModelLibrary

    home = Path(args.home).expanduser() if args.home else Path(tempfile.mkdtemp(prefix="hearth-bench-ui-"))
    library = ModelLibrary(home)
    if DEFAULT_MODEL_ID not in library:
        print(f"installing the default model into {home} ...", file=sys.stderr)
        install_default_model(library)

    from app.main import build

    qapp = QApplication.instance() or QApplication(["hearth-bench-ui"])
    _, window, client, store = build(["--home", str(home), "--backend", args.backend, "--no-model"], app=qapp)
    window.resize(1400, 900)
    window.show()
    loading, streaming = [], []
    try:
        _wait(qapp, client.done, 600, lambda op, key: op == "start")
        ticks = Ticks()
        for _ in range(args.runs):
            ticks.start()
            window.load_model(DEFAULT_MODEL_ID)
            _wait(qapp, client.loaded, 1200)
            loading += ticks.stop()
            window.new_chat()
            window.side.set_params({"temperature": 0.7, "top_k": 40, "top_p": 0.95,
                                    "max_tokens": args.max_tokens, "seed": 3})
            ticks.start()
            window.send(PROMPT)
            _wait(qapp, client.finished, 1200)
            streaming += ticks.stop()
            client.unload(DEFAULT_MODEL_ID)
            _wait(qapp, client.unloaded, 600)
    finally:
        window.close()
        client.shutdown()
        store.close()
    print(f"hearth bench --ui: event-loop gaps of a {INTERVAL_MS} ms timer, {args.runs} loads and replies of "
          f"{DEFAULT_MODEL_ID} ({args.backend} backend, {args.max_tokens} tokens)")
    print(f"  machine    {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
          f"Python {platform.python_version()}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(_row("loading", loading))
    print(_row("streaming", streaming))
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
