"""`hearth bench --ui` runs end to end and prints its figures; engine/ still never imports Qt."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_engine_cli_does_not_import_qt():
    code = "import sys, engine.cli, engine.engine; sys.exit('PySide6' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_bench_ui_prints_stalls_while_loading_and_streaming(default_model, hearth_home):
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "bench", "--ui", "--runs", "1", "--max-tokens", "4",
                           "--home", str(hearth_home)], capture_output=True, text=True, cwd=REPO, timeout=1800,
                          env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if "ticks" in line}
    assert set(rows) == {"loading", "streaming"}, proc.stdout
    for line in rows.values():
        assert "p50" in line and "p99" in line and "max" in line
