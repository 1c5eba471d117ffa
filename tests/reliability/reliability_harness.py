"""Run work items in a child process under a watchdog: a hang or a crash is a result, not a stuck CI.

`run_watched(command, items, timeout_s)` starts `command + items`; the child prints "start ITEM"
before each item and "result {json}" after it. If no line arrives for timeout_s the child is killed
and the item is recorded as a hang; if the child dies the item is a crash. Either way a fresh child
carries on with the items left. The timeout bounds a case; nothing asserts how long a case took.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_watched(command: list, items: list, timeout_s: float = 120.0, env: dict | None = None) -> dict:
    """item -> its result dict, or {"hang": True} / {"crash": returncode, "stderr": ...}."""
    results: dict = {}
    remaining = list(items)
    while remaining:
        before = len(results)
        proc = subprocess.Popen(command + remaining, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO, env={**os.environ, **(env or {})}, start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
        errors: list = []
        threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()
        current = None
        while True:
            try:
                line = lines.get(timeout=timeout_s)
            except queue.Empty:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                results[current or remaining[0]] = {"hang": True}
                break
            if line is None:
                code = proc.wait()
                if current is not None:
                    results[current] = {"crash": code, "stderr": "".join(errors)[-2000:]}
                elif remaining and code != 0:
                    results[remaining[0]] = {"crash": code, "stderr": "".join(errors)[-2000:]}
                break
            if line.startswith("start "):
                current = line[6:].strip()
            elif line.startswith("hang ") and current is not None:     # the child's own watchdog fired
                results[current] = {"hang": True, **json.loads(line[5:])}
                current = None
            elif line.startswith("result "):
                results[current] = json.loads(line[7:])
                current = None
        proc.stdout.close()
        proc.stderr.close()
        if len(results) == before:      # the child ended without taking the next item
            results[remaining[0]] = {"crash": proc.returncode, "stderr": "".join(errors)[-2000:]}
        remaining = [i for i in items if i not in results]
    return results


def python() -> str:
    return sys.executable
