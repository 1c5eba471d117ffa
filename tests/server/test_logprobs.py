"""logprobs / top_logprobs: the raw model distribution of each drawn token, in both OpenAI shapes."""
from __future__ import annotations

import math

import httpx
import numpy as np

from conftest_helpers import MODEL

HELLO = [{"role": "user", "content": "Name three colours."}]


def test_chat_logprobs_match_the_model_scored_alone(client, default_engine):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0, logprobs=True,
                                           top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens == 8
    assert "".join(e.token for e in entries) == reply.choices[0].message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
        assert e.top_logprobs[0].token == e.token            # greedy: the drawn token is the most likely
        assert bytes(e.bytes).decode() == e.token
    # the same figures from teacher-forced scoring of prompt + reply
    tokenizer = default_engine.tokenizer(MODEL)
    prompt = default_engine.conversation_tokens(MODEL, HELLO)
    reply_ids = [tokenizer.inner.token_to_id(tokenizer.inner.id_to_token(tokenizer.encode(e.token)[0]))
                 for e in entries]
    logits = default_engine.score(MODEL, prompt + reply_ids).astype(np.float64)
    rows = logits[len(prompt) - 1:len(prompt) - 1 + len(reply_ids)]
    log_softmax = rows - np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1, keepdims=True)) - rows.max(1, keepdims=True)
    expected = [log_softmax[i, t] for i, t in enumerate(reply_ids)]
    assert np.allclose([e.logprob for e in entries], expected, atol=2e-3)


def test_streamed_chat_logprobs_cover_every_token(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10, temperature=0.9, seed=4,
                                                 logprobs=True, stream=True, stream_options={"include_usage": True}))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(entries) == chunks[-1].usage.completion_tokens
    assert "".join(e.token for e in entries) == text
    assert all(e.top_logprobs == [] and e.logprob <= 0 for e in entries)


def test_completion_logprobs_shape(client):
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
                                      logprobs=2)
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text and len(lp.tokens) == reply.usage.completion_tokens
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) <= 2 and max(top.values()) >= lp.token_logprobs[i] - 1e-9 for i, top in enumerate(lp.top_logprobs))
    assert all(math.exp(v) <= 1 for v in lp.token_logprobs)
    without = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert without.choices[0].logprobs is None and without.choices[0].text == reply.choices[0].text


def test_bad_completion_logprobs_are_400(server):
    for value, code in ((9, "invalid_value"), (True, "invalid_type")):
        r = httpx.post(f"{server.url}/completions", json={"model": MODEL, "prompt": "x", "logprobs": value}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs" and r.json()["error"]["code"] == code
