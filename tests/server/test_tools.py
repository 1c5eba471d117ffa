"""Tools through a chat template that supports them: the default model's weights and tokenizer, given a
Hermes-style template that renders `tools` (the default model's own template has none: see the 400 in
test_server.py)."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

TEMPLATE = """{%- if tools %}<|im_start|>system
You can call these functions: {{ tools | tojson }}
To call one, reply with <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.<|im_end|>
{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                   "required": ["zone"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_server(default_model, hearth_home, tmp_path_factory):
    from pathlib import Path

    from engine import Engine
    from engine.server import Server, ServerConfig

    folder = tmp_path_factory.mktemp("smollm2-tools") / "smollm2-tools"
    folder.mkdir()
    for f in Path(default_model.path).iterdir():
        if f.name != "manifest.json":
            (folder / f.name).symlink_to(f)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    engine = Engine(backend="torch", home=hearth_home)
    handle = engine.load_model(folder)
    srv = Server(engine, ServerConfig(port=0, models=None)).start()
    yield srv, handle.id
    srv.stop()
    engine.unload(handle.id)


def _client(srv):
    return openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)


def test_required_tool_choice_gives_a_valid_call(tools_server):
    srv, model = tools_server
    reply = _client(srv).chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                                 temperature=0, max_tokens=60)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_named_tool_choice_picks_that_function_and_streams(tools_server):
    srv, model = tools_server
    chunks = list(_client(srv).chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=60, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_time"}}))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0].function.arguments), TIME["function"]["parameters"])
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_auto_and_none_reply_in_text_or_valid_calls(tools_server):
    srv, model = tools_server
    for choice in ("auto", "none"):
        reply = _client(srv).chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=choice,
                                                     temperature=0, max_tokens=40)
        message = reply.choices[0].message
        for call in message.tool_calls or []:
            assert choice == "auto" and call.function.name == "get_weather"
        assert message.tool_calls or message.content


def test_bad_tools_are_400(tools_server):
    srv, model = tools_server
    for body, param in (({"tools": [{"type": "function"}]}, "tools[0]"),
                        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                         "tool_choice"),
                        ({"tools": "get_weather"}, "tools")):
        r = httpx.post(f"{srv.url}/chat/completions", json={"model": model, "messages": ASK, **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
