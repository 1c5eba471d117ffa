"""Mixture-of-experts: registry, layer kinds, on-disk names, catalog, plans and the torch reference,
each checked against transformers' own modeling files (fp32, tiny random shapes)."""
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open

from engine import errors
from engine.backends.base import RunnerOptions
from engine.backends.torch_ref import load_runner
from engine.catalog import TensorCatalog
from engine.checkpoint import TensorInfo, decoder_config_from_hf, inspect
from engine.plan import ExecutionPlan, MemoryPlan
from engine.registry import family_for
from engine.tools.synth import SHAPES, tensor_shapes

transformers = pytest.importorskip("transformers")

MOE_SHAPES = ["tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-mixtral", "tiny-olmoe"]
SPARSE_BLOCKS = ("SparseMoeBlock",)       # transformers' class names end so: Qwen3MoeSparseMoeBlock, ...


def _hf(folder):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, output_loading_info=True)
    # every tensor we wrote is one transformers reads, and it reads nothing we did not write
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    return model.eval()


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _names(folder):
    names = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            names.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    return names


# ------------------------------------------------------------------------------------ layout


@pytest.mark.parametrize("arch,name", [("Qwen3MoeForCausalLM", "Qwen3-MoE"), ("Qwen2MoeForCausalLM", "Qwen2-MoE"),
                                       ("MixtralForCausalLM", "Mixtral"), ("OlmoeForCausalLM", "OLMoE")])
def test_registry_knows_the_four_moe_families(arch, name):
    family = family_for(arch)
    assert family.name == name and family.archetype == "moe"


@pytest.mark.parametrize("shape", MOE_SHAPES)
def test_layer_kinds_and_disk_names_are_what_transformers_builds_and_saves(synth, tmp_path, shape):
    """Our layer rule equals transformers' choice of block per layer, and the checkpoint we write has
    exactly the names and shapes transformers 5.24 writes when it saves the same config (per expert)."""
    folder = synth(shape)
    config = transformers.AutoConfig.from_pretrained(str(folder))
    model = transformers.AutoModelForCausalLM.from_config(config)
    layout = inspect(folder).decoder.moe
    theirs = [type(layer.mlp).__name__.endswith(SPARSE_BLOCKS) for layer in model.model.layers]
    assert [layout.is_moe_layer(i) for i in range(len(theirs))] == theirs
    model.save_pretrained(str(tmp_path / "saved"))
    assert _names(tmp_path / "saved") == _names(folder)


def test_hybrid_stacks_mix_dense_and_moe_layers(synth):
    qwen3 = inspect(synth("tiny-qwen3-moe")).decoder.moe        # mlp_only_layers = [1]
    assert [qwen3.is_moe_layer(i) for i in range(3)] == [True, False, True]
    qwen2 = inspect(synth("tiny-qwen2-moe")).decoder.moe        # decoder_sparse_step = 2
    assert [qwen2.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert qwen2.has_shared_expert and qwen2.shared_expert_intermediate_size == 96 and not qwen2.normalize_top_k
    assert inspect(synth("tiny-mixtral")).decoder.moe.normalize_top_k          # Mixtral always renormalises
    olmoe = inspect(synth("tiny-olmoe")).decoder
    assert not olmoe.moe.normalize_top_k and olmoe.qk_norm_whole_projection
    assert olmoe.moe_intermediate_size == 48                                   # its experts use intermediate_size


def test_catalog_roles_for_router_experts_and_shared_expert(synth, tmp_path):
    info = inspect(synth("tiny-qwen2-moe"))
    counts = info.catalog.role_counts()
    assert counts["router"] == 2 and counts["expert_gate"] == counts["expert_up"] == counts["expert_down"] == 12
    assert counts["shared_gate"] == counts["shared_up"] == counts["shared_down"] == counts["shared_expert_router"] == 2
    assert counts["gate"] == 2                         # the two dense layers
    assert info.catalog.layers[1].roles["shared_expert_router"].shape == (1, 64)
    mixtral = inspect(synth("tiny-mixtral")).catalog
    assert mixtral.layers[0].roles["router"].name == "model.layers.0.block_sparse_moe.gate.weight"
    assert mixtral.layers[0].experts[3]["up"].name == "model.layers.0.block_sparse_moe.experts.3.w3.weight"

    # a missing expert tensor is named, and the plan refuses with it
    from safetensors.torch import load_file, save_file

    src = synth("tiny-qwen3-moe")
    broken = tmp_path / "broken"
    shutil.copytree(src, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    info = inspect(broken)
    assert info.catalog.missing == ["layer 2: expert 5 up"]
    assert info.plan is None and "layer 2: expert 5 up" in info.plan_error


def _plan_from_shapes(shape):
    """The plan of a full-size shape from its tensor list alone (nothing written)."""
    cfg = dict(SHAPES[shape], hidden_act="silu")
    decoder = decoder_config_from_hf(cfg)
    tensors, offset = [], 0
    for name, shp in tensor_shapes(cfg):
        n = int(np.prod(shp)) * 2
        tensors.append(TensorInfo(name, "BF16", tuple(shp), n, "model.safetensors", offset))
        offset += n
    catalog = TensorCatalog.build(decoder, tensors)
    return decoder, catalog, ExecutionPlan.discover(decoder, catalog, "bf16"), tensors


def test_qwen3_30b_a3b_plan_counts_total_and_active_parameters():
    decoder, catalog, plan, tensors = _plan_from_shapes("qwen3-30b-a3b")
    assert not catalog.missing and not catalog.unexpected
    assert plan.archetype == "moe" and plan.moe_layers == 48
    assert plan.block == "MoE SwiGLU, 128 experts, top-8 (renormalised), every layer"
    # the model card: 30.5 B total, 3.3 B active
    assert plan.parameters == sum(t.numel for t in tensors) == 30_532_122_624
    # all but 120 of the 128 experts (3 x 2048 x 768 each) in each of the 48 layers
    assert plan.active_parameters == plan.parameters - 48 * 120 * 3 * 2048 * 768 == 3_353_032_704
    # the memory plan holds every expert, not only the active ones
    memory = MemoryPlan.for_model(decoder, plan.parameters * 2, context_length=4096)
    assert memory.weight_bytes == 2 * plan.parameters
    assert not memory.fits(48 * 1024 ** 3).ok and memory.fits(80 * 1024 ** 3).ok


@pytest.mark.parametrize("shape,experts,top_k", [("mixtral-8x7b", 8, 2), ("olmoe-1b-7b", 64, 8),
                                                 ("qwen1.5-moe-a2.7b", 60, 4)])
def test_real_moe_shapes_plan_with_their_model_card_sizes(shape, experts, top_k):
    decoder, catalog, plan, _ = _plan_from_shapes(shape)
    assert not catalog.missing and decoder.num_experts == experts and decoder.num_experts_per_tok == top_k
    billions = round(plan.parameters / 1e9, 1), round(plan.active_parameters / 1e9, 1)
    assert billions == {"mixtral-8x7b": (46.7, 12.9), "olmoe-1b-7b": (6.9, 1.3),
                        "qwen1.5-moe-a2.7b": (14.3, 2.7)}[shape]


def test_dense_plans_count_every_parameter_as_active(synth):
    plan = inspect(synth("tiny-qwen3")).plan
    assert plan.block == "dense SwiGLU" and plan.moe_layers == 0
    assert plan.parameters == plan.active_parameters == inspect(synth("tiny-qwen3")).metadata.parameter_count


@pytest.mark.parametrize("shape,override,reason", [
    ("tiny-qwen3-moe", {"scoring_func": "sigmoid"}, "'sigmoid' router scoring function"),
    ("tiny-qwen3-moe", {"n_group": 8}, "grouped expert routing"),
    ("tiny-qwen3-moe", {"routed_scaling_factor": 2.5}, "routed scaling factor of 2.5"),
    ("tiny-qwen3-moe", {"num_experts_per_tok": 9}, "routes each token to 9 of 8 experts"),
    ("tiny-qwen3-moe", {"ep_size": 4}, "expert parallelism over 4 devices"),
    ("tiny-qwen3-moe", {"use_sliding_window": True}, "sliding-window attention"),
    ("tiny-qwen2-moe", {"mlp_only_layers": [7]}, "outside its 4 layers"),
    ("tiny-olmoe", {"clip_qkv": 8.0}, "clips q, k and v"),
    ("tiny-mixtral", {"sliding_window": 512}, "sliding-window attention"),
])
def test_unsupported_moe_variants_get_a_reason(shape, override, reason):
    cfg = dict(SHAPES[shape], hidden_act="silu", **override)
    moe = decoder_config_from_hf(cfg).moe
    assert reason in moe.unsupported
    assert decoder_config_from_hf(dict(cfg, hidden_act="gelu")).moe.unsupported    # one reason at a time
    plain = decoder_config_from_hf(dict(SHAPES[shape], hidden_act="gelu")).moe
    assert "'gelu' activation" in plain.unsupported
    assert decoder_config_from_hf(dict(SHAPES[shape], hidden_act="silu")).moe.unsupported == ""


def test_an_unsupported_variant_is_inspected_but_not_planned(synth):
    info = inspect(synth("tiny-olmoe", clip_qkv=8.0))
    assert info.catalog is not None and not info.catalog.missing
    assert info.plan is None and "clip_qkv" in info.plan_error
    with pytest.raises(errors.UnsupportedArchitecture, match="clip_qkv"):
        from engine import Engine
        Engine(backend="torch").load_model(info.path)


# ------------------------------------------------------------------------------------ torch reference


@pytest.mark.parametrize("shape", MOE_SHAPES)
def test_moe_families_match_transformers(synth, shape):
    folder = synth(shape, seed=3)
    info = inspect(folder)
    runner = load_runner(info, info.plan, RunnerOptions(context_length=400))
    ids = np.random.RandomState(7).randint(0, info.decoder.vocab_size, 200).tolist()
    ours = runner.score(ids)
    hf = _hf(folder)
    assert sum(p.numel() for p in hf.parameters()) == info.plan.parameters == info.metadata.parameter_count
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    assert _rel(ours, ref) <= 1e-5
    # prefill in pieces, then decode, gives the teacher-forced logits (routing is per token)
    seq = runner.allocate_sequence()
    runner.prefill(seq, ids[:70])
    runner.prefill(seq, ids[70:199])
    runner.decode([seq], [ids[199]])
    assert np.abs(runner.last_logits()[0] - ours[-1]).max() < 1e-4
    runner.close()


def test_routing_reads_only_the_selected_experts_and_weights_them(synth):
    """The reference's expert sum against a hand-written loop over each row's top-k (Qwen3: renormalised)."""
    from engine.moe import MoeWeights, feed_forward, route

    torch.manual_seed(0)
    E, H, I, k = 6, 16, 8, 2
    gate, up = torch.randn(E, I, H), torch.randn(E, I, H)
    w = MoeWeights(router=torch.randn(E, H), gate_up=torch.cat([gate, up], dim=1), down=torch.randn(E, H, I))
    h = torch.randn(5, H)
    layout = inspect(synth("tiny-qwen3-moe")).decoder.moe
    weights, experts = route(h, w.router, k, normalize=True)
    assert torch.allclose(weights.sum(-1), torch.ones(5))
    probs = torch.softmax(h @ w.router.T, dim=-1)
    expected = torch.zeros_like(h)
    for r in range(5):
        top = torch.argsort(probs[r], descending=True)[:k]
        for e in top.tolist():
            y = w.down[e] @ (torch.nn.functional.silu(gate[e] @ h[r]) * (up[e] @ h[r]))
            expected[r] += probs[r, e] / probs[r, top].sum() * y
    from dataclasses import replace
    got = feed_forward(h, w, replace(layout, num_experts=E, top_k=k))
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)
    # without renormalisation the weights are the raw softmax probabilities
    raw, _ = route(h, w.router, k, normalize=False)
    assert torch.allclose(raw, torch.sort(probs, descending=True).values[:, :k])


@pytest.mark.parametrize("shape", ["tiny-qwen2-moe", "tiny-mixtral"])
def test_native_block_layout_is_transformers_fused_layout(synth, shape):
    """moe_placements fills the fused slots with exactly the tensors transformers 5 fuses in memory."""
    from engine.moe import moe_placements, moe_slot_shapes
    from engine.weights import TensorReader

    folder = synth(shape, dtype="fp32", seed=5)
    info = inspect(folder)
    shapes = moe_slot_shapes(info.decoder)
    slots: dict = {}
    with TensorReader(info) as reader:
        for slot, layer, t, offset in moe_placements(info.decoder, info.catalog):
            buf = slots.setdefault((slot, layer), np.full(int(np.prod(shapes[slot])), np.nan, dtype=np.float32))
            part = np.empty(t.numel, dtype=np.float32)
            reader.read_into(t, memoryview(part))
            buf[offset:offset + t.numel] = part
    hf = _hf(folder)
    layers = [i for i in range(info.decoder.num_layers) if info.decoder.moe.is_moe_layer(i)]
    assert {layer for _, layer in slots} == set(layers)
    for i in layers:
        mlp = hf.model.layers[i].mlp
        want = {"moe_router": mlp.gate.weight, "moe_gate_up": mlp.experts.gate_up_proj,
                "moe_down": mlp.experts.down_proj}
        if info.decoder.moe.has_shared_expert:
            want.update(moe_shared_gate_up=torch.cat([mlp.shared_expert.gate_proj.weight,
                                                      mlp.shared_expert.up_proj.weight]),
                        moe_shared_down=mlp.shared_expert.down_proj.weight,
                        moe_shared_expert_gate=mlp.shared_expert_gate.weight)
        assert set(want) == {slot for slot, layer in slots if layer == i}
        for slot, ref in want.items():
            assert tuple(ref.shape) == shapes[slot]
            np.testing.assert_array_equal(slots[(slot, i)].reshape(shapes[slot]), ref.detach().numpy())


def test_bfloat16_moe_compute_is_close(synth):
    folder = synth("tiny-qwen2-moe", seed=4)
    info = inspect(folder)
    ids = list(range(1, 100))
    fp32 = load_runner(info, info.plan, RunnerOptions(context_length=128)).score(ids)
    bf16 = load_runner(info, info.plan, RunnerOptions(context_length=128, compute_dtype="bfloat16")).score(ids)
    assert _rel(bf16, fp32) < 3e-2


def test_cuda_native_refuses_an_moe_it_cannot_run_with_its_reason(synth):
    from dataclasses import replace

    from engine.backends import cuda_native

    info = inspect(synth("tiny-mixtral"))
    wide = replace(info, decoder=replace(info.decoder, moe=replace(info.decoder.moe, num_experts=64, top_k=40)))
    with pytest.raises(errors.UnsupportedArchitecture, match="40 experts \\(at most 32\\).*--backend torch"):
        cuda_native.load_runner(wide, wide.plan, RunnerOptions(context_length=64))


@pytest.mark.parametrize("shape", ["tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-mixtral", "tiny-olmoe"])
def test_cuda_native_maps_every_moe_tensor_once_and_plans_its_bytes(synth, shape):
    """Every checkpoint tensor lands in exactly one native slot (experts by offset into the stacked
    slots), and the native memory plan's weights are those bytes plus the 256-byte piece alignment."""
    from engine import _native
    from engine.backends import cuda_native

    # head size 32 where the tiny shape's 64 / 4 heads would give 16 (the engine's sizes start at 32)
    info = inspect(synth(shape, **({} if shape == "tiny-qwen3-moe" else {"hidden_size": 128})))
    placements = cuda_native._placements(info)
    names = [t.name for _, _, t, _ in placements]
    tensors = list(info.catalog.globals.values()) + [t for layer in info.catalog.layers for t in layer.roles.values()]
    tensors += [t for layer in info.catalog.layers for e in layer.experts.values() for t in e.values()]
    assert sorted(names) == sorted(t.name for t in tensors)
    config = cuda_native._model_config(info)
    assert config["moe_layers"] == [int(info.decoder.moe.is_moe_layer(i)) for i in range(info.decoder.num_layers)]
    assert config["qk_norm_whole"] == (shape == "tiny-olmoe")
    if not hasattr(_native, "plan_memory"):
        pytest.skip("this build of the extension has no CUDA runtime (no memory plan)")
    plan = _native.plan_memory(config, cuda_native._cache_config(256, 16, 4, 16))
    loaded = sum(t.numel * 2 for t in tensors)                        # resident in 16 bits
    pieces = len(info.catalog.globals) + sum(3 + len(layer.roles) for layer in info.catalog.layers)
    assert loaded <= plan["weight_bytes"] <= loaded + 256 * pieces
    assert plan["workspace"]["moe_outputs"] > 0 and plan["workspace"]["moe_tiles"] > 0


def test_cli_inspect_shows_the_moe_plan(synth, capsys):
    from engine.cli import main

    folder = synth("tiny-qwen2-moe")
    assert main(["inspect", str(folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"]["archetype"] == "moe" and data["plan"]["moe_layers"] == 2
    assert data["plan"]["active_parameters"] < data["plan"]["parameters"]
    assert data["decoder"]["moe"]["shared_expert_intermediate_size"] == 96


# ------------------------------------------------------------------------------------ through the engine


def test_engine_chats_with_an_moe_checkpoint_as_transformers_generates(moe_chat_checkpoint, tmp_path):
    """Load, chat greedily and continue a session on the torch backend; the reply is transformers' greedy one."""
    from engine import Engine, Finished, SamplingParams, TextDelta

    eng = Engine(backend="torch", home=tmp_path)
    handle = eng.load_model(str(moe_chat_checkpoint))
    assert eng.model_info(handle.id).plan.archetype == "moe"
    sid = eng.create_session(handle.id)
    question = [{"role": "user", "content": "What is a mixture of experts?"}]
    prompt = eng.conversation_tokens(handle.id, question)
    events = list(eng.chat(sid, question[0]["content"], SamplingParams(temperature=0, max_tokens=12)))
    assert isinstance(events[-1], Finished)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    with torch.no_grad():
        ref = _hf(moe_chat_checkpoint).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                                min_new_tokens=12)[0, len(prompt):].tolist()
    stats = events[-1].stats
    assert stats.prompt_tokens == len(prompt) and stats.generated_tokens >= 1
    assert text == eng.tokenizer(handle.id).decode(ref[:stats.generated_tokens])
    # a second turn reuses the cache: only the new message is prefilled
    second = list(eng.chat(sid, "And why?", SamplingParams(temperature=0, max_tokens=4)))
    assert 0 < second[-1].stats.prefilled_tokens < second[-1].stats.prompt_tokens
    eng.unload(handle.id)


def test_cli_inspect_text_names_the_block_and_the_active_parameters(synth, capsys):
    from engine.cli import main

    info = inspect(synth("tiny-olmoe"))
    assert main(["inspect", str(info.path)]) == 0
    out = capsys.readouterr().out
    assert "OLMoE: moe, projection-normalized-grouped-query" in out
    assert "MoE SwiGLU, 8 experts, top-3 (not renormalised), every layer" in out
    assert f"{info.plan.active_parameters:,} of {info.plan.parameters:,} parameters" in out
