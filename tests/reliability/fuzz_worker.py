"""Seeded Hypothesis fuzzing of the checkpoint header readers, one target per line of output.

    python tests/reliability/fuzz_worker.py BASES_DIR WORK_DIR TARGET [TARGET ...]

Targets: safetensors-bytes (mutated bytes of a small safetensors file, through checkpoint.inspect),
safetensors-json (generated JSON headers), config-json (config.json with fields set to generated values), gguf-bytes
(mutated bytes of a tiny llama GGUF, through inspect and import) and gguf-fields (a
structurally valid GGUF whose integer fields take extreme values).

Examples per target: HEARTH_FUZZ_EXAMPLES (default 1000: under a minute for all five on a
2-core machine); HEARTH_FUZZ_EXAMPLES=20000 is the long run. The seed is fixed (HEARTH_FUZZ_SEED,
default 16), so a run is repeatable. A typed HearthError is a pass; any other exception is counted
with the place it came from; an example that runs past HEARTH_FUZZ_HANG_S (default 120 s) is a hang:
this process prints it and exits, and the parent (reliability_harness) records it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import threading
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import reliability_corpus as corpus  # noqa: E402

EXAMPLES = int(os.environ.get("HEARTH_FUZZ_EXAMPLES", "1000"))
SEED = int(os.environ.get("HEARTH_FUZZ_SEED", "16"))
HANG_S = float(os.environ.get("HEARTH_FUZZ_HANG_S", "120"))
EXTREMES = [0, 1, 2, 3, 7, 8, 31, 32, 255, 256, 2 ** 15, 2 ** 16 - 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32,
            2 ** 40, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1]


class Tally:
    def __init__(self):
        self.tried = 0
        self.typed = 0
        self.untyped: dict = {}     # "Type at file:line" -> [count, example message, input sha]

    def run(self, fn, data: bytes) -> None:
        from engine.errors import HearthError

        self.tried += 1
        digest = hashlib.sha256(data).hexdigest()[:16]
        timer = threading.Timer(HANG_S, _hang, args=(digest,))
        timer.daemon = True
        timer.start()
        try:
            fn()
        except HearthError:
            self.typed += 1
        except RecursionError as exc:
            self._record(exc, digest)
        except Exception as exc:  # noqa: BLE001 - counting what should not escape
            self._record(exc, digest)
        finally:
            timer.cancel()

    def _record(self, exc, digest):
        frames = traceback.extract_tb(exc.__traceback__)
        inner = next((f for f in reversed(frames) if "/engine/" in f.filename), frames[-1] if frames else None)
        where = f"{Path(inner.filename).name}:{inner.lineno}" if inner else "?"
        key = f"{type(exc).__name__} at {where}"
        entry = self.untyped.setdefault(key, [0, str(exc)[:200], digest])
        entry[0] += 1

    def to_dict(self) -> dict:
        return {"tried": self.tried, "typed": self.typed,
                "untyped": sum(v[0] for v in self.untyped.values()), "places": self.untyped}


def _hang(digest: str) -> None:
    print("hang " + json.dumps({"input": digest, "after_s": HANG_S}), flush=True)
    os._exit(3)


def _mutations(st, size: int, hot: int):
    """Byte patches, biased to the first `hot` bytes (the header), plus an optional cut or insert."""
    position = st.one_of(st.integers(0, max(0, hot - 1)), st.integers(0, max(0, size - 1)))
    patch = st.tuples(position, st.one_of(st.binary(min_size=1, max_size=8),
                                          st.sampled_from(EXTREMES).map(lambda v: struct.pack("<Q", v)),
                                          st.sampled_from(EXTREMES).map(lambda v: struct.pack("<I", v & 0xFFFFFFFF))))
    return st.tuples(st.lists(patch, min_size=1, max_size=6),
                     st.one_of(st.none(), st.integers(0, size)),
                     st.one_of(st.none(), st.tuples(position, st.binary(min_size=1, max_size=64))))


def _apply(base: bytes, mutation) -> bytes:
    patches, cut, insert = mutation
    data = bytearray(base)
    for at, raw in patches:
        data[at:at + len(raw)] = raw
    if insert is not None:
        data[insert[0]:insert[0]] = insert[1]
    if cut is not None:
        del data[cut:]
    return bytes(data)


def _run(target: str, bases: dict, work: Path) -> dict:
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    from engine.checkpoint import inspect
    from engine.gguf_import import convert_gguf

    tally = Tally()
    folder = work / target
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(bases["st"], folder / "model")
    model = folder / "model"
    opts = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(HealthCheck))

    if target in ("safetensors-bytes", "safetensors-json"):
        original = (model / "model.safetensors").read_bytes()
        (header_len,) = struct.unpack("<Q", original[:8])

        def check(data: bytes):
            (model / "model.safetensors").write_bytes(data)
            tally.run(lambda: inspect(model), data)

        if target == "safetensors-bytes":
            @seed(SEED)
            @opts
            @given(_mutations(st, len(original), 8 + header_len))
            def fuzz(mutation):
                check(_apply(original, mutation))
        else:
            data_part = original[8 + header_len:]
            scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70),
                                st.floats(allow_nan=False), st.text(max_size=12))
            values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                   st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                                  max_leaves=12)
            sizes = st.integers(0, 2 ** 20) | st.sampled_from(EXTREMES)
            entry = st.fixed_dictionaries(
                {"dtype": st.sampled_from(["BF16", "F32", "U8", "F8_E4M3", "Q4", ""]) | values,
                 "shape": st.lists(sizes, max_size=4) | values,
                 "data_offsets": st.lists(sizes, min_size=2, max_size=2) | values})
            names = st.sampled_from(["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                                     "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.up_proj.weight",
                                     "model.layers.99.self_attn.k_proj.weight", "__metadata__"]) | st.text(max_size=20)

            @seed(SEED)
            @opts
            @given(st.dictionaries(names, entry | values, max_size=6))
            def fuzz(header):
                blob = json.dumps(header).encode()
                blob += b" " * (-len(blob) % 8)
                check(struct.pack("<Q", len(blob)) + blob + data_part)
    elif target == "config-json":
        original = json.loads((model / "config.json").read_text())
        keys = sorted(set(original) | {"rope_scaling", "text_config", "num_experts", "num_local_experts",
                                       "num_experts_per_tok", "moe_intermediate_size", "head_dim",
                                       "mlp_only_layers", "decoder_sparse_step", "norm_topk_prob",
                                       "shared_expert_intermediate_size", "routed_scaling_factor", "ep_size",
                                       "rope_parameters", "quantization_config", "qkv_bias"})
        scalars = st.one_of(st.none(), st.booleans(), st.sampled_from(EXTREMES), st.integers(-2 ** 70, 2 ** 70),
                            st.floats(), st.text(max_size=12), st.sampled_from(["llama3", "linear", "yarn", "llama"]))
        values = st.recursive(scalars, lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "low_freq_factor", "high_freq_factor",
                                             "original_max_position_embeddings", "quant_algo", "quant_method",
                                             "hidden_size", "num_hidden_layers"]) | st.text(max_size=6),
                            inner, max_size=5)), max_leaves=10)

        @seed(SEED)
        @opts
        @given(st.dictionaries(st.sampled_from(keys), values, min_size=1, max_size=4))
        def fuzz(changes):
            config = dict(original, **changes)
            data = json.dumps(config).encode()      # NaN / Infinity floats go out as the bare words
            (model / "config.json").write_bytes(data)
            tally.run(lambda: inspect(model), data)
    elif target in ("gguf-bytes", "gguf-fields"):
        original = bases["gguf"].read_bytes()
        header_end = original.find(b"token_embd.weight") + 200
        path = folder / "model.gguf"

        def check(data: bytes):
            path.write_bytes(data)
            out = folder / "imported"

            def both():
                inspect(path)
                try:
                    convert_gguf(path, out)
                finally:
                    shutil.rmtree(out, ignore_errors=True)
            tally.run(both, data)

        if target == "gguf-bytes":
            @seed(SEED)
            @opts
            @given(_mutations(st, len(original), header_end))
            def fuzz(mutation):
                check(_apply(original, mutation))
        else:
            kv = corpus.base_gguf_kv()
            vocab = len(dict((k, v) for k, _, v in kv)["tokenizer.ggml.tokens"][1])
            tensors = corpus.base_gguf_tensors(vocab)
            int_keys = [i for i, (_, t, _) in enumerate(kv) if t in (corpus.U32, corpus.I32, corpus.U64)]
            extreme = st.sampled_from(EXTREMES)
            vtypes = st.sampled_from([corpus.U8, corpus.I8, corpus.U16, corpus.I16, corpus.U32, corpus.I32,
                                      corpus.F32, corpus.BOOL, corpus.U64, corpus.I64, corpus.F64])

            @seed(SEED)
            @opts
            @given(st.lists(st.tuples(st.sampled_from(int_keys), vtypes, extreme), max_size=4),
                   st.lists(st.tuples(st.integers(0, len(tensors) - 1), st.integers(0, 3), extreme), max_size=3),
                   st.one_of(st.none(), extreme), st.one_of(st.none(), extreme))
            def fuzz(kv_changes, tensor_changes, n_kv, n_tensors):
                new_kv = list(kv)
                for i, vtype, value in kv_changes:
                    fmt = corpus._FMT[vtype]
                    limit = 2 ** (8 * struct.calcsize(fmt))
                    v = value % limit
                    if fmt.lower() == fmt and fmt[-1] not in "f?d":   # signed
                        v = v - limit if v >= limit // 2 else v
                    if fmt[-1] in "fd":
                        v = float(value)
                    if fmt[-1] == "?":
                        v = bool(value)
                    new_kv[i] = (kv[i][0], vtype, v)
                new_tensors = [dict(t) for t in tensors]
                for i, what, value in tensor_changes:
                    t = new_tensors[i]
                    if what == 0:
                        t["dims"] = [value % 2 ** 64] + t["dims"][1:]
                    elif what == 1:
                        t["type"] = value % 2 ** 32
                    elif what == 2:
                        t["offset"] = value % 2 ** 64 if value < 2 ** 30 else value % 2 ** 64
                    else:
                        t["n_dims"] = value % 2 ** 32
                try:
                    data = corpus.gguf_bytes(new_kv, new_tensors, n_kv=None if n_kv is None else n_kv % 2 ** 64,
                                             n_tensors=None if n_tensors is None else n_tensors % 2 ** 64)
                except (struct.error, OverflowError, MemoryError):
                    return      # the writer cannot express this file; nothing to read
                check(data)
    else:
        raise SystemExit(f"unknown target {target}")
    fuzz()
    return {"target": target, **tally.to_dict()}


def main(argv) -> int:
    import logging

    logging.disable(logging.WARNING)
    bases = {"st": Path(argv[0]) / "tiny-st", "gguf": Path(argv[0]) / "tiny.gguf"}
    work = Path(argv[1])
    for target in argv[2:]:
        print(f"start {target}", flush=True)
        print("result " + json.dumps(_run(target, bases, work)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
