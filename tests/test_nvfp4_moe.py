"""NVFP4 mixture-of-experts checkpoints on the CPU: the four tiny MoE families written by
`engine.tools.synth --nvfp4` in both layouts (experts, attention, dense-layer MLPs and the shared expert
NVFP4; routers, shared_expert_gate, embedding, lm_head and norms 16-bit), inspected, planned, paired,
checked and run by the torch reference, against the same weights dequantized independently (torch's
own fp8 decode) and stored as fp32, and against transformers in fp32 on those weights."""
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
from engine.backends.torch_ref import load_runner
from engine.checkpoint import inspect
from engine.errors import CorruptCheckpoint, MissingTensors, UnsupportedArchitecture
from engine.nvfp4_checkpoint import pair, read_entry, read_experts, read_layer, resident_bytes
from engine.tools.synth import write_checkpoint
from engine.weights import TensorReader

MOE_SHAPES = ["tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-mixtral", "tiny-olmoe"]
LAYOUTS = ("modelopt", "compressed-tensors")
E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6])
SCALE_LEAVES = ("weight_scale", "weight_scale_2", "weight_global_scale", "input_scale", "input_global_scale")


@pytest.fixture(scope="module")
def nvfp4_moe(tmp_path_factory):
    """nvfp4_moe(shape, layout, seed=3, **config overrides) -> an NVFP4 checkpoint folder (cached)."""
    made: dict = {}

    def make(shape, layout="modelopt", seed=3, **overrides):
        key = (shape, layout, seed, tuple(sorted(overrides.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"{shape}-{layout}")
            made[key] = write_checkpoint(shape, out, seed=seed, device="cpu", nvfp4=layout, overrides=overrides)
        return made[key]

    return make


def _torch_dequantize(packed: torch.Tensor, block: torch.Tensor, multiplier: float) -> torch.Tensor:
    """An independent dequantizer: torch's own fp8 decode, nibble order as the format defines it."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    return E2M1[codes] * block.float().repeat_interleave(16, dim=1) * multiplier


def _module_weights(folder: Path) -> dict:
    """module name -> float32 weight of every packed NVFP4 tensor, dequantized in torch."""
    tensors = load_file(str(folder / "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf not in ("weight", "weight_packed") or t.dtype != torch.uint8:
            continue
        if f"{module}.weight_scale_2" in tensors:
            multiplier = tensors[f"{module}.weight_scale_2"].item()
        else:
            multiplier = 1.0 / tensors[f"{module}.weight_global_scale"].item()
        out[module] = _torch_dequantize(t, tensors[f"{module}.weight_scale"], multiplier)
    return out


def _dequantized_checkpoint(folder: Path, dest: Path) -> Path:
    """The same model as a plain fp32 checkpoint: NVFP4 weights dequantized, scales dropped, the rest
    widened; config.json without its quantization_config."""
    weights = _module_weights(folder)
    dense = {}
    for name, t in load_file(str(folder / "model.safetensors")).items():
        module, _, leaf = name.rpartition(".")
        if module in weights and leaf in ("weight", "weight_packed"):
            dense[f"{module}.weight"] = weights[module].contiguous()
        elif module not in weights or leaf not in SCALE_LEAVES:        # biases stay
            dense[name] = t.float()
    dest.mkdir(parents=True, exist_ok=True)
    save_file(dense, str(dest / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config")
    config["torch_dtype"] = "float32"
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _copy(folder: Path, dest: Path, edit_tensors=None) -> Path:
    shutil.copytree(folder, dest)
    if edit_tensors:
        tensors = load_file(str(dest / "model.safetensors"))
        edit_tensors(tensors)
        save_file(tensors, str(dest / "model.safetensors"))
    return dest


def _rel(a, b) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def _expert_names(folder: Path, layer: int, expert: int) -> dict:
    """role -> module name of one expert (Mixtral: w1 / w3 / w2)."""
    if json.loads((folder / "config.json").read_text())["model_type"] == "mixtral":
        block = f"model.layers.{layer}.block_sparse_moe.experts.{expert}."
        return {"gate": block + "w1", "up": block + "w3", "down": block + "w2"}
    block = f"model.layers.{layer}.mlp.experts.{expert}."
    return {r: block + f"{r}_proj" for r in ("gate", "up", "down")}


# --------------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", MOE_SHAPES)
def test_nvfp4_moe_runs_as_its_dequantized_weights_and_as_transformers(nvfp4_moe, shape, layout, tmp_path):
    """The torch reference on the NVFP4 checkpoint == the torch reference on the same weights dequantized
    independently and stored fp32 (bit for bit), and within 1e-5 of transformers in fp32 on them (the bar
    tests/test_moe.py holds the 16-bit MoE reference to)."""
    transformers = pytest.importorskip("transformers")
    folder = nvfp4_moe(shape, layout)
    info = inspect(folder)
    assert info.plan is not None, info.plan_error
    assert (info.plan.archetype, info.plan.projection_format) == ("moe", "nvfp4")
    assert info.quant_scheme.layout == layout and not info.catalog.unexpected and not info.catalog.missing
    ref_dir = _dequantized_checkpoint(folder, tmp_path / "dequantized")
    ref_info = inspect(ref_dir)
    # logical counts: the NVFP4 checkpoint has exactly the parameters of its dequantized twin
    assert (info.plan.parameters, info.plan.active_parameters) == (ref_info.plan.parameters,
                                                                   ref_info.plan.active_parameters)
    assert info.metadata.parameter_count == ref_info.metadata.parameter_count == info.plan.parameters

    opts = RunnerOptions(context_length=256)
    ours, ref = load_runner(info, info.plan, opts), load_runner(ref_info, ref_info.plan, opts)
    ids = np.random.RandomState(11).randint(0, info.decoder.vocab_size, 120).tolist()
    logits = ours.score(ids)
    np.testing.assert_array_equal(logits, ref.score(ids))

    # the resident experts are the dequantized tensors, stacked gate rows then up rows (moe_gate_up)
    weights = _module_weights(folder)
    moe_layer = next(i for i in range(info.decoder.num_layers) if info.decoder.moe.is_moe_layer(i))
    names = _expert_names(folder, moe_layer, 1)
    w = ours.layers[moe_layer].moe
    assert torch.equal(w.gate_up[1], torch.cat([weights[names["gate"]], weights[names["up"]]]))
    if names["down"] in weights:
        assert torch.equal(w.down[1], weights[names["down"]])
    else:       # tiny-olmoe: 48 inputs, no multiple of 32, so synth keeps the down projections 16-bit
        assert shape == "tiny-olmoe" and info.quant_scheme.excludes(names["down"])
    if info.decoder.moe.has_shared_expert:
        shared = f"model.layers.{moe_layer}.mlp.shared_expert"
        assert torch.equal(w.shared_up, weights[f"{shared}.up_proj"])
        assert torch.equal(w.shared_down, weights[f"{shared}.down_proj"])

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    assert sum(p.numel() for p in hf.parameters()) == info.plan.parameters
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0].numpy()
    rel = _rel(logits, theirs)
    print(f"\n{shape} {layout}: NVFP4 reference vs transformers fp32 on the dequantized weights: {rel:.2e}")
    assert rel <= 1e-5
    ours.close()
    ref.close()


def test_nvfp4_moe_prefill_in_pieces_and_decode_give_the_teacher_forced_logits(nvfp4_moe):
    info = inspect(nvfp4_moe("tiny-qwen2-moe", "compressed-tensors"))
    runner = load_runner(info, info.plan, RunnerOptions(context_length=128))
    ids = np.random.RandomState(5).randint(0, info.decoder.vocab_size, 90).tolist()
    forced = runner.score(ids)
    seq = runner.allocate_sequence()
    runner.prefill(seq, ids[:33])
    runner.prefill(seq, ids[33:89])
    runner.decode([seq], [ids[89]])
    assert np.abs(runner.last_logits()[0] - forced[-1]).max() < 1e-4


def test_nvfp4_moe_in_bfloat16_compute_is_close(nvfp4_moe):
    """The dequantized experts in bfloat16 compute stay as close to fp32 as the 16-bit MoE reference
    does (tests/test_moe.py's bar)."""
    info = inspect(nvfp4_moe("tiny-mixtral", "modelopt"))
    ids = list(range(1, 80))
    fp32 = load_runner(info, info.plan, RunnerOptions(context_length=96)).score(ids)
    bf16 = load_runner(info, info.plan, RunnerOptions(context_length=96, compute_dtype="bfloat16")).score(ids)
    assert _rel(bf16, fp32) < 3e-2


# --------------------------------------------------------------------------------- reading


def test_read_experts_gives_every_expert_its_three_projections(nvfp4_moe):
    """What the native loader receives: NvFp4Layers.experts[i] = {e: {role: NvFp4Entry}} for MoE layers,
    {} for dense ones, and read_experts -> {e: {role: NvFp4Tensor}} in the resident layout."""
    info = inspect(nvfp4_moe("tiny-qwen3-moe"))          # layers 0 and 2 route, layer 1 is dense
    layers = pair(info)
    assert [bool(x) for x in layers.experts] == [True, False, True]
    assert set(layers.layers[1]) == {"q", "k", "v", "o", "gate", "up", "down"}
    assert set(layers.layers[0]) == {"q", "k", "v", "o"}
    assert sorted(layers.experts[2]) == list(range(8))
    assert layers.count == 3 * 4 + 3 + 2 * 8 * 3
    with TensorReader(info) as reader:
        experts = read_experts(reader, layers.experts[2])
    assert sorted(experts) == list(range(8))
    for tensors in experts.values():
        assert {r: t.shape for r, t in tensors.items()} == {"gate": (32, 64), "up": (32, 64), "down": (64, 32)}
        assert tensors["gate"].block_scales.shape == (32, 4) and tensors["down"].packed.shape == (64, 16)
        assert tensors["gate"].global_scale == tensors["up"].global_scale == np.float32(7e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_experts_gate_and_up_share_the_larger_global_scale(nvfp4_moe, tmp_path, layout):
    """An expert whose gate and up were quantized with different global scales (as tools that quantize
    each Linear on its own write them) is brought onto the larger one: the part with it is untouched,
    the other's block scales are rescaled once. The shared expert's gate / up fuse the same way."""
    folder = nvfp4_moe("tiny-qwen2-moe", layout)
    glob = "weight_scale_2" if layout == "modelopt" else "weight_global_scale"
    expert = "model.layers.3.mlp.experts.4."
    shared = "model.layers.1.mlp.shared_expert."

    def scale_up(tensors):
        for module, factor in ((expert + "up_proj", 3.3), (shared + "gate_proj", 0.7)):
            # the same codes against a larger (smaller) multiplier: a different weight, honestly stored
            value = tensors[f"{module}.{glob}"]
            tensors[f"{module}.{glob}"] = value * factor if layout == "modelopt" else value / factor

    edited = inspect(_copy(folder, tmp_path / "separate", edit_tensors=scale_up))
    layers = pair(edited)
    with TensorReader(edited) as reader:
        moe = read_experts(reader, layers.experts[3])[4]
        own = read_layer(reader, layers.layers[1])
        alone = {role: read_entry(reader, layers.experts[3][4][role]) for role in ("gate", "up")}
        alone.update({role: read_entry(reader, layers.layers[1][role]) for role in ("shared_gate", "shared_up")})
    for fused, big, small in ((moe, "up", "gate"), (own, "shared_up", "shared_gate")):
        assert alone[big].global_scale > alone[small].global_scale
        np.testing.assert_array_equal(fused[big].block_scales, alone[big].block_scales)     # the larger: untouched
        assert fused[small].global_scale == fused[big].global_scale == alone[big].global_scale
        expected = nvfp4.with_global_scale(alone[small], alone[big].global_scale)
        np.testing.assert_array_equal(fused[small].block_scales, expected.block_scales)
        np.testing.assert_array_equal(fused[small].packed, alone[small].packed)          # codes kept
        diff = np.abs(fused[small].dequantize() - alone[small].dequantize()).max()
        assert 0 < diff <= np.abs(alone[small].dequantize()).max() * 2 ** -4     # one more rounding of the scales
    assert moe["down"].global_scale == alone["gate"].global_scale                 # down keeps its own
    # the torch reference holds exactly these rescaled parts
    runner = load_runner(edited, edited.plan, RunnerOptions(context_length=16))
    gate_up = runner.layers[3].moe.gate_up[4]
    assert torch.equal(gate_up, torch.from_numpy(np.concatenate([moe["gate"].dequantize(), moe["up"].dequantize()])))
    assert torch.equal(runner.layers[1].moe.shared_gate, torch.from_numpy(own["shared_gate"].dequantize()))
    assert torch.equal(runner.layers[1].moe.shared_up, torch.from_numpy(alone["shared_up"].dequantize()))


# --------------------------------------------------------------------------------- malformed


EXPERT = "model.layers.2.mlp.experts.5"


@pytest.mark.parametrize("case, layout, error, words", [
    ("expert block scale missing", "modelopt", MissingTensors, "experts.5.up_proj.weight_scale, its block scales, is missing"),
    ("expert global scale missing", "compressed-tensors", MissingTensors,
     "experts.5.up_proj.weight_global_scale, its global scale, is missing"),
    ("expert block scale shape", "modelopt", CorruptCheckpoint, "needs one block scale per 16 inputs: [32, 4]"),
    ("expert block scale dtype", "compressed-tensors", CorruptCheckpoint, "should hold fp8 e4m3 block scales but is BF16"),
    ("expert global scale dtype", "modelopt", CorruptCheckpoint, "should be one fp32 global scale but is F16"),
    ("expert weight dtype", "modelopt", CorruptCheckpoint, "has NVFP4 scales beside it but is stored as BF16"),
    ("expert weight shape", "compressed-tensors", CorruptCheckpoint,
     "config.json implies 32 x 64 for the up projection of expert 5"),
])
def test_malformed_expert_scales_are_typed_errors(nvfp4_moe, tmp_path, case, layout, error, words):
    glob = "weight_scale_2" if layout == "modelopt" else "weight_global_scale"
    weight = "weight" if layout == "modelopt" else "weight_packed"
    m = f"{EXPERT}.up_proj"

    def edit(t):
        if case == "expert block scale missing":
            del t[f"{m}.weight_scale"]
        elif case == "expert global scale missing":
            del t[f"{m}.{glob}"]
        elif case == "expert block scale shape":
            t[f"{m}.weight_scale"] = t[f"{m}.weight_scale"][:, :2].contiguous()
        elif case == "expert block scale dtype":
            t[f"{m}.weight_scale"] = t[f"{m}.weight_scale"].float().bfloat16()
        elif case == "expert global scale dtype":
            t[f"{m}.{glob}"] = t[f"{m}.{glob}"].half()
        elif case == "expert weight dtype":
            t[f"{m}.{weight}"] = torch.zeros(32, 64, dtype=torch.bfloat16)
        elif case == "expert weight shape":      # 48 rows, not moe_intermediate_size's 32
            t[f"{m}.{weight}"] = torch.zeros(48, 32, dtype=torch.uint8)
            t[f"{m}.weight_scale"] = torch.zeros(48, 4, dtype=torch.float8_e4m3fn)

    folder = _copy(nvfp4_moe("tiny-qwen3-moe", layout), tmp_path / "bad", edit_tensors=edit)
    with pytest.raises(error) as exc:
        inspect(folder)
    assert words in exc.value.message, exc.value.message
    assert "experts.5" in exc.value.message


def test_a_malformed_shared_expert_scale_is_a_typed_error(nvfp4_moe, tmp_path):
    def edit(t):
        t["model.layers.3.mlp.shared_expert.down_proj.weight_scale"] = \
            t["model.layers.3.mlp.shared_expert.down_proj.weight_scale"][:3].contiguous()

    folder = _copy(nvfp4_moe("tiny-qwen2-moe"), tmp_path / "bad", edit_tensors=edit)
    with pytest.raises(CorruptCheckpoint, match=r"shared_expert.down_proj.weight_scale has shape \[3, 6\]"):
        inspect(folder)


def _quantize_module(tensors: dict, module: str, layout: str) -> None:
    """Replace a 16-bit module's weight with its NVFP4 form, in the layout's names."""
    q = nvfp4.quantize(tensors.pop(f"{module}.weight").float().numpy())
    weight, glob = ("weight", "weight_scale_2") if layout == "modelopt" else ("weight_packed", "weight_global_scale")
    tensors[f"{module}.{weight}"] = torch.from_numpy(q.packed.copy())
    tensors[f"{module}.weight_scale"] = torch.from_numpy(q.block_scales.copy()).view(torch.float8_e4m3fn)
    value = float(q.global_scale) if layout == "modelopt" else 1.0 / float(q.global_scale)
    tensors[f"{module}.{glob}"] = torch.tensor(value if layout == "modelopt" else [value], dtype=torch.float32)


@pytest.mark.parametrize("shape, module, words", [
    ("tiny-qwen3-moe", "model.layers.2.mlp.gate", "quantizes the router of layer 2 (model.layers.2.mlp.gate"),
    ("tiny-mixtral", "model.layers.0.block_sparse_moe.gate", "quantizes the router of layer 0"),
    ("tiny-qwen2-moe", "model.layers.1.mlp.shared_expert_gate", "shared expert's sigmoid gate of layer 1"),
])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_quantized_router_is_refused_with_a_reason(nvfp4_moe, tmp_path, shape, module, words, layout):
    """Real NVFP4 MoE checkpoints keep routers 16-bit; one that packs a router (here quantized for real,
    routes and all) is inspected, but not planned, and a load says why."""
    folder = _copy(nvfp4_moe(shape, layout), tmp_path / "router",
                   edit_tensors=lambda t: _quantize_module(t, module, layout))
    info = inspect(folder)
    assert info.plan is None and words in info.plan_error, info.plan_error
    assert "16-bit routers" in info.plan_error
    with pytest.raises(UnsupportedArchitecture, match="16-bit routers"):
        Engine(backend="torch", home=tmp_path / "home").load_model(str(folder))


# --------------------------------------------------------------------------------- plan, memory, inspector


def test_plan_names_nvfp4_experts_and_counts_logical_parameters(nvfp4_moe, synth):
    for shape, block in [
        ("tiny-qwen3-moe", "MoE SwiGLU, 8 NVFP4 experts, top-2 (renormalised), 2 of 3 layers (the rest dense SwiGLU)"),
        ("tiny-qwen2-moe", "MoE SwiGLU, 6 NVFP4 experts, top-2 (not renormalised), a sigmoid-gated NVFP4 shared "
                           "expert, 2 of 4 layers (the rest dense SwiGLU)"),
        ("tiny-mixtral", "MoE SwiGLU, 4 NVFP4 experts, top-2 (renormalised), every layer"),
        ("tiny-olmoe", "MoE SwiGLU, 8 experts (NVFP4 gate, up; 16-bit down), top-3 (not renormalised), every layer"),
    ]:
        info, source = inspect(nvfp4_moe(shape, "compressed-tensors")), inspect(synth(shape, seed=3))
        assert info.plan.block == block
        assert source.plan.block == block.replace(" (NVFP4 gate, up; 16-bit down)", "").replace("NVFP4 ", "")
        # the same model's bf16 checkpoint: the same total and active counts
        assert (info.plan.parameters, info.plan.active_parameters, info.plan.moe_layers) == (
            source.plan.parameters, source.plan.active_parameters, source.plan.moe_layers)
        assert info.metadata.parameter_count == source.metadata.parameter_count


def test_memory_plan_counts_packed_experts(nvfp4_moe, synth, tmp_path):
    """cuda-native's estimate (the fallback where the extension has no CUDA) keeps NVFP4 experts packed:
    codes, block scales and a global scale each; torch holds them dequantized (fp32 here)."""
    info, source = inspect(nvfp4_moe("tiny-qwen2-moe")), inspect(synth("tiny-qwen2-moe", seed=3))
    eng = Engine(backend="torch", home=tmp_path / "home")
    packed = eng._weight_bytes_resident(info, "cuda-native")
    assert packed == resident_bytes(info, 2, packed=True)
    dense = sum(t.numel for t in source.tensors)
    nvfp4_weights = [t for t in source.tensors if info.quant_scheme is not None and any(
        x.name == t.name and x.dtype == "U8" for x in info.tensors)]
    quantized = sum(t.numel for t in nvfp4_weights)
    expected = (dense - quantized) * 2 + quantized // 2 + quantized // 16 + 4 * len(nvfp4_weights)
    assert packed == expected and len(nvfp4_weights) == 16 + 6 + 36 + 6
    assert packed < 0.5 * source.weight_bytes
    assert eng.memory_plan(str(info.path)).weight_bytes == dense * 4 == info.plan.parameters * 4


@pytest.mark.parametrize("shape, layout, counts, gigabytes", [
    ("qwen3-30b-a3b", "compressed-tensors", (30_532_122_624, 3_353_032_704), 18.09),
    ("mixtral-8x7b", "modelopt", (46.7, 12.9), 26.65),
    ("olmoe-1b-7b", "modelopt", (6.9, 1.3), 4.19),
    ("qwen1.5-moe-a2.7b", "compressed-tensors", (14.3, 2.7), 8.95),
])
def test_real_size_nvfp4_moe_plans_keep_the_model_card_counts_and_pack_the_experts(shape, layout, counts, gigabytes):
    """The real MoE shapes in NVFP4, planned from synth's tensor list alone (nothing written): the model
    cards' total and active parameters, as in bf16, and the packed resident weights (the memory plan's
    estimate): codes, block scales and a global scale per projection, the rest 16-bit."""
    from engine.catalog import TensorCatalog
    from engine.checkpoint import CheckpointInfo, ModelMetadata, TensorInfo, decoder_config_from_hf
    from engine.nvfp4_checkpoint import detect, parameter_count
    from engine.plan import ExecutionPlan
    from engine.tools.synth import SHAPES, nvfp4_quantization_config, tensor_entries

    cfg = dict(SHAPES[shape], hidden_act="silu")
    cfg["quantization_config"] = nvfp4_quantization_config(cfg, layout)
    entries, _ = tensor_entries(cfg, "bf16", layout)
    tensors, offset = [], 0
    for name, dtype, dims, nbytes in entries:
        tensors.append(TensorInfo(name, dtype, tuple(dims), nbytes, "model.safetensors", offset))
        offset += nbytes
    decoder = decoder_config_from_hf(cfg)
    scheme = detect(Path("/nonexistent"), cfg, tensors)          # config.json's quantization_config alone
    assert scheme.layout == layout and not scheme.unsupported
    catalog = TensorCatalog.build(decoder, tensors)
    assert not catalog.missing and not catalog.unexpected
    plan = ExecutionPlan.discover(decoder, catalog, "nvfp4")
    assert f"{decoder.num_experts} NVFP4 experts" in plan.block
    if isinstance(counts[0], int):
        assert (plan.parameters, plan.active_parameters) == counts
    else:
        assert (round(plan.parameters / 1e9, 1), round(plan.active_parameters / 1e9, 1)) == counts
    assert parameter_count(scheme, tensors) == plan.parameters
    info = CheckpointInfo(Path("/nonexistent"), "safetensors", {}, tensors, cfg,
                          ModelMetadata(cfg["architectures"][0], cfg["model_type"], plan.parameters, {}, "nvfp4",
                                        decoder.max_position_embeddings, decoder.vocab_size, False, False, False),
                          decoder, catalog, plan, "", scheme)
    layers = pair(info)
    moe_layers = decoder.moe.moe_layer_count(decoder.num_layers)
    shared = 3 if decoder.moe.has_shared_expert else 0
    assert sum(len(x) for x in layers.experts) == moe_layers * decoder.num_experts
    assert layers.count == decoder.num_layers * 4 + moe_layers * (decoder.num_experts * 3 + shared)
    weights = [t for t in tensors if t.dtype == "U8"]
    quantized = sum(2 * t.numel for t in weights)
    resident = resident_bytes(info, 2, packed=True)
    assert resident == (plan.parameters - quantized) * 2 + quantized // 2 + quantized // 16 + 4 * len(weights)
    print(f"\n{shape} NVFP4: {resident / 1e9:.2f} GB resident packed, {2 * plan.parameters / 1e9:.2f} GB in bf16")
    assert round(resident / 1e9, 2) == gigabytes
    assert resident_bytes(info, 2, packed=False) == 2 * plan.parameters


def test_inspector_shows_each_expert_tensors_format(nvfp4_moe, capsys):
    from engine.cli import main

    folder = nvfp4_moe("tiny-qwen2-moe", "modelopt")
    assert main(["inspect", str(folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    tensors = {t["name"]: t for t in data["tensors"]}
    e = "model.layers.1.mlp.experts.2.gate_proj"
    assert tensors[f"{e}.weight"]["format"] == "nvfp4" and tensors[f"{e}.weight"]["shape"] == [32, 32]
    assert tensors[f"{e}.weight_scale"]["format"] == "e4m3 block scale"
    assert tensors[f"{e}.weight_scale_2"]["format"] == "fp32 global scale"
    assert tensors["model.layers.1.mlp.shared_expert.down_proj.weight"]["format"] == "nvfp4"
    assert tensors["model.layers.1.mlp.gate.weight"]["format"] == "bf16"                  # the router
    assert tensors["model.layers.1.mlp.shared_expert_gate.weight"]["format"] == "bf16"
    assert data["catalog"]["layer_roles"]["scale"] == 2 * (16 + 6 + 36 + 6)      # block + global, per weight
    assert "model.layers.1.mlp.gate" in data["quantization_scheme"]["exclusions"]

    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "plan             Qwen2-MoE: moe, grouped-query, nvfp4 projections" in out
    assert ("block            MoE SwiGLU, 6 NVFP4 experts, top-2 (not renormalised), a sigmoid-gated NVFP4 "
            "shared expert, 2 of 4 layers (the rest dense SwiGLU)") in out
    assert "nvfp4 weights    attention 16 of 16, dense MLP 6 of 6, experts 36 of 36, shared expert 6 of 6" in out
