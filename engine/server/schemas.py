"""Request bodies of the OpenAI API, checked field by field into what the engine takes.

Each refusal is a 400 in OpenAI's shape naming the field (`param`). Fields Hearth does not implement
(`n` > 1, `logprobs`, presence / frequency penalties, `echo`, ...) are refused by name rather than
silently ignored; fields that change nothing about the reply (`user`, `metadata`, ...) are accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..sampling import SamplingParams
from .errors import APIError, bad_param

IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prediction", "modalities",
           "reasoning_effort", "logit_bias_ignored"}
SAMPLING = {"temperature", "top_p", "seed", "stop", "top_k", "min_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "n", "logit_bias"}
CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
               "response_format", "tools", "tool_choice"} | SAMPLING | IGNORED
COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "stream", "stream_options", "echo", "suffix", "best_of",
                     "response_format"} | SAMPLING | IGNORED
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class ParsedRequest:
    model: str
    params: SamplingParams
    stream: bool
    include_usage: bool
    messages: Optional[list] = None        # chat
    prompt: Any = None                     # completions: text or token ids
    response_format: Optional[dict] = None
    tools: Optional[list] = None
    tool_choice: Any = None
    extras: dict = field(default_factory=dict)


def _number(body: dict, name: str, low: float, high: float, default, integer: bool = False,
            low_open: bool = False):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise bad_param(name, f"'{name}' must be {'an integer' if integer else 'a number'}, not {value!r}.",
                        code="invalid_type")
    if value < low or value > high or (low_open and value == low):
        bound = f"{'greater than' if low_open else 'at least'} {low} and at most {high}"
        raise bad_param(name, f"'{name}' must be {bound}; got {value}.")
    return value


def _refuse_unknown(body: dict, allowed: set) -> None:
    for name in body:
        if name not in allowed:
            raise bad_param(name, f"Unrecognized request argument supplied: {name}.", code="unknown_parameter")


def _unsupported(body: dict) -> None:
    """Fields whose non-default values Hearth does not implement: refused by name."""
    n = body.get("n")
    if n not in (None, 1):
        raise bad_param("n", "Hearth returns one choice per request: 'n' must be 1.", code="unsupported_value")
    if body.get("best_of") not in (None, 1):
        raise bad_param("best_of", "'best_of' must be 1.", code="unsupported_value")
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value not in (None, 0, 0.0):
            raise bad_param(name, f"'{name}' is not supported by Hearth; use 'repetition_penalty' "
                            "(1.0 = off, e.g. 1.1) instead.", code="unsupported_parameter")
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        name = "logprobs" if body.get("logprobs") not in (None, False, 0) else "top_logprobs"
        raise bad_param(name, f"'{name}' is not supported by Hearth yet.", code="unsupported_parameter")
    if body.get("logit_bias"):
        raise bad_param("logit_bias", "'logit_bias' is not supported by Hearth.", code="unsupported_parameter")
    if body.get("echo"):
        raise bad_param("echo", "'echo' is not supported by Hearth.", code="unsupported_parameter")
    if body.get("suffix"):
        raise bad_param("suffix", "'suffix' (fill in the middle) is not supported by Hearth.",
                        code="unsupported_parameter")


def _stop(body: dict) -> tuple:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_param("stop", "'stop' must be a non-empty string or a list of them.", code="invalid_type")
    if len(stop) > 4:
        raise bad_param("stop", f"'stop' takes at most 4 sequences; got {len(stop)}.")
    return tuple(stop)


def _sampling(body: dict, max_tokens: int, max_tokens_limit: int) -> SamplingParams:
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad_param("seed", f"'seed' must be an integer, not {seed!r}.", code="invalid_type")
    return SamplingParams(
        temperature=float(_number(body, "temperature", 0, 2, 1.0)),
        top_p=float(_number(body, "top_p", 0, 1, 1.0, low_open=True)),
        top_k=int(_number(body, "top_k", 0, 1 << 20, 0, integer=True)),
        min_p=float(_number(body, "min_p", 0, 1, 0.0)),
        repetition_penalty=float(_number(body, "repetition_penalty", 0, 10, 1.0, low_open=True)),
        seed=None if seed is None else seed & 0x7FFFFFFFFFFFFFFF,
        max_tokens=max_tokens, stop=_stop(body))


def _max_tokens(body: dict, names: tuple, limit: int) -> int:
    for name in names:
        if body.get(name) is not None:
            return int(_number(body, name, 1, limit, limit, integer=True))
    return limit


def _stream_options(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_param("stream", "'stream' must be true or false.", code="invalid_type")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise bad_param("stream_options", "'stream_options' must be an object.", code="invalid_type")
    if not stream:
        raise bad_param("stream_options", "'stream_options' is only allowed when 'stream' is true.")
    return stream, bool(options.get("include_usage", False))


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_param("model", "'model' is required: the id of a model from GET /v1/models.",
                        code="missing_required_parameter" if model is None else "invalid_type")
    return model


def _content_text(content, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_param(f"messages[{index}].content",
                                f"Only text content parts are supported; messages[{index}] has a {kind!r} part.",
                                code="unsupported_value")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_param(f"messages[{index}].content", "A message's content must be a string or a list of text parts.",
                    code="invalid_type")


def _messages(body: dict) -> list:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_param("messages", "'messages' must be a non-empty list of {role, content} objects.",
                        code="missing_required_parameter" if messages is None else "invalid_type")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_param(f"messages[{i}]", f"messages[{i}] must be an object.", code="invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad_param(f"messages[{i}].role", f"messages[{i}].role must be one of {', '.join(ROLES)}; "
                            f"got {role!r}.")
        message = {"role": "system" if role == "developer" else role, "content": _content_text(m.get("content"), i)}
        for key in ("tool_calls", "tool_call_id", "name"):
            if m.get(key) is not None:
                message[key] = m[key]
        out.append(message)
    return out


def _response_format(body: dict) -> Optional[dict]:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_param("response_format", "'response_format' must be {\"type\": \"text\" | \"json_object\" | "
                        "\"json_schema\"}.")
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise bad_param("response_format", "response_format.json_schema must be an object with a "
                            "'schema' object.")
    return fmt


def parse_chat(body: dict, max_tokens_limit: int) -> ParsedRequest:
    _refuse_unknown(body, CHAT_FIELDS)
    _unsupported(body)
    model = _model(body)
    messages = _messages(body)
    stream, include_usage = _stream_options(body)
    max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens"), max_tokens_limit)
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise bad_param("tools", "'tools' must be a list of tool objects.", code="invalid_type")
    return ParsedRequest(model, _sampling(body, max_tokens, max_tokens_limit), stream, include_usage,
                         messages=messages, response_format=_response_format(body), tools=tools or None,
                         tool_choice=body.get("tool_choice"))


def parse_completion(body: dict, max_tokens_limit: int) -> ParsedRequest:
    _refuse_unknown(body, COMPLETION_FIELDS)
    _unsupported(body)
    model = _model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    valid_ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not valid_ids:
        raise bad_param("prompt", "'prompt' must be a non-empty string (or one list of token ids); "
                        "several prompts per request are not supported.",
                        code="missing_required_parameter" if prompt is None else "invalid_type")
    stream, include_usage = _stream_options(body)
    max_tokens = _max_tokens(body, ("max_tokens",), max_tokens_limit)
    if body.get("max_tokens") is None:
        max_tokens = min(16, max_tokens_limit)   # OpenAI's default for completions
    return ParsedRequest(model, _sampling(body, max_tokens, max_tokens_limit), stream, include_usage,
                         prompt=prompt, response_format=_response_format(body))


def require_object(body) -> dict:
    if not isinstance(body, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    return body
