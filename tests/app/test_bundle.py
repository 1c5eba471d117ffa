"""The double-click bundle (`make bundle`, PyInstaller one-folder): started headless, it loads the default model.

Runs only where a bundle has been built (dist/hearth/hearth, or the path in HEARTH_BUNDLE): a clean
clone in CI has none, so the suite stays as fast as it was.
"""
import os
import subprocess
from pathlib import Path

import pytest

BUNDLE = Path(os.environ.get("HEARTH_BUNDLE") or Path(__file__).resolve().parents[2] / "dist" / "hearth" / "hearth")

pytestmark = pytest.mark.skipif(not BUNDLE.exists(), reason=f"no bundle at {BUNDLE} (build one with `make bundle`)")


def test_the_bundle_starts_headless_and_loads_the_default_model(tmp_path):
    # Nothing from this checkout or its virtual environment: only what the bundle carries.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen",
           "HEARTH_HOME": str(tmp_path / "home"), "LANG": "C.UTF-8"}
    proc = subprocess.run([str(BUNDLE), "--self-test", "--backend", "torch"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "self-test: smollm2-135m-instruct loaded on torch" in proc.stdout
    assert (tmp_path / "home" / "models" / "smollm2-135m-instruct").is_dir()   # installed from the bundle's copy
