"""How far rounding the inputs of every matrix product moves a checkpoint's logits.

    python -m engine.tools.precision --model DIR [--model DIR ...] [--tokens 512] [--device cuda|cpu]
                                     [--modes bf16_split,bf16,fp16,fp16_scaled] [--json FILE]

Why: a faster decode or prefill GEMM means fewer or narrower products, and the question is what that
costs in accuracy before anyone writes the kernel. The reference is the engine's accuracy bar: the
torch backend computing in fp32 over a bf16 KV cache, teacher-forced over `--tokens` random tokens
(np.random.default_rng(7), as tests/cuda/test_runner.py does). Each mode re-runs the same forward with
every `F.linear` of torch_ref (q, k, v, o, gate, up, down, lm_head; not the attention products) fed
rounded operands, accumulating in fp32 as the tensor cores do:

  bf16_split   x = bf16(x) + bf16(x - bf16(x)), two products summed: the engine's default. Must be
               ~exact (products alone: 3e-6 to 5e-5 from 135M to 8B); if not, this tool is wrong.
  bf16         x rounded to bf16, one product (w rounded to bf16 too: a no-op on bf16 checkpoints, what
               the engine's loader does to fp16 and fp32 ones).
  fp16         x and w rounded to fp16 (no scaling: overflow and underflow show as they would).
  fp16_scaled  x per row and w per tensor multiplied by a power of two so the largest magnitude lands
               in [2^14, 2^15), rounded to fp16, the scale undone after the product (exact in fp32).

For each mode: rel error = ||ours - ref|| / ||ref|| (float64) and top-1 agreement (argmax equality),
twice: with both sides on a bf16 KV cache (the bar, what the engine's teacher-forced test compares), and
with both on an fp32 cache ("products alone", `*_fp32_kv`). They differ because a product perturbed by
even 3e-6 now and then flips the bf16 rounding of a K or V element, a jump of one bf16 ulp, and the
random-weight models amplify it: bf16_split measures ~6e-6 alone but ~1e-3 against the bar (135M),
which is the cache's doing, not the products'. Also "kv_bf16_vs_fp32": the reference on a bf16 cache against an fp32 one, the move
that the cache format alone makes. On the GPU the 8B takes ~32 GB in fp32.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from datetime import date

import numpy as np

MODES = ("bf16_split", "bf16", "fp16", "fp16_scaled")
FP16_TOP_EXPONENT = 15  # the largest magnitude is scaled into [2^14, 2^15): below fp16's max, 65504


def _pow2_exponent(amax, top: int = FP16_TOP_EXPONENT):
    """The power of two s with amax * 2^s in [2^(top-1), 2^top): frexp gives amax = m 2^e, m in [0.5, 1).
    A zero amax gives s = top (the zeros stay zeros); s stays within fp32's exponent range."""
    import torch

    _, e = torch.frexp(amax)
    return (top - e).clamp(-126, 126)


def round_fp16_scaled(t, dim=None):
    """t rounded to fp16 after a power-of-two scale (per row along `dim`, or per tensor when None), the
    scale undone afterwards: what an fp16 GEMM with a scaled epilogue computes on."""
    import torch

    t = t.float()
    amax = t.abs().amax(dim=dim, keepdim=True) if dim is not None else t.abs().amax()
    s = _pow2_exponent(amax)
    return torch.ldexp(torch.ldexp(t, s.to(t.dtype)).half().float(), (-s).to(t.dtype))


def _bf16(t):
    import torch

    return t.to(torch.bfloat16).to(t.dtype)


def _linear_for(mode: str, real_linear):
    """The F.linear a mode computes with (fp32 operands carrying the rounded values, fp32 accumulate)."""
    import torch

    if mode == "bf16_split":
        def linear(x, w, b=None):
            hi = _bf16(x)
            lo = _bf16(x - hi)
            w = _bf16(w)
            y = real_linear(hi, w) + real_linear(lo, w)
            return y if b is None else y + b
    elif mode == "bf16":
        def linear(x, w, b=None):
            return real_linear(_bf16(x), _bf16(w), b)
    elif mode == "fp16":
        def linear(x, w, b=None):
            return real_linear(x.to(torch.float16).to(x.dtype), w.to(torch.float16).to(w.dtype), b)
    elif mode == "fp16_scaled":
        def linear(x, w, b=None):
            return real_linear(round_fp16_scaled(x, dim=-1).to(x.dtype), round_fp16_scaled(w).to(w.dtype), b)
    else:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return linear


class _RoundingFunctional:
    """Stands in for torch.nn.functional inside torch_ref: `linear` rounds, everything else delegates."""

    def __init__(self, real, linear):
        self._real = real
        self.linear = linear

    def __getattr__(self, name):
        return getattr(self._real, name)


@contextlib.contextmanager
def rounding(mode: str):
    """Within the block, torch_ref's F.linear computes on `mode`'s rounded operands."""
    from engine.backends import torch_ref

    real = torch_ref.F
    torch_ref.F = _RoundingFunctional(real, _linear_for(mode, real.linear))
    try:
        yield
    finally:
        torch_ref.F = real


def compare(ours: np.ndarray, ref: np.ndarray) -> dict:
    """rel error in float64 and top-1 agreement, as tests/cuda/test_runner.py computes them."""
    ours64, ref64 = ours.astype(np.float64), ref.astype(np.float64)
    rel = float(np.linalg.norm(ours64 - ref64) / np.linalg.norm(ref64))
    top1 = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    return {"rel_error": rel, "top1": top1, "finite": bool(np.isfinite(ours).all())}


def measure(model: str, tokens: int = 512, device: str = "cpu", modes=MODES) -> dict:
    """Every figure for one checkpoint: {"kv_bf16_vs_fp32": {...}, "modes": {mode: {...}}, ...}."""
    import torch

    from engine.backends import torch_ref
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect

    for mode in modes:
        _linear_for(mode, None)  # an unknown mode fails before the load, not after
    # The reference must be true fp32: no TF32 in the products it is compared against.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    info = inspect(model)
    if info.plan is None:
        raise ValueError(f"{model}: the engine cannot run this checkpoint ({info.plan_error})")
    vocab = info.decoder.vocab_size
    ids = np.random.default_rng(7).integers(0, vocab, tokens).tolist()
    start = time.perf_counter()
    runner = torch_ref.load_runner(info, info.plan, RunnerOptions(context_length=max(tokens, 16),
                                                                   compute_dtype="float32",
                                                                   kv_dtype="bfloat16"), device=device)
    result = {"model": model, "device": device, "tokens": tokens, "vocab": vocab,
              "reference": "torch_ref fp32 compute, bf16 KV cache", "load_s": time.perf_counter() - start,
              "modes": {}, "seconds": {}}
    try:
        start = time.perf_counter()
        ref = runner.score(ids)
        result["seconds"]["reference"] = time.perf_counter() - start
        # The same weights with an fp32 cache: sequences allocated from here on take the runner's kv_dtype.
        runner.kv_dtype = runner.dtype
        ref32 = runner.score(ids)
        result["reference_finite"] = bool(np.isfinite(ref).all() and np.isfinite(ref32).all())
        result["kv_bf16_vs_fp32"] = compare(ref, ref32)
        for mode in modes:
            start = time.perf_counter()
            with rounding(mode):
                runner.kv_dtype = torch.bfloat16
                row = compare(runner.score(ids), ref)
                runner.kv_dtype = runner.dtype
                row.update({f"{k}_fp32_kv": v for k, v in compare(runner.score(ids), ref32).items()})
            result["seconds"][mode] = time.perf_counter() - start
            result["modes"][mode] = row
    finally:
        runner.close()
        del runner
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return result


def print_result(r: dict) -> None:
    name = r["model"].rstrip("/").split("/")[-1]
    print(f"\n{name}: {r['tokens']} teacher-forced tokens on {r['device']}, against {r['reference']}")
    print("| products fed | rel error (bf16 KV, the bar) | top-1 | rel error (fp32 KV: products alone) | top-1 |")
    print("|---|---|---|---|---|")
    kv = r["kv_bf16_vs_fp32"]
    print(f"| fp32 (reference, bf16 KV vs fp32 KV) | {kv['rel_error']:.3e} | {kv['top1'] * 100:.2f} % | - | - |")
    for mode, m in r["modes"].items():
        flag = "" if m["finite"] and m["finite_fp32_kv"] else " (non-finite logits)"
        print(f"| {mode}{flag} | {m['rel_error']:.3e} | {m['top1'] * 100:.2f} % | "
              f"{m['rel_error_fp32_kv']:.3e} | {m['top1_fp32_kv'] * 100:.2f} % |")
    split = r["modes"].get("bf16_split")
    if split is not None and not split["rel_error_fp32_kv"] < 1e-4:
        print(f"WARNING: bf16_split should be ~exact but moved the logits by {split['rel_error_fp32_kv']:.2e}: "
              "the tool, not the arithmetic, is suspect.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.precision", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="a checkpoint folder (repeatable)")
    parser.add_argument("--tokens", type=int, default=512, help="teacher-forced tokens scored")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("engine.tools.precision --device cuda needs a CUDA GPU that torch can use, and there is none "
              "here; run it with --device cpu (slow for large checkpoints).", file=sys.stderr)
        return 2
    result = {"date": date.today().isoformat(), "rows": []}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name(0)
    status = 0
    for path in args.model:
        try:
            row = measure(path, args.tokens, args.device, modes)
            print_result(row)
        except Exception as exc:  # one checkpoint failing must not lose the others' figures
            row = {"model": path, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{path}: {row['error']}", file=sys.stderr)
            status = 1
        result["rows"].append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
