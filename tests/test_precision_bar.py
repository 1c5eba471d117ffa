"""The fast precision's bar on the real default model (CPU, through the kernels' rounding simulation).

The cuda-native `fast` precision multiplies scaled fp16 operands once per projection (weights per
tensor, activations per row or by a static bound, powers of two undone exactly after the product:
native/src/kernels/kernels.h). engine.tools.precision's `fp16_scaled` mode feeds torch_ref's every
projection the same rounded operands. Against the fp32 reference (fp32 compute, fp32 KV cache) on
real English text, it must move the logits by at most 5e-3 with 99 % top-1 agreement, and by no more
than transformers in bf16 does on the same checkpoint and tokens, measured here.
"""
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.tools import precision

TEXT = Path(__file__).parent / "data" / "declaration.txt"


def _compare(ours, ref):
    row = precision.compare(ours, ref)
    return row["rel_error"], row["top1"]


@pytest.fixture(scope="module")
def scored(default_model):
    """(tokens, fp32 reference, fast simulation, transformers bf16) over 512 tokens of real text."""
    transformers = pytest.importorskip("transformers")
    from engine.backends import torch_ref
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect
    from engine.tokenizer import Tokenizer

    info = inspect(default_model.path)
    tokenizer = Tokenizer.from_folder(info.path, info.config)
    tokens = tokenizer.encode(TEXT.read_text())[:512]
    assert len(tokens) == 512
    runner = torch_ref.load_runner(info, info.plan, RunnerOptions(context_length=512, compute_dtype="float32"),
                                   device="cpu")
    try:
        ref = runner.score(tokens)
        with precision.rounding("fp16_scaled"):
            fast = runner.score(tokens)
        with precision.rounding("bf16"):
            one_bf16 = runner.score(tokens)
    finally:
        runner.close()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(info.path), dtype=torch.bfloat16).eval()
    with torch.no_grad():
        hf_bf16 = hf(torch.tensor([tokens])).logits[0].float().numpy()
    del hf
    return tokens, ref, fast, one_bf16, hf_bf16


def test_fast_precision_meets_the_bar_on_real_text(scored):
    _, ref, fast, one_bf16, hf_bf16 = scored
    rel, top1 = _compare(fast, ref)
    hf_rel, hf_top1 = _compare(hf_bf16, ref)
    bf_rel, bf_top1 = _compare(one_bf16, ref)
    print(f"\n[default model, 512 tokens of real text, vs fp32] fast (scaled fp16): rel {rel:.3e}, top-1 "
          f"{top1 * 100:.2f} %; one bf16 product: rel {bf_rel:.3e}, top-1 {bf_top1 * 100:.2f} %; "
          f"transformers bf16: rel {hf_rel:.3e}, top-1 {hf_top1 * 100:.2f} %")
    assert np.isfinite(fast).all()
    assert rel <= 5e-3 and top1 >= 0.99
    assert rel <= hf_rel
    # bf16 products were the alternative: measured here, it misses the top-1 bar the fp16 path meets
    assert bf_rel > rel


def test_the_simulation_rounds_what_the_kernels_round():
    """fp16_scaled puts each row's (or tensor's) largest magnitude in [2^14, 2^15), as the kernels'
    fp16_operand_scale does, so the same values are rounded the same way."""
    from engine import _native

    if not hasattr(_native, "fp16_operand_scale"):
        pytest.skip("the extension was built without the CUDA runtime")
    for amax in (3e-5, 0.02, 1.0, 700.0, 6e4):
        s = _native.fp16_operand_scale(amax)
        e = precision._pow2_exponent(torch.tensor(amax))
        assert s == 2.0 ** -int(e)
