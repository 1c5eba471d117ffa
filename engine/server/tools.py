"""Tools (function calling) through the model's own chat template.

A template that reads `tools` renders them (Hermes / Qwen / Llama 3.1 style); one that does not gets a
clear 400 naming `tools`. `tool_choice` "required" or a named function constrains the reply to the
call's JSON ({"name", "arguments"}) by the same grammar as `response_format`; "auto" lets the model
choose, and a `<tool_call>{...}</tool_call>` block (or a reply that is just such an object) becomes a
tool call in the response.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Optional

from ..errors import ChatTemplateError
from .errors import bad_param


@dataclass
class ChatPlan:
    tokens: list
    constraint: object = None
    tools: Optional[list] = None            # the function definitions offered, when any


def _supports_tools(template_source: str) -> bool:
    return bool(re.search(r"\btools\b", template_source or ""))


def _functions(tools: list) -> list:
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if tool.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_param(f"tools[{i}]", f"tools[{i}] must be {{\"type\": \"function\", \"function\": "
                            "{\"name\": ..., \"parameters\": {...}}}.")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise bad_param(f"tools[{i}].function.parameters", "A function's parameters must be a JSON schema object.")
        out.append({"name": fn["name"], "description": fn.get("description", ""), "parameters": params})
    return out


def _call_schema(functions: list) -> dict:
    variants = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
                 "required": ["name", "arguments"], "additionalProperties": False} for f in functions]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def plan(engine, model_id: str, parsed) -> ChatPlan:
    """The prompt tokens (and constraint) of a chat request."""
    choice = parsed.tool_choice
    if not parsed.tools:
        if choice not in (None, "none", "auto"):
            raise bad_param("tool_choice", "'tool_choice' needs 'tools'.")
        return ChatPlan(engine.conversation_tokens(model_id, parsed.messages))
    loaded_template = engine._model(model_id).template
    source = loaded_template.source if loaded_template is not None else ""
    if not _supports_tools(source):
        raise bad_param("tools", f"The chat template of {model_id} has no place for tools, so this model cannot be "
                        "offered functions; send the request without 'tools'.", code="unsupported_parameter")
    functions = _functions(parsed.tools)
    names = [f["name"] for f in functions]
    if choice == "none":
        chosen = []
    elif choice in (None, "auto", "required"):
        chosen = functions
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) and choice["function"].get("name") in names:
        chosen = [f for f in functions if f["name"] == choice["function"]["name"]]
    else:
        raise bad_param("tool_choice", f"'tool_choice' must be none, auto, required or "
                        f"{{\"type\": \"function\", \"function\": {{\"name\": one of {names}}}}}.")
    tool_list = [{"type": "function", "function": f} for f in functions]
    try:
        text = loaded_template._template.render(messages=parsed.messages, tools=tool_list, add_generation_prompt=True,
                                                bos_token=loaded_template.bos_token,
                                                eos_token=loaded_template.eos_token)
    except ChatTemplateError:
        raise
    except Exception as exc:
        raise ChatTemplateError(f"The model's chat template failed with tools: {exc}") from None
    tokenizer = engine.tokenizer(model_id)
    tokens = tokenizer.encode(text)
    if tokenizer.add_bos and tokenizer.bos_token and not text.startswith(tokenizer.bos_token):
        tokens = [tokenizer.inner.token_to_id(tokenizer.bos_token)] + tokens
    constraint = None
    if chosen and choice not in (None, "auto"):
        from ..constraints import ConstraintFactory

        constraint = ConstraintFactory.for_tokenizer(tokenizer).json_schema(_call_schema(chosen))
    return ChatPlan(tokens, constraint, chosen or None)


_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _as_call(obj) -> Optional[dict]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def parse(text: str, plan: ChatPlan) -> tuple[str, list]:
    """(content left, tool calls) of a reply."""
    names = {f["name"] for f in plan.tools or []}
    calls, rest = [], text
    for match in _BLOCK.finditer(text):
        try:
            call = _as_call(json.loads(match.group(1)))
        except ValueError:
            continue
        if call and call["function"]["name"] in names:
            calls.append(call)
            rest = rest.replace(match.group(0), "")
    if not calls:
        try:
            call = _as_call(json.loads(text))
        except ValueError:
            call = None
        if call and call["function"]["name"] in names:
            return "", [call]
    return rest.strip(), calls
