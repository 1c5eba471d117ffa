"""A bounded load test on loopback: 16 clients x 20 short requests, each client in its own thread with
the official client. No errors, every reply complete, the engine idle afterwards, memory flat. Time to
first token is printed (p50 / p99), never asserted."""
from __future__ import annotations

import statistics
import threading
import time

import openai
import pytest

from conftest_helpers import MODEL

CLIENTS, REQUESTS = 16, 20


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _round(server, clients: int, requests: int) -> tuple[list, list]:
    ttfts, errors = [], []
    lock = threading.Lock()

    def client_loop(c):
        api = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=600)
        for r in range(requests):
            try:
                sent = time.perf_counter()
                first, usage, text = None, None, ""
                if (c + r) % 2:
                    stream = api.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"Say {c}-{r}."}], max_tokens=4,
                        temperature=0.7, seed=c * 100 + r, stream=True, stream_options={"include_usage": True})
                    for chunk in stream:
                        if chunk.usage:
                            usage = chunk.usage
                        elif chunk.choices and chunk.choices[0].delta.content:
                            first = first or time.perf_counter()
                            text += chunk.choices[0].delta.content
                else:
                    stream = api.completions.create(model=MODEL, prompt=f"Number {c} {r}:", max_tokens=4,
                                                    temperature=0.7, seed=r, stream=True,
                                                    stream_options={"include_usage": True})
                    for chunk in stream:
                        if chunk.usage:
                            usage = chunk.usage
                        elif chunk.choices and chunk.choices[0].text:
                            first = first or time.perf_counter()
                            text += chunk.choices[0].text
                if usage is None or not 1 <= usage.completion_tokens <= 4:
                    raise AssertionError(f"client {c} request {r}: usage {usage}")
                with lock:
                    ttfts.append((first or time.perf_counter()) - sent)
            except Exception as exc:  # noqa: BLE001 - collected and reported
                with lock:
                    errors.append(f"client {c} request {r}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1200)
    return ttfts, errors


@pytest.mark.slow
def test_sixteen_clients_twenty_requests_each(server, default_engine):
    _round(server, CLIENTS, 1)                       # warm-up: threads, connections, allocator pools
    rss_before = _rss_bytes()
    finished_before = len(server.host.finished)
    started = time.perf_counter()
    ttfts, errors = _round(server, CLIENTS, REQUESTS)
    wall = time.perf_counter() - started
    rss_after = _rss_bytes()
    assert errors == []
    assert len(ttfts) == CLIENTS * REQUESTS
    assert len(server.host.finished) - finished_before == CLIENTS * REQUESTS
    assert default_engine.activity(MODEL) == {"sessions": 0, "waiting": 0, "running": 0}
    assert server.host.active == 0
    ttfts.sort()
    print(f"\nload: {CLIENTS} clients x {REQUESTS} requests in {wall:.1f} s; time to first token p50 "
          f"{1000 * statistics.median(ttfts):.0f} ms, p99 {1000 * ttfts[int(0.99 * (len(ttfts) - 1))]:.0f} ms; "
          f"RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB")
    # flat: 320 requests may not keep more than 64 MiB (a leak of a reply's state would show many times that)
    assert rss_after - rss_before < 64 * 2**20
