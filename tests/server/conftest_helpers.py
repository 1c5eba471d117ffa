"""Helpers the server tests share (imported by name: tests/server/conftest.py puts this folder on sys.path)."""
MODEL = "smollm2-135m-instruct"


def chat_stream_text(client, messages, **params) -> str:
    params.setdefault("temperature", 0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, stream=True, **params)
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
