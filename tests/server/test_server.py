"""The OpenAI-compatible server over real HTTP with the official client."""
from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from conftest_helpers import MODEL, chat_stream_text

HELLO = [{"role": "user", "content": "Name three colours."}]


def test_models_lists_the_library(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL in ids


def test_chat_whole_equals_the_engine_alone_and_usage_counts_its_tokens(client, alone):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    text, stats = alone(HELLO, temperature=0, max_tokens=12)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == text and text
    assert reply.usage.completion_tokens == stats.generated_tokens == 12
    assert reply.usage.prompt_tokens == stats.prompt_tokens
    assert reply.usage.total_tokens == stats.prompt_tokens + 12
    assert reply.choices[0].finish_reason == "length"


def test_chat_stream_equals_whole_and_reports_usage_last(client):
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_ends_with_done_on_the_wire(server):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    assert json.loads(lines[0][6:])["object"] == "chat.completion.chunk"


def test_completions_whole_and_stream(client, default_engine):
    prompt = "The capital of France is"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == whole.choices[0].text
    assert whole.usage.prompt_tokens == len(default_engine.tokenizer(MODEL).encode(prompt))
    assert whole.usage.completion_tokens == 8


def test_completions_default_to_16_tokens(client):
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0)
    assert reply.usage.completion_tokens <= 16


def test_same_seed_same_text_other_seed_other_text(client):
    def sample(seed):
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell a story."}],
                                              max_tokens=16, temperature=1.2, seed=seed).choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(s) != first for s in (1, 2, 3))


def test_stop_is_honoured(client):
    free = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=20, temperature=0)
    text = free.choices[0].message.content
    words = [w for w in text.split() if len(w) > 3]
    cut = words[len(words) // 2]
    stopped = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=20, temperature=0, stop=[cut])
    assert stopped.choices[0].message.content == text[:text.index(cut)]
    assert stopped.choices[0].finish_reason == "stop"
    assert cut not in stopped.choices[0].message.content


def test_content_as_text_parts(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name three "}, {"type": "text", "text": "colours."}]}]
    a = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=6, temperature=0)
    b = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_eight_concurrent_streams_each_equal_to_its_result_alone(server, alone):
    prompts = [[{"role": "user", "content": f"Write a sentence about the number {i}."}] for i in range(8)]
    expected = [alone(p, temperature=0, max_tokens=14)[0] for p in prompts]
    results: list = [None] * 8
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)
    barrier = threading.Barrier(8)

    def run(i):
        barrier.wait()
        results[i] = chat_stream_text(client, prompts[i], max_tokens=14)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results == expected


def test_disconnect_mid_stream_frees_the_session(server, default_engine):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 400, "temperature": 0.8, "seed": 5, "stream": True}
    before = len(server.host.finished)
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=120) as r:
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen += 1
            if seen >= 4:
                break                     # leaving the block closes the connection
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(server.host.finished) == before:
        time.sleep(0.05)
    stats = server.host.finished[-1]
    assert stats.stop_reason == "cancelled"
    assert stats.generated_tokens < 400
    while time.monotonic() < deadline and default_engine.activity(MODEL) != {"sessions": 0, "waiting": 0, "running": 0}:
        time.sleep(0.05)
    assert default_engine.activity(MODEL) == {"sessions": 0, "waiting": 0, "running": 0}
    assert server.host.log[-1].finish == "disconnected"


# ------------------------------------------------------------------------------------------------ errors
def _error(server, body, path="/chat/completions", content=None, headers=None, method="POST"):
    r = httpx.request(method, f"{server.url}{path}", json=body if content is None else None, content=content,
                      headers=headers, timeout=120)
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return r.status_code, error


@pytest.mark.parametrize("body, param, code", [
    ({"messages": HELLO}, "model", "missing_required_parameter"),
    ({"model": MODEL}, "messages", "missing_required_parameter"),
    ({"model": MODEL, "messages": "hi"}, "messages", "invalid_type"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content",
     "unsupported_value"),
    ({"model": MODEL, "messages": HELLO, "temperature": 5}, "temperature", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "temperature": "hot"}, "temperature", "invalid_type"),
    ({"model": MODEL, "messages": HELLO, "top_p": 0}, "top_p", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "max_tokens": 10 ** 6}, "max_tokens", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "max_completion_tokens": 10 ** 6}, "max_completion_tokens", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "n": 2}, "n", "unsupported_value"),
    ({"model": MODEL, "messages": HELLO, "presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
    ({"model": MODEL, "messages": HELLO, "frequency_penalty": 0.5}, "frequency_penalty", "unsupported_parameter"),
    ({"model": MODEL, "messages": HELLO, "logprobs": True}, "logprobs", "unsupported_parameter"),
    ({"model": MODEL, "messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "wibble": 1}, "wibble", "unknown_parameter"),
    ({"model": MODEL, "messages": HELLO, "response_format": {"type": "xml"}}, "response_format", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"model": MODEL, "messages": HELLO, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     "unsupported_parameter"),
])
def test_bad_parameters_are_400_naming_the_field(server, body, param, code):
    status, error = _error(server, body)
    assert (status, error["type"], error["param"], error["code"]) == (400, "invalid_request_error", param, code)


def test_bad_json_is_400(server):
    status, error = _error(server, None, content=b"{not json", headers={"content-type": "application/json"})
    assert (status, error["code"]) == (400, "invalid_json")
    status, error = _error(server, None, content=b"[1, 2]", headers={"content-type": "application/json"})
    assert (status, error["code"]) == (400, "invalid_json")


def test_unknown_model_is_404_with_the_client_error_type(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert caught.value.body["code"] == "model_not_found" and "no-such-model" in caught.value.body["message"]


def test_context_overflow_is_400(client, default_engine):
    long = "apple " * (default_engine.context_limit(MODEL) + 10)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=long, max_tokens=4)
    assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "prompt"


def test_bad_completion_prompts(server):
    for prompt in ("", ["a", "b"], None, [1, -3]):
        status, error = _error(server, {"model": MODEL, "prompt": prompt}, path="/completions")
        assert (status, error["param"]) == (400, "prompt")
    status, error = _error(server, {"model": MODEL, "prompt": "x", "echo": True}, path="/completions")
    assert (status, error["param"]) == (400, "echo")


def test_unknown_route_and_method(server):
    status, error = _error(server, None, path="/embeddings", content=b"{}")
    assert (status, error["code"]) == (404, "not_found")
    status, error = _error(server, None, path="/models", content=b"{}", method="POST")
    assert (status, error["code"]) == (405, "method_not_allowed")


def test_body_over_the_bound_is_413(server):
    big = b'{"model": "x", "messages": [], "pad": "' + b"x" * (server.config.max_body_bytes + 10) + b'"}'
    status, error = _error(server, None, content=big, headers={"content-type": "application/json"})
    assert (status, error["code"]) == (413, "request_too_large")


def test_a_model_that_does_not_fit_is_503_out_of_memory(default_model, hearth_home):
    from engine import Engine
    from engine.server import Server, ServerConfig

    class TinyMachine(Engine):
        """An engine on a machine with 1 MiB free: the memory plan's check refuses every load."""

        def free_memory(self):
            return 1 << 20, 1 << 20, "RAM"

    srv = Server(TinyMachine(backend="torch", home=hearth_home), ServerConfig(port=0)).start()
    try:
        status, error = _error(srv, {"model": MODEL, "messages": HELLO})
    finally:
        srv.stop()
    assert (status, error["type"], error["code"]) == (503, "server_error", "out_of_memory")


# ------------------------------------------------------------------------------------------------ guards
def test_api_key_is_required_when_set(keyed_server):
    for key in ("wrong-key", ""):
        anonymous = openai.OpenAI(base_url=keyed_server.url, api_key=key or "x", max_retries=0)
        if not key:
            anonymous = openai.OpenAI(base_url=keyed_server.url, api_key="x", max_retries=0,
                                      default_headers={"Authorization": ""})
        with pytest.raises(openai.AuthenticationError) as caught:
            anonymous.models.list()
        assert caught.value.body["code"] == "invalid_api_key"
    keyed = openai.OpenAI(base_url=keyed_server.url, api_key="sesame-123", max_retries=0, timeout=120)
    assert MODEL in [m.id for m in keyed.models.list().data]
    reply = keyed.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, temperature=0)
    assert reply.usage.completion_tokens == 2


def test_foreign_host_header_is_refused(server):
    r = httpx.get(f"{server.url}/models", headers={"Host": "attacker.example:8765"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "localhost"):
        assert httpx.get(f"{server.url}/models", headers={"Host": host}).status_code == 200


def test_cors_is_off_by_default(server):
    r = httpx.get(f"{server.url}/models", headers={"Origin": "https://example.com"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_when_enabled(default_engine):
    from engine.server import Server, ServerConfig

    srv = Server(default_engine, ServerConfig(port=0, cors_origins=["https://ok.example"])).start()
    try:
        r = httpx.get(f"{srv.url}/models", headers={"Origin": "https://ok.example"})
        assert r.headers["access-control-allow-origin"] == "https://ok.example"
        r = httpx.get(f"{srv.url}/models", headers={"Origin": "https://other.example"})
        assert "access-control-allow-origin" not in r.headers
    finally:
        srv.stop()


def test_request_log_records_each_request(server, client):
    n = len(server.host.log)
    client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3, temperature=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HELLO)
    ok, missing = list(server.host.log)[n:n + 2]
    assert (ok.status, ok.model, ok.completion_tokens, ok.finish) == (200, MODEL, 3, "max-tokens")
    assert (missing.status, missing.model) == (404, "nope")


def test_port_in_use_is_a_clear_error(server, default_engine):
    from engine.server import Server, ServerConfig, ServerUnavailable

    with pytest.raises(ServerUnavailable, match="could not listen"):
        Server(default_engine, ServerConfig(port=server.port)).start(timeout=10)


def test_host_check_unit():
    from engine.server.app import ServerConfig, _host_allowed

    local = ServerConfig()
    assert _host_allowed("127.0.0.1:8765", local) and _host_allowed("[::1]:8765", local)
    assert _host_allowed("LOCALHOST", local)
    assert not _host_allowed("evil.com", local) and not _host_allowed("localhost.evil.com:8765", local)
    assert not _host_allowed("", local)
    everywhere = ServerConfig(host="0.0.0.0", allowed_hosts=["box.lan"])
    assert _host_allowed("192.168.1.20:8765", everywhere) and _host_allowed("box.lan", everywhere)
    assert not _host_allowed("rebind.evil.com", everywhere)
