"""NVFP4 checkpoints end to end on tiny shapes: both layouts inspected, planned, paired, checked, loaded
by the torch reference (against weights dequantized independently, in torch) and read back by the
compressed-tensors package."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, nvfp4
from engine.backends.base import RunnerOptions
from engine.checkpoint import inspect
from engine.errors import CorruptCheckpoint, MissingTensors, UnsupportedArchitecture, UnsupportedTensorType
from engine.quantize import write_nvfp4

LAYOUTS = ("modelopt", "compressed-tensors")
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6])


@pytest.fixture(scope="module")
def made(synth, tmp_path_factory):
    """{layout: folder} of the tiny model quantized, and the bf16 source."""
    src = synth("tiny", tokenizer=True)
    root = tmp_path_factory.mktemp("nvfp4")
    return {"src": src, **{layout: write_nvfp4(src, root / layout, layout) for layout in LAYOUTS}}


def _torch_dequantize(packed: torch.Tensor, block: torch.Tensor, multiplier: float) -> torch.Tensor:
    """An independent dequantizer: torch's own fp8 decode, nibble order as the format defines it."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    scales = block.float().repeat_interleave(16, dim=1)
    return E2M1[codes] * scales * multiplier


def _module_weights(folder: Path, layout: str) -> dict:
    """module name -> float32 weight, dequantized in torch from the checkpoint's own tensors."""
    tensors = load_file(str(folder / "model.safetensors"))
    out = {}
    for name in tensors:
        module, _, leaf = name.rpartition(".")
        if leaf not in ("weight", "weight_packed") or tensors[name].dtype != torch.uint8:
            continue
        if layout == "modelopt":
            mult = tensors[f"{module}.weight_scale_2"].item()
        else:
            mult = 1.0 / tensors[f"{module}.weight_global_scale"].item()
        out[module] = _torch_dequantize(tensors[name], tensors[f"{module}.weight_scale"], mult)
    return out


def _copy(folder: Path, dest: Path, edit_tensors=None, edit_config=None, edit_hf_quant=None) -> Path:
    shutil.copytree(folder, dest)
    if edit_tensors:
        tensors = load_file(str(dest / "model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(dest / "model.safetensors"))
    for name, edit in (("config.json", edit_config), ("hf_quant_config.json", edit_hf_quant)):
        if edit:
            data = json.loads((dest / name).read_text())
            edit(data)
            (dest / name).write_text(json.dumps(data))
    return dest


@pytest.mark.parametrize("layout", LAYOUTS)
def test_both_layouts_inspect_and_plan(made, layout):
    info = inspect(made[layout])
    source = inspect(made["src"])
    assert info.metadata.quantization == "nvfp4"
    assert info.quant_scheme.layout == layout and info.quant_scheme.group_size == 16
    assert "lm_head" in info.quant_scheme.exclusions
    assert info.plan is not None, info.plan_error
    assert (info.plan.archetype, info.plan.projection_format) == ("dense-swiglu", "nvfp4")
    assert info.metadata.parameter_count == source.metadata.parameter_count
    assert not info.catalog.unexpected and not info.catalog.missing
    scales = info.catalog.layers[0].scales
    assert {"q.weight_scale", f"q.{info.quant_scheme.global_scale_name}"} <= set(scales)
    d = info.to_dict()
    by_name = {t["name"]: t for t in d["tensors"]}
    weight = "weight" if layout == "modelopt" else "weight_packed"
    q = by_name[f"model.layers.0.self_attn.q_proj.{weight}"]
    assert q["format"] == "nvfp4" and q["shape"] == [64, 32]
    assert q["bits_per_weight"] == pytest.approx(4.5 + 32 / (64 * 64), abs=1e-3)
    assert by_name["model.layers.0.self_attn.q_proj.weight_scale"]["format"] == "e4m3 block scale"
    assert by_name["model.embed_tokens.weight"]["format"] == "bf16"
    assert d["quantization_scheme"]["layout"] == layout
    # The packed checkpoint is smaller than its source by close to 16 / 4.5 on the projections.
    assert info.weight_bytes < source.weight_bytes


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_backend_runs_the_dequantized_weights(made, layout, tmp_path):
    """The oracle: an NVFP4 model on the torch backend == the same model with its weights dequantized
    independently (torch's fp8 decode) and stored as fp32."""
    from engine.backends.torch_ref import TorchRunner

    folder = made[layout]
    weights = _module_weights(folder, layout)
    assert len(weights) == 2 * len(PROJ)
    dense = {}
    for name, t in load_file(str(folder / "model.safetensors")).items():
        module, _, leaf = name.rpartition(".")
        if module in weights:
            if leaf in ("weight", "weight_packed"):
                dense[f"{module}.weight"] = weights[module].contiguous()
        else:
            dense[name] = t.float()
    ref_dir = tmp_path / "dequantized"
    ref_dir.mkdir()
    save_file(dense, str(ref_dir / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config")
    (ref_dir / "config.json").write_text(json.dumps(config))

    opts = RunnerOptions(context_length=64)
    ours_info, ref_info = inspect(folder), inspect(ref_dir)
    ours = TorchRunner(ours_info, ours_info.plan, opts)
    ref = TorchRunner(ref_info, ref_info.plan, opts)
    tokens = [1, 5, 9, 77, 200, 3, 14]
    np.testing.assert_array_equal(ours.score(tokens), ref.score(tokens))
    assert torch.equal(ours.layers[1].down, weights["model.layers.1.mlp.down_proj"])
    # ...and it is still the model it was quantized from: logits stay near the bf16 source's.
    src_info = inspect(made["src"])
    src = TorchRunner(src_info, src_info.plan, opts)
    a, b = ours.score(tokens), src.score(tokens)
    assert np.abs(a - b).max() < 0.25 * np.abs(b).max()


def test_fused_parts_with_different_global_scales_share_the_largest(made, tmp_path):
    """Parts of a fused slot quantized separately (as other tools write them) are rescaled onto one
    global scale when loaded; the part that already has it is untouched."""
    from engine.backends.torch_ref import TorchRunner

    src = load_file(str(made["src"] / "model.safetensors"))
    parts = {}

    def requantize(tensors):
        for p in ("q_proj", "k_proj", "v_proj"):
            module = f"model.layers.0.self_attn.{p}"
            w = src[f"{module}.weight"].float().numpy() * {"q_proj": 1.0, "k_proj": 3.3, "v_proj": 0.7}[p]
            q = nvfp4.quantize(w)                       # its own global scale
            parts[p] = q
            tensors[f"{module}.weight"] = torch.from_numpy(q.packed.copy())
            tensors[f"{module}.weight_scale"] = torch.from_numpy(q.block_scales.copy()).view(torch.float8_e4m3fn)
            tensors[f"{module}.weight_scale_2"] = torch.tensor(float(q.global_scale), dtype=torch.float32)

    folder = _copy(made["modelopt"], tmp_path / "separate", edit_tensors=requantize)
    info = inspect(folder)
    runner = TorchRunner(info, info.plan, RunnerOptions(context_length=16))
    common = max(q.global_scale for q in parts.values())
    assert common == parts["k_proj"].global_scale
    assert torch.equal(runner.layers[0].k, torch.from_numpy(parts["k_proj"].dequantize()))
    for p, role in (("q_proj", "q"), ("v_proj", "v")):
        expected = nvfp4.with_global_scale(parts[p], common).dequantize()
        assert torch.equal(getattr(runner.layers[0], role), torch.from_numpy(expected))
        # one extra rounding of the block scales, small against the 4-bit step
        diff = np.abs(expected - parts[p].dequantize()).max()
        assert 0 < diff <= np.abs(parts[p].dequantize()).max() * 2 ** -4


def test_compressed_tensors_reads_our_checkpoints(made):
    """Our compressed-tensors checkpoint: its config parses as the package's QuantizationConfig and its
    tensors decompress, with the package, to what we dequantize. Our ModelOpt checkpoint: the package's
    ModelOpt converter turns it into the same."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    from compressed_tensors.quantization import QuantizationConfig

    config = json.loads((made["compressed-tensors"] / "config.json").read_text())["quantization_config"]
    parsed = QuantizationConfig.model_validate(config)
    scheme = parsed.config_groups["group_0"]
    assert parsed.format == "nvfp4-pack-quantized" and parsed.ignore == ["lm_head"]
    assert scheme.input_activations is None and scheme.weights.group_size == 16

    ours = {layout: _module_weights(made[layout], layout) for layout in LAYOUTS}
    ct = load_file(str(made["compressed-tensors"] / "model.safetensors"))
    mo = ModelOptNvfp4Converter(targets=["Linear"]).process(load_file(str(made["modelopt"] / "model.safetensors")))
    for tensors, layout in ((ct, "compressed-tensors"), (mo, "modelopt")):
        for module, expected in ours[layout].items():
            state = {k: tensors[f"{module}.{k}"] for k in ("weight_packed", "weight_scale", "weight_global_scale")}
            theirs = NVFP4PackedCompressor.decompress(state, scheme)["weight"]
            # the package computes in bf16, rounding twice (scale / global scale, then the product)
            torch.testing.assert_close(theirs.float(), expected, rtol=2 ** -7, atol=0)
    # Both layouts hold the same quantized model.
    for module in ours["modelopt"]:
        torch.testing.assert_close(ours["modelopt"][module], ours["compressed-tensors"][module], rtol=3e-7, atol=0)


# --------------------------------------------------------------------------------- malformed scales


def _ct_name(module, leaf):
    return f"model.layers.0.{module}.{leaf}"


@pytest.mark.parametrize("case, error, words", [
    ("block scale shape", CorruptCheckpoint, "needs one block scale per 16 inputs"),
    ("block scale dtype", CorruptCheckpoint, "should hold fp8 e4m3 block scales but is F32"),
    ("no block scale", MissingTensors, "its block scales, is missing"),
    ("no global scale", MissingTensors, "its global scale, is missing"),
    ("global scale dtype", CorruptCheckpoint, "should be one fp32 global scale but is BF16"),
    ("global scale size", CorruptCheckpoint, "holds 2 values"),
    ("weight shape", CorruptCheckpoint, "config.json implies 64 x 64"),
    ("scales beside a bf16 weight", CorruptCheckpoint, "stored as BF16"),
])
def test_malformed_scales_are_typed_errors(made, tmp_path, case, error, words):
    m = "model.layers.0.self_attn.q_proj"

    def edit(t):
        if case == "block scale shape":
            t[f"{m}.weight_scale"] = t[f"{m}.weight_scale"][:, :2].contiguous()
        elif case == "block scale dtype":
            t[f"{m}.weight_scale"] = t[f"{m}.weight_scale"].float()
        elif case == "no block scale":
            del t[f"{m}.weight_scale"]
        elif case == "no global scale":
            del t[f"{m}.weight_scale_2"]
        elif case == "global scale dtype":
            t[f"{m}.weight_scale_2"] = t[f"{m}.weight_scale_2"].bfloat16()
        elif case == "global scale size":
            t[f"{m}.weight_scale_2"] = torch.ones(2)
        elif case == "weight shape":
            t[f"{m}.weight"] = t[f"{m}.weight"][:, :16].contiguous()
            t[f"{m}.weight_scale"] = t[f"{m}.weight_scale"][:, :2].contiguous()
        elif case == "scales beside a bf16 weight":
            t[f"{m}.weight"] = torch.zeros(64, 64, dtype=torch.bfloat16)

    folder = _copy(made["modelopt"], tmp_path / "bad", edit_tensors=edit)
    with pytest.raises(error) as exc:
        inspect(folder)
    assert words in exc.value.message, exc.value.message
    assert "q_proj" in exc.value.message


def test_a_zero_global_scale_is_refused_when_read(made, tmp_path):
    def edit(t):
        t["model.layers.1.mlp.up_proj.weight_global_scale"] = torch.zeros(1)

    folder = _copy(made["compressed-tensors"], tmp_path / "zero", edit_tensors=edit)
    eng = Engine(backend="torch", home=tmp_path / "home")
    with pytest.raises(CorruptCheckpoint, match="must be a positive number"):
        eng.load_model(str(folder))


# --------------------------------------------------------------------------------- schemes we do not run


@pytest.mark.parametrize("layout, edit, words", [
    ("modelopt", lambda q: q["quantization"].update(group_size=32), "groups of 32"),
    ("modelopt", lambda q: q["quantization"].update(kv_cache_quant_algo="FP8"), "KV cache (FP8)"),
    ("modelopt", lambda q: q["quantization"].update(quant_algo="NVFP4_AWQ"), "pre_quant_scale"),
    ("compressed-tensors", lambda c: c["quantization_config"].update(
        kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "tensor"}), "KV cache (8-bit float)"),
    ("compressed-tensors", lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(
        group_size=32), "groups of 32"),
])
def test_unsupported_schemes_have_a_plan_error(made, tmp_path, layout, edit, words):
    kwargs = {"edit_hf_quant": edit} if layout == "modelopt" else {"edit_config": edit}
    folder = _copy(made[layout], tmp_path / "scheme", **kwargs)
    info = inspect(folder)
    assert info.plan is None and words in info.plan_error, info.plan_error
    with pytest.raises(UnsupportedArchitecture, match="Hearth"):
        Engine(backend="torch", home=tmp_path / "home").load_model(str(folder))


def test_w4a4_checkpoint_runs_weight_only(made, tmp_path):
    """A ModelOpt W4A4 checkpoint (input scales present) runs with 16-bit activations."""
    def edit(t):
        for i in range(2):
            for p in PROJ:
                t[f"model.layers.{i}.{p}.input_scale"] = torch.tensor(0.01)

    folder = _copy(made["modelopt"], tmp_path / "w4a4", edit_tensors=edit)
    info = inspect(folder)
    assert info.plan is not None and info.quant_scheme.activations.startswith("nvfp4")
    assert info.tensor_format(info.tensor("model.layers.0.mlp.up_proj.input_scale"))[0] == "input scale (unused)"
    eng = Engine(backend="torch", home=tmp_path / "home")
    eng.load_model(str(folder))


def test_memory_plan_counts_packed_and_dequantized_bytes(made, tmp_path):
    from engine.nvfp4_checkpoint import resident_bytes

    info, src = inspect(made["modelopt"]), inspect(made["src"])
    dense = sum(t.numel for t in src.tensors)
    eng = Engine(backend="torch", home=tmp_path / "home")
    assert eng.memory_plan(str(made["modelopt"])).weight_bytes == dense * 4      # torch holds fp32
    packed = resident_bytes(info, 2, packed=True)
    proj = sum(t.numel for layer in src.catalog.layers for r, t in layer.roles.items()
               if r in ("q", "k", "v", "o", "gate", "up", "down"))
    assert packed == (dense - proj) * 2 + proj // 2 + proj // 16 + 4 * 14


def test_cuda_native_takes_nvfp4_on_every_projection_or_refuses_with_a_reason(made, synth, tmp_path):
    """cuda-native runs NVFP4 projections packed (tests/cuda/test_nvfp4_cuda.py); a checkpoint that
    keeps some layer projections 16-bit (here down_proj, whose 40 inputs are no multiple of 16) is
    refused before any GPU work, naming the layer and the projection."""
    from engine.backends import cuda_native
    from engine.nvfp4_checkpoint import PROJECTIONS

    layers = cuda_native._nvfp4_layers(inspect(made["modelopt"]))
    assert all(set(roles) == set(PROJECTIONS) for roles in layers.layers)
    mixed = write_nvfp4(synth("tiny", tokenizer=True, intermediate_size=40), tmp_path / "mixed")
    with pytest.raises(UnsupportedTensorType, match="Layer 0 keeps down in 16 bits"):
        cuda_native.CudaRunner(inspect(mixed), RunnerOptions(context_length=16))


def test_quantizing_twice_or_a_gguf_is_refused(made, tmp_path):
    with pytest.raises(UnsupportedTensorType, match="already NVFP4"):
        write_nvfp4(made["modelopt"], tmp_path / "again")
    assert not (tmp_path / "again").exists()
