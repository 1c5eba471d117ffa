"""Chat templates, rendered in jinja2's sandbox.

A template comes from a downloaded checkpoint: untrusted input. The immutable sandbox refuses
attribute tricks and mutation; rendering errors become ChatTemplateError with the template's words.
Options match Hugging Face's `apply_chat_template` (trim_blocks, lstrip_blocks, loop controls,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII).
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Optional

from .errors import ChatTemplateError


def _raise(message):
    raise ChatTemplateError(f"The model's chat template refused the conversation: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise ChatTemplateError(f"The model's chat template does not parse: {exc}") from None


class ChatTemplate:
    def __init__(self, source: Optional[str], bos_token: Optional[str] = None, eos_token: Optional[str] = None):
        if not source:
            raise ChatTemplateError("This model has no chat template, so it cannot hold a conversation. "
                                    "Use plain text generation instead.")
        self.source = source
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self._template = _compile(source)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        from jinja2 import TemplateError
        from jinja2.exceptions import SecurityError

        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ChatTemplateError("Every message needs a role and a content.")
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except SecurityError as exc:
            raise ChatTemplateError(f"The model's chat template tried something unsafe and was stopped: {exc}") from None
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise ChatTemplateError(f"The model's chat template failed: {exc}") from None
