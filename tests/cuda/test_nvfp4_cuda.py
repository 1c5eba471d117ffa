"""NVFP4 on the cuda-native engine against the torch reference over the same dequantized weights,
at the bar the bf16 runner meets (tests/cuda/test_runner.py): teacher-forced prefill (the expanded
tensor-core product), decode at one row (the fused GEMVs), 6 rows (plain GEMVs) and 12 rows (the
tensor-core product inside the decode graphs). The kernels alone: tests/cuda/test_kernels.py."""
from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

# (shape, how it became NVFP4): the real quantizer (`hearth quantize`, on the CPU: the 135M in seconds)
# in both on-disk layouts, and random codes and scales written directly for the larger shapes
# (engine.tools.synth --nvfp4: q/k norms, llama3 rope).
CASES = [("smollm2-135m", "modelopt"), ("smollm2-135m", "compressed-tensors"), ("qwen3-0.6b", "synth"),
         ("llama3.2-1b", "synth")]


MiB = 1024 ** 2


def _synth_nvfp4(shape, tmp_path_factory):
    """A random NVFP4 checkpoint of `shape`: $HEARTH_CUDA_MODELS/<shape>-nvfp4 when scripts/gpu_check.sh
    wrote it there, else written now (on the GPU, seconds)."""
    from engine.tools.synth import write_checkpoint

    root = os.environ.get("HEARTH_CUDA_MODELS")
    if root and (Path(root) / f"{shape}-nvfp4" / "config.json").exists():
        return Path(root) / f"{shape}-nvfp4"
    return write_checkpoint(shape, tmp_path_factory.mktemp("nvfp4") / shape, nvfp4=True)


@pytest.fixture(scope="module")
def nvfp4_dir(model_dir, tmp_path_factory):
    from engine.quantize import write_nvfp4

    made = {}

    def make(shape, layout="modelopt"):
        if (shape, layout) not in made:
            made[shape, layout] = (_synth_nvfp4(shape, tmp_path_factory) if layout == "synth"
                                   else write_nvfp4(model_dir(shape), tmp_path_factory.mktemp("nvfp4") / shape, layout))
        return made[shape, layout]

    return make


def _runners(path, context=1024):
    from engine.backends import cuda_native, torch_ref
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect

    info = inspect(path)
    # fp32 compute and fp32 K / V: the reference the fast precision's bar is measured against
    ref = torch_ref.load_runner(info, info.plan, RunnerOptions(context_length=context, compute_dtype="float32"),
                                device="cuda")
    try:
        ours = cuda_native.load_runner(info, info.plan, RunnerOptions(context_length=context, max_batch=16))
    except BaseException:
        ref.close()
        raise
    return info, ours, ref


_HF_NAMES = {"q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
             "o": "self_attn.o_proj.weight", "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
             "down": "mlp.down_proj.weight", "attn_norm": "input_layernorm.weight",
             "mlp_norm": "post_attention_layernorm.weight", "q_norm": "self_attn.q_norm.weight",
             "k_norm": "self_attn.k_norm.weight", "q_bias": "self_attn.q_proj.bias",
             "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias"}


def _hf_bf16_on_the_dequantized_weights(info, ref, tokens, out_dir) -> np.ndarray:
    """The issue's bar: transformers in bf16 on the dequantized checkpoint. The reference runner's fp32
    weights (the dequantized NVFP4 values) are written as a plain bf16 checkpoint beside its config."""
    import json

    from safetensors.torch import save_file

    transformers = pytest.importorskip("transformers")
    tensors = {"model.embed_tokens.weight": ref.embed, "model.norm.weight": ref.final_norm}
    if ref.lm_head is not ref.embed:
        tensors["lm_head.weight"] = ref.lm_head
    for i, layer in enumerate(ref.layers):
        for role, name in _HF_NAMES.items():
            value = getattr(layer, role)
            if value is not None:
                tensors[f"model.layers.{i}.{name}"] = value
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in tensors.items()},
              str(out_dir / "model.safetensors"))
    config = dict(info.config)
    config.pop("quantization_config", None)
    (out_dir / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        logits = hf(torch.tensor([tokens], device="cuda")).logits[0].float().cpu().numpy()
    del hf
    gc.collect()
    torch.cuda.empty_cache()
    return logits


def _compare(ours, ref):
    rel = float(np.linalg.norm(ours.astype(np.float64) - ref) / np.linalg.norm(ref.astype(np.float64)))
    return rel, float(np.mean(ours.argmax(-1) == ref.argmax(-1)))


@pytest.mark.parametrize("shape,layout", CASES)
def test_nvfp4_logits_match_the_torch_reference(shape, layout, nvfp4_dir, tmp_path, record_property):
    """Teacher-forced logits over 512 tokens against the fp32 reference on the same dequantized
    weights, at the fast precision's bar: no further from it than transformers in bf16 on the
    dequantized checkpoint, measured here; then decode rows at 1, 6 and 12 rows within 2e-2."""
    info, ours, ref = _runners(nvfp4_dir(shape, layout))
    try:
        tokens = np.random.default_rng(7).integers(0, info.decoder.vocab_size, 512).tolist()
        expected = ref.score(tokens)
        hf_rel, hf_top1 = _compare(_hf_bf16_on_the_dequantized_weights(info, ref, tokens, tmp_path / "bf16"),
                                   expected)
        got = ours.score(tokens)
        rel, top1 = _compare(got, expected)
        print(f"\n[{shape} nvfp4 {layout}] teacher-forced 512 tokens vs torch fp32: rel {rel:.3e}, top-1 "
              f"{top1 * 100:.2f}%; transformers bf16 on the dequantized weights: rel {hf_rel:.3e}, "
              f"top-1 {hf_top1 * 100:.2f}%")
        record_property("rel_error", rel)
        record_property("hf_bf16_rel_error", hf_rel)
        assert np.isfinite(got).all() and rel <= hf_rel
        # prefill then decode (the GEMV path) reproduce the teacher-forced rows
        seq = ours.allocate_sequence()
        ours.prefill(seq, tokens[:500])
        rows = [ours.last_logits()[0]]
        for t in tokens[500:511]:
            ours.decode([seq], [t])
            rows.append(ours.last_logits()[0])
        rel2, _ = _compare(np.stack(rows), expected[499:511])
        assert rel2 <= 2e-2
        ours.release_sequence(seq)
        # a batch of 6 (GEMVs) and of 12 (the expanded tensor-core product) at one step
        for batch in (6, 12):
            seqs = [ours.allocate_sequence() for _ in range(batch)]
            for s in seqs:
                ours.prefill(s, tokens[:500])
            ours.decode(seqs, [tokens[500]] * batch)
            got_rows = ours.last_logits()
            rel3, top3 = _compare(got_rows, np.repeat(expected[500:501], batch, axis=0))
            print(f"[{shape} nvfp4 {layout}] batch {batch} decode vs torch: rel {rel3:.3e}")
            assert got_rows.shape[0] == batch and rel3 <= 2e-2
            for s in seqs:
                ours.release_sequence(s)
    finally:
        ours.close()
        ref.close()
        gc.collect()
        torch.cuda.empty_cache()


def test_nvfp4_weights_stay_packed_on_the_gpu(nvfp4_dir):
    from engine.nvfp4_checkpoint import resident_bytes

    info, ours, ref = _runners(nvfp4_dir("smollm2-135m"))
    try:
        packed = resident_bytes(info, 2, packed=True)
        assert ours.memory()["weight_bytes"] <= 1.05 * packed
    finally:
        ours.close()
        ref.close()


@pytest.mark.parametrize("shape", ["llama3.2-1b", "llama3.1-8b"])
def test_nvfp4_load_takes_what_the_plan_says(shape, tmp_path_factory, plan_then_load, record_property):
    """The memory plan's promise holds for packed NVFP4 weights too (tests/cuda/test_memory_plan_cuda.py)."""
    plan, took = plan_then_load(_synth_nvfp4(shape, tmp_path_factory), 4096)
    print(f"\n[{shape} nvfp4 ctx 4096] plan {plan.total_bytes / MiB:,.0f} MiB (weights "
          f"{plan.weight_bytes / MiB:,.0f}), the load took {took / MiB:,.0f} MiB")
    record_property("plan_bytes", plan.total_bytes)
    record_property("took_bytes", took)
    assert abs(took - plan.total_bytes) <= 0.03 * plan.total_bytes
    assert took <= plan.total_bytes + 64 * MiB
