"""`hearth bench --serve`: aggregate decode over HTTP against in-process batching, at several client counts.

    hearth bench --serve --backend cuda-native --model PATH [--clients 8 32] [--max-tokens 256]

For each client count N: N replies run at once in-process (N threads consuming Engine.generate_tokens,
batched by the model's scheduler), then the same N requests go over HTTP to `hearth serve` on
127.0.0.1 from a separate client process (asyncio + httpx streaming, so the clients' parsing does not
take the server's interpreter lock). Aggregate decode = all completion tokens / the wall time of the
round. Greedy decoding, so both rounds produce the same tokens.

TTFT over HTTP is the client's time to the first chunk with text. A reply whose tokens decode to no text
(a synthetic checkpoint's byte tokenizer covers a few hundred of the model's ids; the server streams no
empty deltas) has none: then the HTTP column shows the engine's own TTFT of those requests (as the
in-process column does), marked "(engine)", and the JSON says which (ttft_source).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time


def _prompts(n: int) -> list:
    topics = ("the sea", "a clock", "mountains", "a city at night", "bread", "a library", "rain", "an old map")
    return [[{"role": "user", "content": f"Write a long, detailed story about {topics[i % len(topics)]} "
              f"and the number {i}."}] for i in range(n)]


def in_process(engine, model_id: str, n: int, max_tokens: int) -> dict:
    from ..engine import Finished
    from ..sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    tokens = [engine.conversation_tokens(model_id, p) for p in _prompts(n)]
    results: list = [None] * n
    barrier = threading.Barrier(n + 1)

    def run(i):
        barrier.wait()
        for event in engine.generate_tokens(model_id, tokens[i], params):
            if isinstance(event, Finished):
                results[i] = event.stats

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    generated = sum(s.generated_tokens for s in results)
    return {"clients": n, "tokens": generated, "wall_s": wall, "aggregate_tok_s": generated / wall,
            "ttft_p50_ms": 1000 * statistics.median(s.ttft_s for s in results)}


async def _http_round(url: str, model: str, n: int, max_tokens: int, key: str) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    results: list = [None] * n
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600), limits=limits, headers=headers) as client:
        start = asyncio.Event()

        async def one(i, messages):
            await start.wait()
            body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}
            sent = time.perf_counter()
            first, usage = None, None
            async with client.stream("POST", f"{url}/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    elif first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                        first = time.perf_counter()
            if usage is None:
                raise RuntimeError("the stream ended without a usage chunk")
            results[i] = {"ttft_s": None if first is None else first - sent, "tokens": usage["completion_tokens"]}

        tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(_prompts(n))]
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        start.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
    generated = sum(r["tokens"] for r in results)
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    return {"clients": n, "tokens": generated, "wall_s": wall, "aggregate_tok_s": generated / wall,
            "ttft_p50_ms": 1000 * statistics.median(ttfts) if len(ttfts) == n else None,
            "ttft_source": "client", "replies_with_text": len(ttfts)}


def over_http(url: str, model: str, n: int, max_tokens: int, key: str = "") -> dict:
    """One round of N streaming clients, run in a child process."""
    spec = json.dumps({"url": url, "model": model, "n": n, "max_tokens": max_tokens, "key": key})
    out = subprocess.run([sys.executable, "-m", "engine.server.bench", "--client-round", spec],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the client process failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="hearth bench --serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true", help="(selects this benchmark)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a library id or a checkpoint folder")
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "cuda-native"])
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--client-round", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client_round:
        spec = json.loads(args.client_round)
        print(json.dumps(asyncio.run(_http_round(spec["url"], spec["model"], spec["n"], spec["max_tokens"],
                                                 spec["key"]))))
        return 0

    from ..engine import Engine
    from . import Server, ServerConfig

    batch = max(args.clients)
    engine = Engine(backend=args.backend, max_batch=batch, context_length=args.context,
                    resident_sessions=max(4, batch))
    if args.model == "smollm2-135m-instruct":
        engine.install_default_model()
    handle = engine.load_model(args.model)
    server = Server(engine, ServerConfig(port=0, max_tokens=max(4096, args.max_tokens))).start()
    print(f"{handle.id} on {handle.backend}, max batch {batch}, {args.max_tokens} tokens per reply, "
          f"server {server.url}")
    try:
        print(f"{'clients':>7} {'in-process tok/s':>17} {'HTTP tok/s':>11} {'HTTP/in-process':>16} "
              f"{'TTFT p50 in/HTTP ms':>20}")
        for n in args.clients:
            # Warm-up at this client count, both ways: the first round at a batch size meets its decode
            # buckets (graph capture, allocations) and would be charged to whichever path ran first.
            in_process(engine, handle.id, n, 16)
            over_http(server.url, handle.id, n, 16)
            local = in_process(engine, handle.id, n, args.max_tokens)
            remote = over_http(server.url, handle.id, n, args.max_tokens)
            mark = ""
            if remote["ttft_p50_ms"] is None:    # some replies streamed no text: the engine's TTFT of them
                stats = list(server.host.finished)[-n:]
                remote.update(ttft_p50_ms=1000 * statistics.median(s.ttft_s for s in stats), ttft_source="engine")
                mark = " (engine)"
            print(f"{n:>7} {local['aggregate_tok_s']:>17.1f} {remote['aggregate_tok_s']:>11.1f} "
                  f"{remote['aggregate_tok_s'] / local['aggregate_tok_s']:>15.1%} "
                  f"{local['ttft_p50_ms']:>9.0f} / {remote['ttft_p50_ms']:.0f}{mark}")
            print(json.dumps({"in_process": local, "http": remote}))
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
