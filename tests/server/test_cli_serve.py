"""`hearth serve` as a person runs it: a real process, stopped with Ctrl-C (SIGINT)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import openai

from conftest_helpers import MODEL


def _serve(hearth_home, *args):
    env = {**os.environ, "HEARTH_HOME": str(hearth_home)}
    return subprocess.Popen([sys.executable, "-m", "engine", "serve", "--backend", "torch", *args], env=env,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)


def test_hearth_serve_answers_and_stops_on_ctrl_c(default_model, hearth_home):
    proc = _serve(hearth_home, "--port", "0", "--model", MODEL, "--api-key", "k-1")
    try:
        line = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "Hearth serves" not in line:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
        match = re.search(r"on (http://127\.0\.0\.1:\d+/v1) \(torch, API key required\)", line)
        assert match, line
        client = openai.OpenAI(base_url=match.group(1), api_key="k-1", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == [MODEL]
        reply = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
        assert reply.usage.completion_tokens == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_hearth_serve_refuses_a_model_not_in_the_library(default_model, hearth_home):
    proc = _serve(hearth_home, "--port", "0", "--model", "no-such-model")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "No model 'no-such-model' in the library" in err
