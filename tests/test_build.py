"""The extension builds without nvcc, CPU-only, and says so instead of failing."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_cpu_only_build_without_nvcc(tmp_path):
    cmake = shutil.which("cmake")
    ninja = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")
    if not cmake or not Path(ninja).exists():
        pytest.skip("cmake or ninja missing")
    bin_dir = tmp_path / "bin"          # a PATH with cmake and ninja but no nvcc
    bin_dir.mkdir()
    (bin_dir / "cmake").symlink_to(cmake)
    (bin_dir / "ninja").symlink_to(ninja)
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    import pybind11

    build = tmp_path / "build"
    configure = subprocess.run([cmake, "-S", str(ROOT / "native"), "-B", str(build), "-G", "Ninja",
                                f"-DPython_EXECUTABLE={sys.executable}", f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"],
                               env=env, capture_output=True, text=True, timeout=300)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    assert "building the CPU-only extension" in configure.stdout
    built = subprocess.run([cmake, "--build", str(build)], env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    probe = subprocess.run([sys.executable, "-c", "import _native, json; print(json.dumps(_native.build_info()))"],
                           cwd=build, capture_output=True, text=True, timeout=60)
    import json

    info = json.loads(probe.stdout)
    assert info["cuda_compiled"] is False and info["device_count"] == 0
    assert "no CUDA code" in info["reason"]
