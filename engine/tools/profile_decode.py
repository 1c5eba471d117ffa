"""Where a cuda-native decode step's time goes, kernel by kernel, with CUDA graphs on and off.

    python -m engine.tools.profile_decode --model DIR [--model DIR ...] [--steps 64] [--context 256]
                                          [--batch 1] [--graphs both|on|off] [--json FILE]

Why: docs/PERF_NOTES.md plans fusions (residual+RMSNorm into the GEMV, rope+KV write, fewer decode
attention splits) from estimates; this measures them. Each checkpoint is loaded as the app loads it
(decode graphs captured at load; HEARTH_CUDA_GRAPHS is read at load, so graphs off is a second load
with HEARTH_CUDA_GRAPHS=0, each runner freed before the next), `--batch` sequences are prefilled with
a random `--context`-token prompt, and decode steps run as engine/bench.py times them
(decode_and_sample). First, for every row, the wall time per step (median of 3 x `--steps`) in a
process that has not profiled yet: a profiler session leaves CUPTI attached and later launches slower.
Then each row is loaded again, warmed up, and `--steps` steps are recorded by torch.profiler (CPU and
CUDA activities): kineto/CUPTI sees every kernel in the process, the extension's and, on torch
2.11+cu130 / H200, those inside graph replays. Kernels are grouped by name without template
arguments. Per row: calls and device µs per step, exclusive (what the kernel adds to the busy time:
under programmatic dependent launch a kernel starts while its predecessor runs, and summed durations
count that wait twice) and summed, and the share of busy time; then busy time per step, the wall time,
and the gap wall - busy: what the host and the launches cost.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import date

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_API_CATEGORIES = ("cuda_runtime", "cuda_driver")
WARMUP_STEPS = 4
WALL_REPEATS = 3


def short_name(name: str) -> str:
    """A kernel's name without template arguments, parameter list or return type:
    'void hearth::gemv<4, bf16>(Args)' -> 'hearth::gemv'."""
    text = name.replace("(anonymous namespace)", "{anon}")
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    words = "".join(out).split("(")[0].split()
    return words[-1].replace("{anon}", "(anonymous namespace)") if words else name


def _exclusive_us(intervals) -> list:
    """Per (start, end) interval, in the given order, the time it adds to the device's busy time: the
    part after every earlier-starting interval has ended. With programmatic dependent launch a kernel
    starts (prefetches, then waits) while its predecessor still runs; this charges the overlap to the
    predecessor, so the shares add up to the busy time instead of counting the wait twice."""
    order = sorted(range(len(intervals)), key=lambda i: intervals[i])
    out = [0.0] * len(intervals)
    frontier = float("-inf")
    for i in order:
        s, e = intervals[i]
        out[i] = max(0.0, e - max(s, frontier))
        frontier = max(frontier, e)
    return out


def _is_kernel_launch(api_name: str) -> bool:
    return api_name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchCooperativeKernel"))


def aggregate(events, steps: int) -> dict:
    """Device events of a chrome trace -> rows per shortened kernel name (device time summed, and
    exclusive: what the kernel adds to the busy time), per-step totals, and the CUDA runtime/driver
    calls made from the host per step. Kernels with no host launch of their own came from a graph."""
    rows: dict = {}
    device = []
    api: dict = {}
    graph_id_kernels = 0
    arg_keys: set = set()
    for ev in events:
        cat, dur = ev.get("cat"), ev.get("dur")
        if ev.get("ph") != "X" or dur is None:
            continue
        if cat in DEVICE_CATEGORIES:
            full = ev.get("name", "?")
            key = short_name(full) if cat == "kernel" else full
            row = rows.setdefault(key, {"kernel": key, "kind": cat, "calls": 0, "device_us": 0.0,
                                        "exclusive_us": 0.0, "variants": set()})
            row["calls"] += 1
            row["device_us"] += float(dur)
            row["variants"].add(full)
            device.append((row, (float(ev["ts"]), float(ev["ts"]) + float(dur))))
            if cat == "kernel":
                args = ev.get("args") or {}
                arg_keys.update(args)
                if any("graph" in k.lower() and v not in (0, -1, None, "") for k, v in args.items()):
                    graph_id_kernels += 1
        elif cat in HOST_API_CATEGORIES:
            a = api.setdefault(ev.get("name", "?"), {"calls": 0, "host_us": 0.0})
            a["calls"] += 1
            a["host_us"] += float(dur)
    for (row, _), excl in zip(device, _exclusive_us([iv for _, iv in device])):
        row["exclusive_us"] += excl
    total = sum(r["device_us"] for r in rows.values())
    busy = sum(r["exclusive_us"] for r in rows.values())
    table = []
    for r in sorted(rows.values(), key=lambda r: -r["exclusive_us"]):
        table.append({"kernel": r["kernel"], "kind": r["kind"], "calls_per_step": r["calls"] / steps,
                      "us_per_step": r["device_us"] / steps, "exclusive_us_per_step": r["exclusive_us"] / steps,
                      "us_per_call": r["device_us"] / r["calls"],
                      "percent": 100.0 * r["exclusive_us"] / busy if busy else 0.0,
                      "variants": len(r["variants"]), "names": sorted(r["variants"])[:4]})
    runtime = {name: {"calls_per_step": a["calls"] / steps, "host_us_per_step": a["host_us"] / steps}
               for name, a in sorted(api.items(), key=lambda kv: -kv[1]["host_us"])}
    kernels = sum(r["calls"] for r in rows.values() if r["kind"] == "kernel")
    launches = sum(a["calls"] for name, a in api.items() if _is_kernel_launch(name))
    return {"kernels": table, "device_us_per_step": total / steps, "busy_us_per_step": busy / steps,
            "kernels_per_step": kernels / steps, "host_kernel_launches_per_step": launches / steps,
            "graph_kernels_per_step": max(0, kernels - launches) / steps if launches or api else None,
            "graph_id_kernels": graph_id_kernels, "kernel_arg_keys": sorted(arg_keys),
            "runtime_api": runtime}


def _trace_events(prof) -> list:
    """The profile's chrome-trace events (the documented export; field names are stable across torch)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f).get("traceEvents", [])


@contextlib.contextmanager
def _env(name: str, value):
    """`name` set to `value` (None: unset) within the block, restored after."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _prefill(runner, vocab: int, context: int, batch: int):
    """`batch` sequences holding a random `context`-token prompt each, and their first sampled tokens."""
    from engine.bench import _tokens
    from engine.sampling import GREEDY, SamplerState

    seqs, firsts = [], []
    for i in range(batch):
        seqs.append(runner.allocate_sequence())
        runner.prefill(seqs[-1], _tokens(context, vocab, 1000 + i))
        firsts.append(runner.sample([SamplerState.start(GREEDY)])[0])
    return seqs, firsts


def _walls(runner, seqs, firsts, context: int, steps: int) -> list:
    """Seconds per decode step (bench's timing: 4 warm-up steps, then `steps` timed), WALL_REPEATS times,
    each over the same positions context .. context + steps."""
    from engine.bench import _decode_rate

    out = []
    for _ in range(WALL_REPEATS):
        for s in seqs:
            runner.truncate(s, context)
        out.append(len(seqs) / _decode_rate(runner, seqs, firsts, steps))
    return out


def _load(path: str, graphs: str, steps: int, context: int, batch: int):
    """(info, runner) with decode graphs captured at load (graphs="on", the default) or not."""
    from engine.backends import cuda_native
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect

    info = inspect(path)
    if info.plan is None:
        raise ValueError(f"the engine cannot run this checkpoint ({info.plan_error})")
    options = RunnerOptions(context_length=context + WARMUP_STEPS + steps + 64, max_batch=batch)
    with _env("HEARTH_CUDA_GRAPHS", None if graphs == "on" else "0"):  # read at load
        return info, cuda_native.load_runner(info, info.plan, options)


def _free(runner) -> None:
    import torch

    runner.close()
    gc.collect()
    torch.cuda.empty_cache()


def measure_wall(path: str, graphs: str, steps: int, context: int, batch: int) -> dict:
    """Wall time per decode step, in a process that has not profiled yet: once a profiler session has
    run, CUPTI stays attached and every later launch (a graph launch most) costs more."""
    info, runner = _load(path, graphs, steps, context, batch)
    try:
        seqs, firsts = _prefill(runner, info.decoder.vocab_size, context, batch)
        walls = _walls(runner, seqs, firsts, context, steps)
        return {"graph_buckets": runner.graph_buckets(), "wall_us_per_step": 1e6 * statistics.median(walls),
                "wall_us_per_step_all": [1e6 * w for w in walls]}
    finally:
        _free(runner)


def profile_model(path: str, graphs: str, steps: int, context: int, batch: int) -> dict:
    """A fresh load of `path` (graphs on or off); `steps` decode steps recorded by torch.profiler after
    a warm-up, over the same positions as measure_wall; then the wall time again, profiler off."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.sampling import GREEDY, SamplerState

    info, runner = _load(path, graphs, steps, context, batch)
    try:
        row = {"model": path, "graphs": graphs, "graph_buckets": runner.graph_buckets(),
               "gemm_backend": runner.memory().get("gemm_backend"), "batch": batch, "context": context,
               "steps": steps}
        seqs, firsts = _prefill(runner, info.decoder.vocab_size, context, batch)
        states = [SamplerState.start(GREEDY) for _ in seqs]
        toks = list(firsts)
        for _ in range(WARMUP_STEPS):
            toks = runner.decode_and_sample(seqs, toks, states)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                toks = runner.decode_and_sample(seqs, toks, states)
            torch.cuda.synchronize()
            profiled = time.perf_counter() - start
        after = _walls(runner, seqs, firsts, context, steps)
    finally:
        _free(runner)
    row.update(aggregate(_trace_events(prof), steps))
    row["wall_us_per_step_profiled"] = 1e6 * profiled / steps
    row["wall_us_per_step_after_profiler"] = 1e6 * statistics.median(after)
    if graphs == "on" and not row["graph_buckets"]:
        row["note"] = "no decode graph was captured at load: this row ran without graphs"
    elif not row["kernels"]:
        row["note"] = ("the profiler saw no device kernels" + (" inside the graph replays (CUPTI did not report "
                       "them; try --cupti-warmup); only the graphs-off table has per-kernel figures"
                       if graphs == "on" else ""))
    return row


def print_row(r: dict, limit: int = 40) -> None:
    name = r["model"].rstrip("/").split("/")[-1]
    print(f"\n{name}: CUDA graphs {r['graphs']} (buckets {r['graph_buckets']}), batch {r['batch']}, "
          f"context {r['context']}, {r['steps']} steps, gemm {r['gemm_backend']}")
    if r.get("note"):
        print(f"NOTE: {r['note']}.")
    if r["kernels"]:
        print("| kernel | calls/step | µs/step (exclusive) | µs/step (summed) | µs/call | % busy |")
        print("|---|---|---|---|---|---|")
        for k in r["kernels"][:limit]:
            label = k["kernel"] + (f" ({k['variants']} variants)" if k["variants"] > 1 else "")
            print(f"| {label} | {k['calls_per_step']:.2f} | {k['exclusive_us_per_step']:.1f} | {k['us_per_step']:.1f} | "
                  f"{k['us_per_call']:.2f} | {k['percent']:.1f} |")
        if len(r["kernels"]) > limit:
            rest = r["kernels"][limit:]
            print(f"| ({len(rest)} more) | {sum(k['calls_per_step'] for k in rest):.2f} | "
                  f"{sum(k['exclusive_us_per_step'] for k in rest):.1f} | {sum(k['us_per_step'] for k in rest):.1f} | "
                  f"| {sum(k['percent'] for k in rest):.1f} |")
    graph_k = r["graph_kernels_per_step"]
    print(f"device per step: busy {r['busy_us_per_step']:.1f} µs (= the exclusive column), kernel durations summed "
          f"{r['device_us_per_step']:.1f} µs (more where kernels overlap, e.g. under programmatic dependent "
          f"launch); {r['kernels_per_step']:.0f} kernels, {r['host_kernel_launches_per_step']:.0f} launched from the "
          f"host" + (f", {graph_k:.0f} from graph replays" if graph_k is not None else ""))
    wall = r.get("wall_us_per_step")
    if wall is not None:
        walls = "/".join(f"{w:.0f}" for w in r["wall_us_per_step_all"])
        gap = (f"gap (host + launch = wall - busy) {r['gap_us_per_step']:.1f} µs "
               f"({100 * r['gap_us_per_step'] / wall:.0f} % of wall)" if r["kernels"] else "no gap without device times")
        print(f"wall per step, profiler never on: {wall:.1f} µs (median of {walls}); {gap}")
    print(f"wall per step under the profiler {r['wall_us_per_step_profiled']:.1f} µs, after it "
          f"{r['wall_us_per_step_after_profiler']:.1f} µs (CUPTI stays attached)")
    api = list(r["runtime_api"].items())[:6]
    if api:
        print("host CUDA API per step (under the profiler): " + ", ".join(
            f"{n} {a['calls_per_step']:.1f}x {a['host_us_per_step']:.1f} µs" for n, a in api))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.profile_decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="a checkpoint folder (repeatable)")
    parser.add_argument("--steps", type=int, default=64, help="decode steps recorded (and timed)")
    parser.add_argument("--context", type=int, default=256, help="prompt tokens prefilled per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoding together (also max_batch)")
    parser.add_argument("--graphs", default="both", choices=("both", "on", "off"))
    parser.add_argument("--cupti-warmup", action="store_true",
                        help="run an empty profiler session before the profiled loads (graph capture): the known "
                             "workaround when graph replays show no kernels; reported to hide all kernels on "
                             "some CUDA 13 stacks, and not needed on torch 2.11+cu130 / H200, hence off")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.context < 1 or args.batch < 1:
        parser.error("--steps, --context and --batch must be positive")
    from engine.backends import cuda_native

    ok, reason = cuda_native.available()
    if not ok:
        print(f"engine.tools.profile_decode profiles the cuda-native engine on an NVIDIA GPU, and cannot run "
              f"here: {reason}.", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("engine.tools.profile_decode needs torch with CUDA (its profiler reads the kernels), and torch "
              "sees no GPU here.", file=sys.stderr)
        return 2
    result = {"gpu": torch.cuda.get_device_name(0), "date": date.today().isoformat(), "torch": torch.__version__,
              "rows": []}
    rows = [(path, graphs) for path in args.model for graphs in (("on", "off") if args.graphs == "both"
                                                                   else (args.graphs,))]
    status = 0
    walls = {}
    # Every wall time first: a profiler session leaves CUPTI attached, slowing later launches.
    for key in rows:
        try:
            walls[key] = measure_wall(*key, args.steps, args.context, args.batch)
        except Exception as exc:  # reported with the profile below
            walls[key] = {"wall_error": f"{type(exc).__name__}: {exc}"}
            gc.collect()
            torch.cuda.empty_cache()
    if args.cupti_warmup:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            pass
    result["cupti_warmup"] = bool(args.cupti_warmup)
    for path, graphs in rows:
        try:
            row = profile_model(path, graphs, args.steps, args.context, args.batch)
            wall = walls[(path, graphs)]
            row.update({k: v for k, v in wall.items() if k != "graph_buckets"})
            if "wall_us_per_step" in wall:
                row["gap_us_per_step"] = wall["wall_us_per_step"] - row["busy_us_per_step"]
            print_row(row)
        except Exception as exc:  # one checkpoint failing must not lose the others' figures
            row = {"model": path, "graphs": graphs, "error": f"{type(exc).__name__}: {exc}"}
            print(f"{path} (graphs {graphs}): {row['error']}", file=sys.stderr)
            status = 1
            gc.collect()
            torch.cuda.empty_cache()
        result["rows"].append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        sys.stdout.flush()
    return status

if __name__ == "__main__":
    sys.exit(main())
