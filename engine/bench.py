"""Batch-1 decode throughput of the cuda-native backend beside the roofline and HF transformers.

    python -m engine.bench --model DIR [--model DIR ...] [--tokens 128] [--hf] [--json OUT]

Decode is timed end to end as an app sees it: one decode step plus one device sample (one token id
read back) per token, after a warm-up. The roofline is weight bytes / measured bandwidth.
"""
from __future__ import annotations

import argparse
import json
import time
from datetime import date

BANDWIDTH = 4.27e12  # bytes/s, H200 read bandwidth measured in docs (shared GPU.md)


def bench_cuda(path: str, tokens: int) -> dict:
    from engine.backends import cuda_native
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect
    from engine.sampling import GREEDY, SamplerState

    info = inspect(path)
    runner = cuda_native.load_runner(info, info.plan, RunnerOptions(context_length=1024, max_batch=1))
    try:
        seq = runner.allocate_sequence()
        runner.prefill(seq, list(range(1, 17)))
        tok = runner.sample([SamplerState.start(GREEDY)])[0]
        for _ in range(8):  # warm-up
            runner.decode([seq], [tok])
            tok = runner.sample([SamplerState.start(GREEDY)])[0]
        start = time.perf_counter()
        for _ in range(tokens):
            runner.decode([seq], [tok])
            tok = runner.sample([SamplerState.start(GREEDY)])[0]
        elapsed = time.perf_counter() - start
        weights = runner.memory()["weight_bytes"]
        gemm = runner.memory()["gemm_backend"]
        runner.release_sequence(seq)
    finally:
        runner.close()
    return {"model": path, "tok_s": tokens / elapsed, "weight_bytes": weights,
            "roofline_tok_s": BANDWIDTH / weights, "gemm_backend": gemm}


def bench_hf(path: str, tokens: int) -> float:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    ids = torch.arange(1, 17, device="cuda")[None]
    kw = dict(do_sample=False, min_new_tokens=tokens, max_new_tokens=tokens, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **dict(kw, min_new_tokens=8, max_new_tokens=8))
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, **kw)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    del model
    torch.cuda.empty_cache()
    return tokens / elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hf", action="store_true", help="also time transformers generate (bf16, eager)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    import torch

    rows = []
    for path in args.model:
        row = bench_cuda(path, args.tokens)
        if args.hf:
            row["hf_tok_s"] = bench_hf(path, min(args.tokens, 64))
        rows.append(row)
        print(json.dumps(row), flush=True)
    gpu = torch.cuda.get_device_name(0)
    print(f"\n{gpu}, {date.today().isoformat()}, batch 1, {args.tokens} decode steps (decode + device sample each)")
    print("| model | weights | cuda-native tok/s | roofline tok/s | % of roofline | HF transformers tok/s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        hf = f"{r['hf_tok_s']:.1f}" if "hf_tok_s" in r else "-"
        print(f"| {r['model']} | {r['weight_bytes'] / 1e9:.2f} GB | {r['tok_s']:.1f} | {r['roofline_tok_s']:.0f} | "
              f"{100 * r['tok_s'] / r['roofline_tok_s']:.0f} % | {hf} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "date": date.today().isoformat(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
