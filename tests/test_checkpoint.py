"""Inspection reads headers only and explains every bad input."""
import json
import shutil
import struct

import pytest

from engine import errors
from engine.checkpoint import inspect
from engine.plan import MemoryPlan


def test_inspect_smollm2_shape(synth):
    info = inspect(synth("smollm2-135m"))
    m, d = info.metadata, info.decoder
    assert (m.architecture, d.num_layers, d.num_heads, d.num_kv_heads, d.hidden_size) == ("LlamaForCausalLM", 30, 9, 3, 576)
    assert m.parameter_count == 134_515_008
    assert m.tied_embeddings and m.quantization == "bf16"
    assert info.plan.archetype == "dense-swiglu" and info.plan.attention == "grouped-query"
    assert len(info.tensors) == 272 and not info.catalog.missing and not info.catalog.unexpected
    assert json.loads(json.dumps(info.to_dict()))["metadata"]["parameter_count"] == 134_515_008
    t = info.tensor("model.layers.3.mlp.down_proj.weight")
    assert t.shape == (576, 1536) and t.dtype == "BF16" and t.bytes == 576 * 1536 * 2


def test_tensor_offsets_point_at_the_data(synth):
    from safetensors.numpy import load_file

    folder = synth("tiny", dtype="fp32")
    info = inspect(folder)
    arrays = load_file(str(folder / "model.safetensors"))
    raw = (folder / "model.safetensors").read_bytes()
    for t in info.tensors:
        assert raw[t.offset:t.offset + t.bytes] == arrays[t.name].tobytes()


@pytest.mark.parametrize("shape,attention,bias", [
    ("tiny-qwen3", "rms-normalized-grouped-query", False),
    ("tiny-qwen2", "grouped-query", True),
    ("tiny-llama3", "grouped-query", False),
    ("tiny-mistral", "grouped-query", False),
])
def test_families_plan(synth, shape, attention, bias):
    info = inspect(synth(shape))
    assert info.plan.attention == attention and info.plan.qkv_bias == bias
    if shape == "tiny-llama3":
        assert info.plan.rope_scaling == "llama3" and info.decoder.rope_scaling["factor"] == 8.0
        assert not info.metadata.tied_embeddings


def test_sharded_checkpoint(synth, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = synth("tiny")
    tensors = {}
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    names = sorted(tensors)
    half = len(names) // 2
    save_file({k: tensors[k] for k in names[:half]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[half:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    wmap = {k: "model-00001-of-00002.safetensors" if i < half else "model-00002-of-00002.safetensors"
            for i, k in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    shutil.copy(src / "config.json", tmp_path)
    info = inspect(tmp_path)
    assert {t.file for t in info.tensors} == set(wmap.values())
    assert info.metadata.parameter_count == inspect(src).metadata.parameter_count
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(errors.CorruptCheckpoint, match="shard model-00002-of-00002.safetensors"):
        inspect(tmp_path)


def test_moe_plan_from_headers(tmp_path):
    """A Qwen3-MoE layout plans as mixture-of-experts without any weights being read."""
    from safetensors.numpy import save_file
    import numpy as np

    cfg = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=16, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=32,
               moe_intermediate_size=8, num_experts=2, num_experts_per_tok=1, vocab_size=32,
               tie_word_embeddings=True)
    z = lambda *s: np.full(s, 0.5, dtype=np.float32)
    t = {"model.embed_tokens.weight": z(32, 16), "model.norm.weight": z(16)}
    p = "model.layers.0."
    t.update({p + "input_layernorm.weight": z(16), p + "post_attention_layernorm.weight": z(16),
              p + "self_attn.q_proj.weight": z(16, 16), p + "self_attn.k_proj.weight": z(8, 16),
              p + "self_attn.v_proj.weight": z(8, 16), p + "self_attn.o_proj.weight": z(16, 16),
              p + "self_attn.q_norm.weight": z(8), p + "self_attn.k_norm.weight": z(8), p + "mlp.gate.weight": z(2, 16)})
    for e in range(2):
        for name, shape in (("gate_proj", (8, 16)), ("up_proj", (8, 16)), ("down_proj", (16, 8))):
            t[f"{p}mlp.experts.{e}.{name}.weight"] = z(*shape)
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    info = inspect(tmp_path)
    assert info.plan.archetype == "moe" and info.plan.attention == "rms-normalized-grouped-query"
    assert info.decoder.num_experts == 2 and info.catalog.role_counts()["expert_gate"] == 2


def test_memory_plan_fits_and_advises():
    from engine.checkpoint import decoder_config_from_hf
    from engine.tools.synth import SHAPES

    decoder = decoder_config_from_hf(SHAPES["llama3.2-1b"])
    weight_bytes = 1_235_814_400 * 2
    plan = MemoryPlan.for_model(decoder, weight_bytes, context_length=131072)
    assert plan.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2
    assert plan.fits(plan.total_bytes).ok
    report = plan.fits(plan.weight_bytes + plan.workspace_bytes + 100 * 1024 * 1024)
    assert not report.ok and "reduce the context to" in report.message
    context = plan.max_context_for(plan.weight_bytes + plan.workspace_bytes + 100 * 1024 * 1024)
    assert MemoryPlan.for_model(decoder, weight_bytes, context).fits(
        plan.weight_bytes + plan.workspace_bytes + 100 * 1024 * 1024).ok
    tiny = plan.fits(plan.weight_bytes // 2)
    assert not tiny.ok and "weights alone" in tiny.message


# ------------------------------------------------------------------------------------------ bad input

def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_path_missing(tmp_path):
    with pytest.raises(errors.CheckpointNotFound, match="Nothing exists"):
        inspect(tmp_path / "nope")


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(errors.NotACheckpoint, match="no config.json and no .safetensors"):
        inspect(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(errors.NotACheckpoint, match="neither"):
        inspect(tmp_path / "notes.txt")


def test_no_config(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    (folder / "config.json").unlink()
    with pytest.raises(errors.MissingConfig, match="no config.json"):
        inspect(folder)


def test_config_without_weights(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    (folder / "model.safetensors").unlink()
    with pytest.raises(errors.NotACheckpoint, match="no .safetensors weights"):
        inspect(folder)


def test_truncated_safetensors(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(errors.CorruptCheckpoint, match="is truncated"):
        inspect(folder)
    f.write_bytes(b"\x01\x02")
    with pytest.raises(errors.CorruptCheckpoint, match="too short for a header"):
        inspect(folder)


def test_header_length_beyond_file(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    f = folder / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[:8] = struct.pack("<Q", len(raw) * 4)
    f.write_bytes(bytes(raw))
    with pytest.raises(errors.CorruptCheckpoint, match="header claims"):
        inspect(folder)


def _rewrite_header(f, edit):
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (-len(new) % 8)
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def test_offsets_beyond_file(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    f = folder / "model.safetensors"

    def push_out(h):
        entry = h["model.norm.weight"]
        size = entry["data_offsets"][1] - entry["data_offsets"][0]
        entry["data_offsets"] = [10**9, 10**9 + size]

    _rewrite_header(f, push_out)
    with pytest.raises(errors.CorruptCheckpoint, match="model.norm.weight ends at byte"):
        inspect(folder)


def test_dtype_disagrees_with_header_size(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    _rewrite_header(folder / "model.safetensors", lambda h: h["model.norm.weight"].update(dtype="F32"))
    with pytest.raises(errors.CorruptCheckpoint, match="needs 256 bytes, but the header gives it 128"):
        inspect(folder)


def test_malformed_header(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    f = folder / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[8:12] = b"\xff\xfe{["
    f.write_bytes(bytes(raw))
    with pytest.raises(errors.CorruptCheckpoint, match="malformed header"):
        inspect(folder)


def test_shape_disagrees_with_config(synth, tmp_path):
    from engine import Engine

    folder = _copy(synth("tiny"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 192
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(errors.CorruptCheckpoint, match=r"gate_proj.weight has shape \[160, 64\], but config.json implies \[192, 64\]"):
        Engine(backend="torch", home=tmp_path / "home").load_model(folder)


def test_missing_tensors(synth, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = _copy(synth("tiny"), tmp_path / "m")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        kept = {k: f.get_tensor(k) for k in f.keys() if "layers.1.self_attn.k_proj" not in k}
    save_file(kept, str(folder / "model.safetensors"))
    info = inspect(folder)
    assert info.plan is None and "layer 1: k" in info.plan_error
    assert "layer 1: k" in info.catalog.missing
    from engine import Engine

    with pytest.raises(errors.UnsupportedArchitecture, match="lacks 1 tensor"):
        Engine(backend="torch", home=tmp_path / "home").load_model(folder)


def test_unsupported_architecture(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    info = inspect(folder)
    assert info.plan is None
    assert "GPT2LMHeadModel is not supported" in info.plan_error and "LlamaForCausalLM" in info.plan_error


def test_gated_delta_is_named(synth, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file
    import torch

    folder = _copy(synth("tiny"), tmp_path / "m")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["model.layers.0.linear_attn.in_proj_qkvz.weight"] = torch.randn(8, 64, dtype=torch.bfloat16)
    save_file(tensors, str(folder / "model.safetensors"))
    info = inspect(folder)
    assert info.plan is None and "gated-delta linear attention" in info.plan_error


def test_unsupported_tensor_type(synth, tmp_path):
    folder = _copy(synth("tiny"), tmp_path / "m")
    f = folder / "model.safetensors"
    _rewrite_header(f, lambda h: h.update({"extra": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}))
    with pytest.raises(errors.UnsupportedTensorType, match="extra has dtype Q4"):
        inspect(folder)


def test_int8_weights_refused_at_load(synth, tmp_path):
    from engine import Engine

    folder = _copy(synth("tiny"), tmp_path / "m")
    _rewrite_header(folder / "model.safetensors",
                    lambda h: h["model.layers.0.mlp.up_proj.weight"].update(dtype="I8", shape=[160, 128]))
    with pytest.raises(errors.UnsupportedTensorType, match="up_proj.weight is I8"):
        Engine(backend="torch", home=tmp_path / "home").load_model(folder)
