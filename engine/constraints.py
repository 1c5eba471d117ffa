"""Structured output: a JSON schema (or "any JSON object") as a per-step token mask.

The grammar library is llguidance (chosen by measurement against xgrammar and outlines-core, see
docs/SERVER.md). A `GrammarConstraint` is a `sampling.TokenConstraint`: the sampler asks it for the
tokens allowed next, masks the rest to -inf before every filter, and advances it with the token drawn.
Once the JSON value is complete only the end-of-sequence tokens remain allowed, so the reply ends there.

    factory = ConstraintFactory.for_tokenizer(engine.tokenizer(model_id))
    constraint = factory.json_schema({"type": "object", "properties": {...}})
    engine.generate_tokens(model_id, tokens, params, constraint=constraint)
"""
from __future__ import annotations

import json
import threading
from typing import Optional

import numpy as np

from .errors import HearthError, InvalidOption


class ConstraintUnavailable(HearthError):
    kind = "constraint-unavailable"


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ConstraintUnavailable("Structured output needs the llguidance package, which is not installed: "
                                    "pip install 'hearth[serve]'.") from None
    return llguidance


class GrammarConstraint:
    """One reply's grammar state (not shared between replies)."""

    def __init__(self, matcher, eos_ids: frozenset):
        self.matcher = matcher
        self.eos_ids = eos_ids
        self.tokens_seen = 0

    def allowed_bits(self, vocab_size: int) -> np.ndarray:
        """The tokens allowed now as uint32 words [ceil(vocab / 32)] (bit i % 32 of word i // 32): the
        grammar's bitmask, the model's rows past the tokenizer's words masked; when the grammar allows
        nothing (an error state) only the end-of-sequence tokens, so the reply ends."""
        words = -(-vocab_size // 32)
        raw = np.frombuffer(self.matcher.compute_bitmask(), dtype="<u4")
        bits = np.zeros(words, dtype=np.uint32)
        n = min(words, raw.size)
        bits[:n] = raw[:n]
        if vocab_size % 32 and n == words:
            bits[-1] &= np.uint32((1 << (vocab_size % 32)) - 1)
        if not bits.any():
            for e in self.eos_ids:
                if e < vocab_size:
                    bits[e // 32] |= np.uint32(1 << (e % 32))
        return bits

    def allowed_mask(self, vocab_size: int):
        import torch

        bits = self.allowed_bits(vocab_size)
        mask = np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)
        return torch.from_numpy(mask)

    def advance(self, token: int) -> None:
        self.tokens_seen += 1
        if token not in self.eos_ids:
            self.matcher.consume_token(int(token))

    @property
    def complete(self) -> bool:
        """The text so far is a whole value of the grammar."""
        return self.matcher.is_accepting()


class ConstraintFactory:
    """Compiles grammars for one tokenizer (building its token table takes ~1 s: made once per model)."""

    _cache: dict = {}
    _cache_lock = threading.Lock()

    def __init__(self, tokenizer):
        llg = _llguidance()
        self.eos_ids = frozenset(tokenizer.eos_ids)
        eos = sorted(self.eos_ids)
        self.lltokenizer = llg.LLTokenizer(tokenizer.inner.to_str(), eos_token=eos or None)

    @classmethod
    def for_tokenizer(cls, tokenizer) -> "ConstraintFactory":
        with cls._cache_lock:
            found = cls._cache.get(id(tokenizer))
            if found is None or found[0] is not tokenizer:
                found = (tokenizer, cls(tokenizer))
                cls._cache[id(tokenizer)] = found
            return found[1]

    def _matcher(self, grammar: str, what: str) -> GrammarConstraint:
        llg = _llguidance()
        error = llg.LLMatcher.validate_grammar(grammar, self.lltokenizer)
        if error and not error.startswith("WARNING"):
            raise InvalidOption(f"The {what} cannot be used for structured output: {error}")
        matcher = llg.LLMatcher(self.lltokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidOption(f"The {what} cannot be used for structured output: {matcher.get_error()}")
        return GrammarConstraint(matcher, self.eos_ids)

    def json_schema(self, schema: dict) -> GrammarConstraint:
        if not isinstance(schema, dict):
            raise InvalidOption("A JSON schema must be a JSON object.")
        llg = _llguidance()
        try:
            # compact JSON: a small model left free to emit whitespace can loop on newlines forever
            grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                             overrides={"whitespace_flexible": False})
        except (ValueError, TypeError) as exc:
            raise InvalidOption(f"The JSON schema cannot be used for structured output: {exc}") from None
        return self._matcher(grammar, "JSON schema")

    def json_object(self) -> GrammarConstraint:
        return self.json_schema({"type": "object"})


def constraint_for_response_format(tokenizer, response_format: Optional[dict]) -> Optional[GrammarConstraint]:
    """The constraint an OpenAI `response_format` asks for (None for plain text)."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    factory = ConstraintFactory.for_tokenizer(tokenizer)
    if kind == "json_object":
        return factory.json_object()
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise InvalidOption("response_format.json_schema must be an object with a `schema` object.")
        return factory.json_schema(spec.get("schema") or {"type": "object"})
    raise InvalidOption(f"response_format type {kind!r} is not one of text, json_object, json_schema.")
