"""The `hearth` command line, run as a user would run it."""
import json
import subprocess
import sys

import pytest


def hearth(*args, env=None, check=True):
    proc = subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, env=env, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return proc


def test_inspect_json(synth):
    out = hearth("inspect", str(synth("tiny-qwen3")), "--json").stdout
    info = json.loads(out)
    assert info["plan"]["attention"] == "rms-normalized-grouped-query"
    assert info["decoder"]["qk_norm"] is True and len(info["tensors"]) == 24


def test_inspect_text(synth):
    out = hearth("inspect", str(synth("smollm2-135m"))).stdout
    assert "134,515,008" in out and "dense-swiglu" in out


def test_inspect_reports_errors_plainly(tmp_path):
    proc = hearth("inspect", str(tmp_path / "missing"), check=False)
    assert proc.returncode == 1 and "hearth: Nothing exists at" in proc.stderr and "Traceback" not in proc.stderr


def test_generate_json_and_models(synth, tmp_path):
    import os

    env = dict(os.environ, HEARTH_HOME=str(tmp_path / "home"))
    folder = synth("tiny", tokenizer=True)
    out = hearth("generate", str(folder), "--prompt", "the", "--max-tokens", "6", "--temperature", "0",
                 "--backend", "torch", "--json", env=env).stdout
    result = json.loads(out)
    assert result["backend"] == "torch" and result["stats"]["generated_tokens"] <= 6
    imported = hearth("models", "import", str(folder), env=env).stdout
    assert "imported" in imported
    listing = json.loads(hearth("models", "list", "--json", env=env).stdout)
    assert len(listing) == 1 and listing[0]["architecture"] == "LlamaForCausalLM"
    model_id = listing[0]["id"]
    again = json.loads(hearth("generate", model_id, "--prompt", "the", "--max-tokens", "6", "--temperature", "0",
                              "--backend", "torch", "--json", env=env).stdout)
    assert again["text"] == result["text"]
    hearth("models", "remove", model_id, env=env)
    assert json.loads(hearth("models", "list", "--json", env=env).stdout) == []


def test_chat_in_terminal(synth, tmp_path):
    import os

    env = dict(os.environ, HEARTH_HOME=str(tmp_path / "home"))
    proc = subprocess.run([sys.executable, "-m", "engine", "chat", str(synth("tiny", tokenizer=True)), "--backend",
                           "torch", "--max-tokens", "5", "--temperature", "0"], input="hello\nagain\n\n",
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("assistant>") == 2 and "tok/s" in proc.stdout


def test_build_info_never_crashes_without_a_gpu():
    from engine import _native

    info = _native.build_info()
    assert set(info) >= {"cuda_compiled", "cuda_runtime_version", "device_count"}
    if info["device_count"] == 0:
        assert info["reason"]


def test_auto_backend_falls_back_to_torch_with_a_reason():
    from engine import Engine
    from engine import _native

    eng = Engine(backend="auto")
    if _native.build_info()["device_count"] == 0:
        assert eng.backend == "torch" and "using the torch backend" in eng.backend_note


def test_models_default_prints_the_installed_path(default_model, hearth_home):
    import os

    env = dict(os.environ, HEARTH_HOME=str(hearth_home))
    out = hearth("models", "default", env=env).stdout.strip()
    assert out == str(default_model.path)


def test_bench_without_a_gpu_says_why():
    from engine import _native

    if _native.build_info()["device_count"] > 0:
        pytest.skip("a GPU is present")
    proc = hearth("bench", "--shape", "tiny", check=False)
    assert proc.returncode == 1
    assert "cannot run here" in proc.stderr and "Traceback" not in proc.stderr

