"""Measure the installable grammar libraries on a real tokenizer: compile time, mask time per token, and
correctness (every token of a valid document allowed in turn, the document accepted at its end, a
wrong token refused). The figures in docs/SERVER.md come from:

    pip install xgrammar outlines-core      # besides llguidance, which Hearth uses
    python -m engine.server.grammar_bench [--model smollm2-135m-instruct]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

CASES = [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
      "required": ["name", "age"], "additionalProperties": False}, {"name": "Ada Lovelace", "age": 36}),
    ({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                                       "score": {"type": "number"}}, "required": ["tags", "score"],
      "additionalProperties": False}, {"tags": ["red", "green", "blue"], "score": 0.75}),
    ({"type": "object", "properties": {"status": {"enum": ["open", "closed", "pending"]},
                                       "owner": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                                  "email": {"type": "string"}},
                                                 "required": ["id", "email"], "additionalProperties": False}},
      "required": ["status", "owner"], "additionalProperties": False},
     {"status": "pending", "owner": {"id": 42, "email": "ada@example.com"}}),
    ({"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                 "required": ["x", "y"], "additionalProperties": False}},
     [{"x": 1, "y": 2.5}, {"x": -3, "y": 4}, {"x": 0, "y": 0}]),
    ({"type": "object", "properties": {"answer": {"type": "boolean"}, "reason": {"type": ["string", "null"]}},
      "required": ["answer", "reason"], "additionalProperties": False}, {"answer": True, "reason": None}),
]


def _document(instance) -> str:
    return json.dumps(instance, separators=(",", ":"))


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer):
        import llguidance

        self.llg = llguidance
        self.tok = llguidance.LLTokenizer(tokenizer.inner.to_str(), eos_token=sorted(tokenizer.eos_ids))

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                              overrides={"whitespace_flexible": False})
        return grammar

    def matcher(self, grammar):
        return self.llg.LLMatcher(self.tok, grammar, log_level=0)

    def allowed(self, m):
        import numpy as np

        return np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")

    def accept(self, m, token):
        return m.consume_token(token)

    def done(self, m):
        return m.is_accepting()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer):
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.inner)
        self.info = xgrammar.TokenizerInfo.from_huggingface(hf, stop_token_ids=sorted(tokenizer.eos_ids))
        self.compiler = xgrammar.GrammarCompiler(self.info)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))

    def matcher(self, compiled):
        m = self.xgr.GrammarMatcher(compiled)
        m.bits = self.xgr.allocate_token_bitmask(1, self.info.vocab_size)
        return m

    def allowed(self, m):
        import numpy as np

        m.fill_next_token_bitmask(m.bits)
        return np.unpackbits(m.bits.numpy().view(np.uint8), bitorder="little")

    def accept(self, m, token):
        return m.accept_token(token)

    def done(self, m):
        return m.is_terminated() or m.accept_token(sorted(self.info.stop_token_ids)[0])


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer):
        from outlines_core import Vocabulary

        vocab = {}
        for token, i in tokenizer.inner.get_vocab().items():
            if i in tokenizer.eos_ids:
                continue
            vocab.setdefault(tokenizer.inner.decode([i], skip_special_tokens=False), []).append(i)
        self.eos = sorted(tokenizer.eos_ids)[0]
        self.size = tokenizer.vocab_size
        self.vocab = Vocabulary(self.eos, vocab)

    def compile(self, schema):
        from outlines_core import Index
        from outlines_core.json_schema import build_regex_from_schema

        return Index(build_regex_from_schema(json.dumps(schema)), self.vocab)

    def matcher(self, index):
        from outlines_core import Guide

        return Guide(index)

    def allowed(self, m):
        import numpy as np

        mask = np.zeros(self.size, dtype=np.uint8)
        mask[m.get_tokens()] = 1
        return mask

    def accept(self, m, token):
        m.advance(token)
        return True

    def done(self, m):
        return m.is_finished() or self.eos in m.get_tokens()


def measure(library, tokenizer, cases=CASES) -> dict:
    compile_s, mask_s, wrong = [], [], 0
    correct = 0
    for schema, instance in cases:
        t = time.perf_counter()
        compiled = library.compile(schema)
        m = library.matcher(compiled)           # llguidance compiles here, the others before
        compile_s.append(time.perf_counter() - t)
        ok = True
        for token in tokenizer.encode(_document(instance)):
            t = time.perf_counter()
            allowed = library.allowed(m)
            mask_s.append(time.perf_counter() - t)
            if token >= len(allowed) or not allowed[token]:
                ok = False
                break
            library.accept(m, token)
        ok = ok and library.done(m)
        m2 = library.matcher(compiled)          # a document may not start with a letter
        bad = tokenizer.encode("hello")[0]
        allowed = library.allowed(m2)
        wrong += int(bad < len(allowed) and bool(allowed[bad]))
        correct += int(ok)
    return {"library": library.name, "cases": len(cases), "valid_documents_accepted": correct,
            "wrong_first_tokens_allowed": wrong,
            "compile_ms_median": 1000 * statistics.median(compile_s),
            "mask_us_per_token_median": 1e6 * statistics.median(mask_s),
            "mask_us_per_token_p99": 1e6 * sorted(mask_s)[int(0.99 * (len(mask_s) - 1))]}


def main(argv=None) -> int:
    from ..engine import Engine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args(argv)
    from ..tokenizer import Tokenizer
    from pathlib import Path

    eng = Engine(backend="torch")
    if args.model == "smollm2-135m-instruct":
        eng.install_default_model()
    path, _ = eng._resolve(args.model)
    info = eng.inspect(args.model)
    tokenizer = Tokenizer.from_folder(Path(path), info.config)
    print(f"tokenizer of {args.model}: {tokenizer.vocab_size} tokens; {len(CASES)} schemas")
    for cls in (Llguidance, Xgrammar, OutlinesCore):
        try:
            t = time.perf_counter()
            lib = cls(tokenizer)
            setup = time.perf_counter() - t
            result = measure(lib, tokenizer)
        except Exception as exc:          # noqa: BLE001 - a library missing or failing is a result too
            print(f"{cls.name:<14} unavailable: {type(exc).__name__}: {exc}")
            continue
        print(f"{result['library']:<14} setup {setup * 1000:7.0f} ms  compile {result['compile_ms_median']:7.1f} ms  "
              f"mask {result['mask_us_per_token_median']:7.1f} us/token (p99 {result['mask_us_per_token_p99']:.0f})  "
              f"valid accepted {result['valid_documents_accepted']}/{result['cases']}  "
              f"wrong allowed {result['wrong_first_tokens_allowed']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
