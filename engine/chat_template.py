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
    if isinstance(indent, int) and indent > _MAX_WIDTH:
        _raise(f"an indent of {indent} characters is too wide")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


# A rendered conversation longer than this is no prompt (a million tokens or more): a template that
# writes it is looping or multiplying strings to exhaust memory.
MAX_RENDERED_CHARS = 8 << 20
_MAX_WIDTH = 10_000      # a format width or a filter's padding


def _bounded_environment():
    """The immutable sandbox, with the ways a template can ask for gigabytes bounded too."""
    import re
    import string

    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    widths = re.compile(r"%[-+ #0]*(\d+)|%[-+ #0]*\d*\.(\d+)")

    def check_spec(spec: str) -> None:
        for number in re.findall(r"\d+", spec or ""):
            if int(number) > _MAX_WIDTH:
                raise SecurityError(f"a format width of {number} characters")

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "%"})

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_RENDERED_CHARS:
                        raise SecurityError(f"a sequence of {len(seq) * n:,} items")
            if operator == "%" and isinstance(left, str):
                for m in widths.finditer(left):
                    check_spec(m.group(0))
            return super().call_binop(context, operator, left, right)

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None

            def checked(*args, **kwargs):
                for _, _, spec, _ in string.Formatter().parse(value.__self__):
                    check_spec(spec)
                    if spec and "{" in spec:    # a width from the arguments
                        for arg in (*args, *kwargs.values()):
                            check_spec(str(arg) if isinstance(arg, int) else "")
                return wrapped(*args, **kwargs)
            return checked

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    for name in ("center", "indent"):
        original = env.filters[name]

        def bounded(value, width=80, *args, _original=original, **kwargs):
            if isinstance(width, int) and width > _MAX_WIDTH:
                raise SecurityError(f"a padding of {width} characters")
            return _original(value, width, *args, **kwargs)
        env.filters[name] = bounded
    return env


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2 import TemplateError

    if not isinstance(source, str):
        raise ChatTemplateError("The model's chat template is not text.")
    env = _bounded_environment()
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
            parts, size = [], 0
            for part in self._template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=self.bos_token, eos_token=self.eos_token):
                size += len(part)
                if size > MAX_RENDERED_CHARS:
                    raise SecurityError(f"more than {MAX_RENDERED_CHARS:,} characters of output")
                parts.append(part)
            return "".join(parts)
        except ChatTemplateError:
            raise
        except SecurityError as exc:
            raise ChatTemplateError(f"The model's chat template tried something unsafe and was stopped: {exc}") from None
        except RecursionError:
            raise ChatTemplateError("The model's chat template calls itself without end and was stopped.") from None
        except MemoryError:
            raise ChatTemplateError("The model's chat template asked for more memory than there is and was "
                                    "stopped.") from None
        except (TemplateError, TypeError, ValueError, KeyError, IndexError, ArithmeticError, AttributeError) as exc:
            raise ChatTemplateError(f"The model's chat template failed: {exc}") from None
