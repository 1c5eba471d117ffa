"""`hearth quantize --format nvfp4`: the library round trip on the real default model, its quality on a
real text (perplexity, KL against the model as stored), and the command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.checkpoint import inspect
from engine.library import ModelLibrary
from engine.quantize import quantize_model

TEXT = Path(__file__).parent / "data" / "pride_and_prejudice_ch1.txt"


@pytest.fixture(scope="module")
def nvfp4_default(default_model, hearth_home):
    """The default model quantized into the test library, with every progress event it reported."""
    events = []
    manifest = quantize_model(default_model.id, library=ModelLibrary(hearth_home), progress=events.append)
    yield manifest, events
    ModelLibrary(hearth_home).remove(manifest.id)


@pytest.mark.slow
def test_default_model_round_trip(default_model, nvfp4_default, hearth_home):
    manifest, events = nvfp4_default
    library = ModelLibrary(hearth_home)
    assert manifest.id in library.ids() and library.verify(manifest.id)
    assert manifest.quantization == "nvfp4" and manifest.id != default_model.id
    assert events[-1].current_bytes == events[-1].total_bytes > 0
    assert all(a.current_bytes <= b.current_bytes for a, b in zip(events, events[1:]))
    assert not [p for p in library.models_dir.iterdir() if p.name.startswith(".")]   # no staging left
    info, source = inspect(manifest.path), inspect(default_model.path)
    assert info.plan is not None and info.plan.projection_format == "nvfp4"
    assert info.metadata.parameter_count == source.metadata.parameter_count
    # lm_head (tied: the embedding) and the norms stay bf16, byte for byte
    for name in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.3.input_layernorm.weight"):
        assert info.tensor(name).dtype == "BF16" and info.tensor(name).bytes == source.tensor(name).bytes
    assert info.tensor("model.layers.0.mlp.down_proj.weight").dtype == "U8"
    # 106M projection weights at 4.5 bits instead of 16; the 28M embedding unchanged
    assert manifest.bytes < 0.45 * default_model.bytes
    # fused groups carry one global scale, so the engine stacks them with no second rounding
    from engine.nvfp4_checkpoint import pair, read_entry
    from engine.weights import TensorReader

    layer = pair(info).layers[7]
    with TensorReader(info) as reader:
        scales = {r: read_entry(reader, layer[r]).global_scale for r in ("q", "k", "v", "gate", "up")}
    assert scales["q"] == scales["k"] == scales["v"] and scales["gate"] == scales["up"]


@pytest.mark.slow
def test_nvfp4_quality_on_a_real_text(default_model, nvfp4_default):
    """Perplexity on the opening chapter of Pride and Prejudice, and the mean next-token KL against
    the model as stored (its own weights, from the Q4_1 GGUF). Measured at 256 tokens: reference
    18.42, NVFP4 23.13 (+25.6 %), KL 0.211 nats (README has the 512-token figures and the command). The
    5 % target of the issue is not reached by weight-only amax scaling on a 135M model; these bounds
    hold the measured quality so a regression in the quantizer or the reference shows."""
    from engine.tools.quant_quality import mean_kl, perplexity, teacher_forced_logits, token_ids

    manifest, _ = nvfp4_default
    ids = token_ids(default_model.path, TEXT.read_text(encoding="utf-8"), 256)
    assert len(ids) == 256
    reference = teacher_forced_logits(default_model.path, ids)
    quantized = teacher_forced_logits(manifest.path, ids)
    ppl_ref, ppl_q = perplexity(reference, ids), perplexity(quantized, ids)
    kl = mean_kl(reference, quantized)
    print(f"perplexity reference {ppl_ref:.3f} nvfp4 {ppl_q:.3f} ({100 * (ppl_q / ppl_ref - 1):+.1f} %), "
          f"mean KL {kl:.4f} nats")
    assert 10 < ppl_ref < 40                   # the model reads English
    assert ppl_q < 1.32 * ppl_ref
    assert 0.01 < kl < 0.35
    # the greedy next token agrees with the reference at most positions
    agree = (reference.argmax(-1) == quantized.argmax(-1)).mean()
    assert agree > 0.6


def test_quantize_command(synth, tmp_path):
    env = dict(os.environ, HEARTH_HOME=str(tmp_path / "home"))
    folder = synth("tiny", tokenizer=True)
    run = lambda *a: subprocess.run([sys.executable, "-m", "engine", *a], capture_output=True, text=True,
                                    env=env, timeout=300)
    proc = run("quantize", str(folder), "--format", "nvfp4", "--layout", "compressed-tensors", "--id", "tiny-ct")
    assert proc.returncode == 0, proc.stderr
    assert "quantized" in proc.stdout and "tiny-ct" in proc.stdout
    assert "quantizing" in proc.stderr                                   # the progress bar
    listing = json.loads(run("models", "list", "--json").stdout)
    assert [(m["id"], m["quantization"]) for m in listing] == [("tiny-ct", "nvfp4")]
    config = json.loads((Path(listing[0]["path"]) / "config.json").read_text())
    assert config["quantization_config"]["format"] == "nvfp4-pack-quantized"
    shown = run("inspect", listing[0]["path"]).stdout
    assert "nvfp4 projections" in shown and "compressed-tensors, blocks of 16" in shown
    again = run("quantize", "tiny-ct", "--format", "nvfp4")
    assert again.returncode == 1 and "already NVFP4" in again.stderr and "Traceback" not in again.stderr
    out = json.loads(run("generate", "tiny-ct", "--prompt", "the", "--max-tokens", "4", "--temperature", "0",
                         "--backend", "torch", "--json").stdout)
    assert out["stats"]["generated_tokens"] >= 1


def test_a_4bit_gguf_imports_as_nvfp4(tmp_path):
    """`hearth models import X.gguf --nvfp4`: the GGUF's projections kept at 4 bits, as NVFP4, within
    one NVFP4 step of the bf16 import of the same file."""
    import gguf
    from test_gguf_import import write_tiny_gguf

    from engine.backends.base import RunnerOptions
    from engine.backends.torch_ref import TorchRunner
    from engine.quantize import import_gguf_as_nvfp4

    Q = gguf.GGMLQuantizationType
    types = {f"blk.0.{n}.weight": Q.Q4_0 for n in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                    "ffn_gate", "ffn_up", "ffn_down")}
    src = tmp_path / "tiny-q4.gguf"
    write_tiny_gguf(src, types=types)
    library = ModelLibrary(tmp_path / "home")
    dense = library.import_path(src, model_id="tiny-bf16")
    packed = import_gguf_as_nvfp4(src, library=library, model_id="tiny-nvfp4")
    assert packed.quantization == "nvfp4" and packed.bytes < dense.bytes
    assert sorted(library.ids()) == ["tiny-bf16", "tiny-nvfp4"]
    assert not [p for p in library.models_dir.iterdir() if p.name.startswith(".")]
    runners = []
    for m in (dense, packed):
        info = inspect(m.path)
        runners.append(TorchRunner(info, info.plan, RunnerOptions(context_length=16)))
    # Each NVFP4 weight is within one e2m1 step of the bf16 import's, block by block: at most one
    # block-scale unit (block amax / 6), plus the e4m3 rounding of that scale.
    for role in ("q", "k", "v", "o", "gate", "up", "down"):
        a, b = (getattr(r.layers[0], role).numpy() for r in runners)
        blocks = a.reshape(a.shape[0], -1, 16)
        err = np.abs(b - a).reshape(blocks.shape).max(-1)
        assert 0 < err.max() and (err <= np.abs(blocks).max(-1) / 6 * (1 + 2 ** -4) + 1e-7).all(), role
    tokens = [1, 40, 41, 42, 7]
    assert runners[1].score(tokens).shape == (5, runners[0].decoder.vocab_size)
