"""`hearth bench`: what a desktop user feels, measured in one run on the GPU.

    python -m engine.bench --model DIR [--model DIR ...] [--shape NAME ...] [--precision fast|exact ...]
                           [--hf] [--torch] [--json OUT]

`--shape` generates a random-weight checkpoint of a real shape (engine.tools.synth) and measures it.

For each checkpoint, the cuda-native backend's:
  - batch-1 decode tok/s (decode_and_sample per token: graph replay, device sampling, one id back),
    beside the roofline = weight bytes / the read bandwidth MEASURED in this run;
  - time to first token for 128 / 512 / 2,048-token prompts (prefill + first sample), and
    prefill tok/s at 2,048;
  - aggregate decode tok/s with 8 / 32 / 64 sequences decoding together (runner.decode_and_sample);
  - second-turn time to first token: a 64-token message after a 4,096-token history vs alone;
  - load GB/s (checkpoint bytes / load time, graph capture included) and peak GPU memory;
  - beside prefill, the projections alone as 16-bit cuBLAS products at 2,048 rows: the bound.
With --hf the same shapes through transformers (bf16, eager); with --torch the torch backend (fp32,
only checkpoints under 1 GB of weights: it is slow). A table is printed; --json writes every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

TTFT_PROMPTS = (128, 512, 2048)
AGG_BATCHES = (8, 32, 64)
HISTORY = 4096
MESSAGE = 64


def measure_bandwidth() -> float:
    """Read bandwidth in bytes/s: a bf16 sum over 4 GiB, best of 5."""
    import torch

    x = torch.randn(2 << 30, dtype=torch.bfloat16, device="cuda")  # never time on constant data
    x.sum(dtype=torch.float32)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        x.sum(dtype=torch.float32)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    nbytes = x.numel() * 2
    del x
    torch.cuda.empty_cache()
    return nbytes / best


class _Peak:
    """Peak device memory in use (cudaMemGetInfo), sampled at each call."""

    def __init__(self):
        import torch

        self.torch = torch
        self.base = self._used()
        self.peak = 0

    def _used(self) -> int:
        free, total = self.torch.cuda.mem_get_info(0)
        return total - free

    def __call__(self):
        self.peak = max(self.peak, self._used() - self.base)


def _tokens(n: int, vocab: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(n)]


def _ttft(runner, prompt) -> float:
    from engine.sampling import GREEDY, SamplerState

    seq = runner.allocate_sequence()
    try:
        start = time.perf_counter()
        runner.prefill(seq, prompt)
        runner.sample([SamplerState.start(GREEDY)])
        return time.perf_counter() - start
    finally:
        runner.release_sequence(seq)


def _decode_rate(runner, seqs, first_tokens, steps: int) -> float:
    from engine.sampling import GREEDY, SamplerState

    states = [SamplerState.start(GREEDY) for _ in seqs]
    toks = list(first_tokens)
    for _ in range(4):  # warm-up
        toks = runner.decode_and_sample(seqs, toks, states)
    start = time.perf_counter()
    for _ in range(steps):
        toks = runner.decode_and_sample(seqs, toks, states)
    return len(seqs) * steps / (time.perf_counter() - start)


def _fresh_decode_rate(runner, vocab: int, batch: int, steps: int, peak=None) -> float:
    """Decode tok/s of `batch` new sequences decoding together: one sequence after a 16-token prompt
    (batch 1), else each after its own 128-token prompt. The main table and the A/B share it, so
    their contexts match. `peak` is sampled before the sequences are released."""
    from engine.sampling import GREEDY, SamplerState

    prompt_len, seed = (16, 1) if batch == 1 else (128, 1000)
    seqs = [runner.allocate_sequence() for _ in range(batch)]
    try:
        firsts = []
        for i, s in enumerate(seqs):
            runner.prefill(s, _tokens(prompt_len, vocab, seed + i))
            firsts.append(runner.sample([SamplerState.start(GREEDY)])[0])
        rate = _decode_rate(runner, seqs, firsts, steps)
        if peak is not None:
            peak()
        return rate
    finally:
        for s in seqs:
            runner.release_sequence(s)


def bench_runner(runner, vocab: int, tokens: int, batches, peak, long_prompts: bool = True) -> dict:
    """Every figure a runner gives (cuda-native or torch)."""
    from engine.sampling import GREEDY, SamplerState

    row: dict = {}
    row["decode_tok_s"] = _fresh_decode_rate(runner, vocab, 1, tokens)
    peak()
    prompts = TTFT_PROMPTS if long_prompts else TTFT_PROMPTS[:1]
    for n in prompts:
        prompt = _tokens(n, vocab, n)
        _ttft(runner, prompt)  # warm-up (first use of a shape)
        row[f"ttft_{n}_ms"] = 1e3 * statistics.median(_ttft(runner, prompt) for _ in range(3))
        peak()
    if 2048 in prompts:
        row["prefill_2048_tok_s"] = 2048 / (row["ttft_2048_ms"] / 1e3)
    for b in batches:
        row[f"agg_decode_b{b}_tok_s"] = _fresh_decode_rate(runner, vocab, b, max(16, tokens // 4), peak)
    if long_prompts:
        message = _tokens(MESSAGE, vocab, 7)
        hist = runner.allocate_sequence()
        runner.prefill(hist, _tokens(HISTORY, vocab, 8))
        times = []
        for _ in range(3):
            start = time.perf_counter()
            runner.prefill(hist, message)
            runner.sample([SamplerState.start(GREEDY)])
            times.append(time.perf_counter() - start)
            runner.truncate(hist, HISTORY)
        runner.release_sequence(hist)
        alone = statistics.median(_ttft(runner, message) for _ in range(3))
        row["second_turn_ttft_ms"] = 1e3 * statistics.median(times)
        row["message_alone_ttft_ms"] = 1e3 * alone
        row["second_turn_ratio"] = row["second_turn_ttft_ms"] / row["message_alone_ttft_ms"]
        peak()
    return row


def projection_bound(info, rows: int = 2048, dtype: str = "float16") -> dict:
    """The prefill bound of a shape: its projections alone (q/k/v, o, gate/up, down of every layer)
    as one 16-bit cuBLAS product each at `rows` rows (torch.matmul, cuBLASLt underneath), timed with
    CUDA events on random operands. Prefill can be no faster than this, attention aside."""
    import torch

    d = info.decoder
    H, I = d.hidden_size, d.intermediate_size
    q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
    shapes = [(q + 2 * kv, H), (H, q), (2 * I, H), (H, I)]
    dt = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    total_ms = 0.0
    for n, k in shapes:
        x = torch.randn(rows, k, device="cuda", dtype=dt, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=dt, generator=gen) * 0.02
        for _ in range(3):
            x @ w.T
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 10
        start.record()
        for _ in range(reps):
            x @ w.T
        stop.record()
        torch.cuda.synchronize()
        total_ms += start.elapsed_time(stop) / reps
    layer_flops = 2 * rows * sum(n * k for n, k in shapes)
    seconds = total_ms / 1e3 * d.num_layers
    return {"projections_2048_ms": seconds * 1e3, "projections_2048_tok_s": rows / seconds,
            "projections_2048_tflop_s": layer_flops * d.num_layers / seconds / 1e12}


def bench_cuda(path: str, tokens: int, bandwidth: float, max_batch: int, precision: str = "fast") -> dict:
    import torch

    from engine.backends import cuda_native
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect

    info = inspect(path)
    torch.cuda.empty_cache()
    peak = _Peak()
    start = time.perf_counter()
    runner = cuda_native.load_runner(info, info.plan, RunnerOptions(context_length=HISTORY + 1024,
                                                                     max_batch=max_batch, precision=precision))
    load_s = time.perf_counter() - start
    peak()
    try:
        mem = runner.memory()
        row = {"model": path, "backend": f"cuda-native {precision}", "weight_bytes": mem["weight_bytes"],
               "load_s": load_s, "load_gb_s": info.weight_bytes / load_s / 1e9,
               "graph_buckets": runner.graph_buckets(), "gemm_backend": mem["gemm_backend"]}
        row.update(bench_runner(runner, info.decoder.vocab_size, tokens,
                                [b for b in AGG_BATCHES if b <= max_batch], peak))
        row["read_bytes_per_token"] = _bytes_read_per_token(info, mem["weight_bytes"])
        row["roofline_tok_s"] = bandwidth / row["read_bytes_per_token"]
        row["roofline_fraction"] = row["decode_tok_s"] / row["roofline_tok_s"]
        row["peak_gpu_gb"] = peak.peak / 1e9
        row["kv_gb"] = mem["kv_bytes"] / 1e9
    finally:
        runner.close()
    if precision == "fast" and not info.decoder.is_moe:
        row.update(projection_bound(info))
    return row


def _bytes_read_per_token(info, weight_bytes: int) -> int:
    """What one decode step of one sequence must read: every resident weight byte, except, in a
    mixture-of-experts layer, the experts the token does not route to (E - k of E, on average the
    same bytes whichever k it picks)."""
    d = info.decoder
    if not d.is_moe:
        return int(weight_bytes)
    skipped = 0
    for i, layer in enumerate(info.catalog.layers):
        if not d.moe.is_moe_layer(i):
            continue
        experts = sum(t.bytes for e in layer.experts.values() for t in e.values())
        experts += sum(t.bytes for e in layer.expert_scales.values() for t in e.values())
        skipped += experts * (d.moe.num_experts - d.moe.top_k) // d.moe.num_experts
    return int(weight_bytes - skipped)


def bench_torch(path: str, tokens: int) -> dict:
    import torch

    from engine.backends import torch_ref
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect

    info = inspect(path)
    peak = _Peak()
    start = time.perf_counter()
    runner = torch_ref.load_runner(info, info.plan, RunnerOptions(context_length=HISTORY + 1024), device="cuda")
    load_s = time.perf_counter() - start
    try:
        row = {"model": path, "backend": "torch", "load_s": load_s, "load_gb_s": info.weight_bytes / load_s / 1e9}
        row.update(bench_runner(runner, info.decoder.vocab_size, min(tokens, 32), [8], peak, long_prompts=True))
        row["peak_gpu_gb"] = peak.peak / 1e9
    finally:
        runner.close()
        torch.cuda.empty_cache()
    return row


def bench_hf(path: str, tokens: int) -> dict:
    import torch
    import transformers

    peak = _Peak()
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    torch.cuda.synchronize()
    load_s = time.perf_counter() - start
    row = {"model": path, "backend": "transformers", "load_s": load_s}
    vocab = model.config.vocab_size
    kw = dict(do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ids = torch.tensor([_tokens(16, vocab, 1)], device="cuda")
        model.generate(ids, min_new_tokens=8, max_new_tokens=8, **kw)
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(ids, min_new_tokens=tokens, max_new_tokens=tokens, **kw)
        torch.cuda.synchronize()
        row["decode_tok_s"] = tokens / (time.perf_counter() - start)
        for n in TTFT_PROMPTS:
            ids = torch.tensor([_tokens(n, vocab, n)], device="cuda")
            model(ids)
            torch.cuda.synchronize()
            times = []
            for _ in range(3):
                start = time.perf_counter()
                model(ids).logits[0, -1].argmax().item()
                times.append(time.perf_counter() - start)
            row[f"ttft_{n}_ms"] = 1e3 * statistics.median(times)
            peak()
        row["prefill_2048_tok_s"] = 2048 / (row["ttft_2048_ms"] / 1e3)
    row["peak_gpu_gb"] = peak.peak / 1e9
    del model
    torch.cuda.empty_cache()
    return row


def _fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def print_table(result: dict) -> None:
    print(f"\n{result['gpu']}, {result['date']}, measured read bandwidth {result['bandwidth_tb_s']:.2f} TB/s")
    cols = [("backend", "backend", "s"), ("decode b1 tok/s", "decode_tok_s", ",.0f"),
            ("% roofline", "roofline_fraction", ".0%"), ("TTFT 128 ms", "ttft_128_ms", ".1f"),
            ("TTFT 512 ms", "ttft_512_ms", ".1f"), ("TTFT 2048 ms", "ttft_2048_ms", ".1f"),
            ("prefill 2048 tok/s", "prefill_2048_tok_s", ",.0f"), ("agg b8 tok/s", "agg_decode_b8_tok_s", ",.0f"),
            ("agg b32", "agg_decode_b32_tok_s", ",.0f"), ("agg b64", "agg_decode_b64_tok_s", ",.0f"),
            ("2nd turn / alone", "second_turn_ratio", ".2f"), ("load GB/s", "load_gb_s", ".1f"),
            ("peak GB", "peak_gpu_gb", ".1f"), ("projections alone 2048 tok/s", "projections_2048_tok_s", ",.0f")]
    print("| model | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in result["rows"]:
        name = r["model"].rstrip("/").split("/")[-1]
        print(f"| {name} | " + " | ".join(_fmt(r.get(c[1]), c[2]) if c[2] != "s" else str(r.get(c[1]))
                                        for c in cols) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=[], help="a checkpoint folder (repeatable)")
    parser.add_argument("--shape", action="append", default=[],
                        help="a synthetic shape to generate and measure, e.g. llama3.1-8b (repeatable)")
    parser.add_argument("--synth-dir", default=os.path.join(tempfile.gettempdir(), "hearth-synth"),
                        help="where --shape checkpoints are written (reused when present)")
    parser.add_argument("--tokens", type=int, default=128, help="batch-1 decode steps timed")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--hf", action="store_true", help="also transformers (bf16, eager)")
    parser.add_argument("--torch", action="store_true", help="also the torch backend (checkpoints < 1 GB)")
    parser.add_argument("--precision", action="append", choices=["fast", "exact"], default=[],
                        help="cuda-native precision(s) to measure (repeatable; default fast)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if not args.model and not args.shape:
        parser.error("name at least one --model DIR or --shape NAME")
    from engine.backends import cuda_native

    ok, reason = cuda_native.available()
    if not ok:
        print(f"hearth bench measures the cuda-native engine on an NVIDIA GPU, and cannot run here: {reason}.",
              file=sys.stderr)
        return 1
    import torch

    from engine.tools.synth import write_checkpoint

    for shape in args.shape:
        folder = Path(args.synth_dir) / shape
        if not (folder / "config.json").exists():
            write_checkpoint(shape, folder)
        args.model.append(str(folder))
    bandwidth = measure_bandwidth()
    result = {"gpu": torch.cuda.get_device_name(0), "date": date.today().isoformat(),
              "bandwidth_tb_s": bandwidth / 1e12, "rows": []}

    def add(row):
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    for path in args.model:
        runs = [(f"cuda-native {p}", lambda p=p: bench_cuda(path, args.tokens, bandwidth, args.max_batch, p))
                for p in (args.precision or ["fast"])]
        for name, fn in (*runs,
                         ("transformers", lambda: bench_hf(path, min(args.tokens, 64)) if args.hf else None),
                         ("torch", lambda: bench_torch(path, args.tokens) if args.torch else None)):
            if name == "torch" and args.torch:
                from engine.checkpoint import inspect

                if inspect(path).weight_bytes > 1e9:
                    continue
            try:
                row = fn()
            except Exception as exc:  # one backend failing must not lose the others' figures
                row = {"model": path, "backend": name, "error": f"{type(exc).__name__}: {exc}"}
            if row is not None:
                add(row)
    print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
