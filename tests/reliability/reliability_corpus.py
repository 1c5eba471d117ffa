"""The malformed-checkpoint corpus: a tiny valid safetensors folder and a tiny valid GGUF, and >= 100
ways to break them, each a named, deterministic builder.

A case is (name, base "st" or "gguf", build(base_path, out_dir) -> the path a user would open,
must_fail). Cases marked must_fail are broken in a way Hearth must refuse with a typed error at
inspect, import or load; the rest (template escapes, harmless oddities) must never crash and must
never leak (the sandbox cases look for a marker file or text).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

LEAK_MARK = "HEARTH_SANDBOX_ESCAPED"


@dataclass(frozen=True)
class Case:
    name: str
    base: str                  # "st" or "gguf"
    build: Callable            # (base path, out dir) -> path to open
    must_fail: bool = True


# ---------------------------------------------------------------------------------------------
# Bases


def write_base_safetensors(out: Path) -> Path:
    from engine.tools.synth import write_checkpoint

    return write_checkpoint("tiny", out, seed=0, tokenizer=True, device="cpu")


def _byte_alphabet() -> list:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


GGUF_HIDDEN, GGUF_HEADS, GGUF_KV, GGUF_FFN, GGUF_LAYERS = 64, 4, 2, 128, 2
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}


def _s(text) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def encode_value(vtype: int, value) -> bytes:
    if vtype == STR:
        return _s(value)
    if vtype == ARR:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(encode_value(etype, v) for v in items)
    return struct.pack(_FMT[vtype], value)


def base_gguf_kv() -> list:
    """[(key, type, value)] of the base GGUF: a 2-layer llama with a byte-level BPE vocabulary."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + _byte_alphabet() + ["he", "ll", "hell", "hello"]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return [
        ("general.architecture", STR, "llama"),
        ("general.alignment", U32, 32),
        ("llama.block_count", U32, GGUF_LAYERS),
        ("llama.context_length", U32, 256),
        ("llama.embedding_length", U32, GGUF_HIDDEN),
        ("llama.feed_forward_length", U32, GGUF_FFN),
        ("llama.attention.head_count", U32, GGUF_HEADS),
        ("llama.attention.head_count_kv", U32, GGUF_KV),
        ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("llama.rope.freq_base", F32, 10000.0),
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "default"),
        ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (I32, types)),
        ("tokenizer.ggml.merges", ARR, (STR, ["h e", "l l", "he ll", "hell o"])),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
        ("tokenizer.chat_template", STR, CHATML),
    ]


def base_gguf_tensors(vocab: int, seed: int = 0) -> list:
    """[dict(name, dims (GGUF order: fastest first), type, data)] of F32 tensors."""
    rng = np.random.default_rng(seed)
    h, hd, f = GGUF_HIDDEN, GGUF_HIDDEN // GGUF_HEADS, GGUF_FFN
    shapes = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,)}
    for i in range(GGUF_LAYERS):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (h,), f"blk.{i}.ffn_norm.weight": (h,),
            f"blk.{i}.attn_q.weight": (GGUF_HEADS * hd, h), f"blk.{i}.attn_k.weight": (GGUF_KV * hd, h),
            f"blk.{i}.attn_v.weight": (GGUF_KV * hd, h), f"blk.{i}.attn_output.weight": (h, GGUF_HEADS * hd),
            f"blk.{i}.ffn_gate.weight": (f, h), f"blk.{i}.ffn_up.weight": (f, h), f"blk.{i}.ffn_down.weight": (h, f),
        })
    out = []
    for name, shape in shapes.items():
        x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if name.endswith("norm.weight"):
            x = np.ones(shape, np.float32)
        out.append(dict(name=name, dims=list(reversed(shape)), type=0, data=x.tobytes()))
    return out


def gguf_bytes(kv: list, tensors: list, version: int = 3, magic: bytes = b"GGUF", n_kv=None, n_tensors=None,
               alignment: int = 32, raw_kv: bytes = b"", truncate: int | None = None) -> bytes:
    """A GGUF file. Tensor dicts may carry 'offset' (relative, overriding the computed one) and
    'n_dims' (written instead of len(dims))."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kv) + (1 if raw_kv else 0) if n_kv is None else n_kv)
    body = b"".join(_s(k) + struct.pack("<I", t) + encode_value(t, v) for k, t, v in kv) + raw_kv
    infos, offset, blobs = b"", 0, []
    for t in tensors:
        at = t.get("offset", offset)
        infos += _s(t["name"]) + struct.pack("<I", t.get("n_dims", len(t["dims"])))
        infos += b"".join(struct.pack("<Q", d) for d in t["dims"]) + struct.pack("<IQ", t["type"], at)
        if at < 1 << 24:        # an offset past any small file keeps its data out of this one
            blobs.append((at, t["data"]))
        offset = at + len(t["data"])
        offset += -offset % alignment
    data = head + body + infos
    data += b"\0" * (-len(data) % alignment)
    payload = bytearray(max((at + len(b) for at, b in blobs), default=0))
    for at, blob in blobs:
        payload[at:at + len(blob)] = blob
    data += bytes(payload)
    return data[:truncate] if truncate is not None else data


def write_base_gguf(path: Path) -> Path:
    kv = base_gguf_kv()
    vocab = len(dict((k, v) for k, _, v in kv)["tokenizer.ggml.tokens"][1])
    path.write_bytes(gguf_bytes(kv, base_gguf_tensors(vocab)))
    return path


def write_bases(root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    st = root / "tiny-st"
    if not (st / "config.json").exists():
        write_base_safetensors(st)
    gg = root / "tiny.gguf"
    if not gg.exists():
        write_base_gguf(gg)
    return {"st": st, "gguf": gg}


# ---------------------------------------------------------------------------------------------
# Safetensors mutations


def _copy(base: Path, out: Path) -> Path:
    shutil.copytree(base, out / "model")
    return out / "model"


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def config_set(**changes):
    def build(base, out):
        folder = _copy(base, out)
        cfg = _config(folder)
        for key, value in changes.items():
            if value is _DELETE:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder
    return build


_DELETE = object()


def config_raw(key: str, raw_value: str):
    """config.json with one value written as raw JSON text (NaN, Infinity, 1000 digits ...)."""
    def build(base, out):
        folder = _copy(base, out)
        cfg = _config(folder)
        cfg[key] = "@@RAW@@"
        (folder / "config.json").write_text(json.dumps(cfg).replace('"@@RAW@@"', raw_value))
        return folder
    return build


def file_text(name: str, content, binary: bool = False):
    def build(base, out):
        folder = _copy(base, out)
        target = folder / name
        if target.is_dir():
            shutil.rmtree(target)
        elif os.path.lexists(target):
            target.unlink()
        if binary:
            target.write_bytes(content)
        else:
            target.write_text(content if isinstance(content, str) else json.dumps(content))
        return folder
    return build


def json_field(name: str, key: str, value):
    def build(base, out):
        folder = _copy(base, out)
        data = json.loads((folder / name).read_text())
        data[key] = value
        (folder / name).write_text(json.dumps(data))
        return folder
    return build


def make_dir(name: str):
    def build(base, out):
        folder = _copy(base, out)
        target = folder / name
        if os.path.lexists(target):
            target.unlink()
        target.mkdir()
        (target / "inner").write_text("x")
        return folder
    return build


def symlink_loop(name: str):
    def build(base, out):
        folder = _copy(base, out)
        target = folder / name
        if os.path.lexists(target):
            target.unlink()
        os.symlink(name + ".b", folder / name)
        os.symlink(name, folder / (name + ".b"))
        return folder
    return build


def dangling(name: str):
    def build(base, out):
        folder = _copy(base, out)
        (folder / name).unlink()
        os.symlink("/nonexistent/hearth/nothing", folder / name)
        return folder
    return build


def remove(*names):
    def build(base, out):
        folder = _copy(base, out)
        for n in names:
            (folder / n).unlink()
        return folder
    return build


def _split(file: Path):
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _join(header, data: bytes, raw_header: bytes | None = None) -> bytes:
    blob = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + data


def header_edit(edit):
    """model.safetensors with its header changed by edit(header) (which may return raw bytes)."""
    def build(base, out):
        folder = _copy(base, out)
        f = folder / "model.safetensors"
        header, data = _split(f)
        result = edit(header)
        f.write_bytes(_join(header, data, result if isinstance(result, bytes) else None))
        return folder
    return build


def raw_file(content: bytes):
    def build(base, out):
        folder = _copy(base, out)
        (folder / "model.safetensors").write_bytes(content)
        return folder
    return build


def truncate_weights(keep: int):
    def build(base, out):
        folder = _copy(base, out)
        f = folder / "model.safetensors"
        raw = f.read_bytes()
        f.write_bytes(raw[:keep] if keep >= 0 else raw[:len(raw) + keep])
        return folder
    return build


def _first(header, suffix="q_proj.weight"):
    return next(k for k in header if k.endswith(suffix))


def entry_set(field, value, suffix="q_proj.weight"):
    def edit(header):
        header[_first(header, suffix)][field] = value
    return header_edit(edit)


def entry_raw(field, raw_value, suffix="q_proj.weight"):
    def edit(header):
        header[_first(header, suffix)][field] = "@@RAW@@"
        return json.dumps(header, separators=(",", ":")).replace('"@@RAW@@"', raw_value).encode()
    return header_edit(edit)


def nvfp4_moe(edit=None, layout: str = "modelopt", shape: str = "tiny-qwen3-moe"):
    """A tiny NVFP4 mixture-of-experts checkpoint written by engine.tools.synth --nvfp4 (the base is not
    used), its tensors changed by edit(tensors) (names -> torch tensors, saved back as safetensors)."""
    def build(base, out):
        from engine.tools.synth import write_checkpoint

        folder = write_checkpoint(shape, out / "model", seed=0, tokenizer=True, device="cpu", nvfp4=layout)
        if edit is not None:
            from safetensors.torch import load_file, save_file

            tensors = load_file(str(folder / "model.safetensors"))
            edit(tensors)
            save_file(tensors, str(folder / "model.safetensors"))
        return folder
    return build


_EXPERT = "model.layers.2.mlp.experts.3.down_proj"


def _nvfp4_moe_edits() -> dict:
    """name -> edit(tensors); torch is imported only when a case is built (in the worker)."""
    def pop(name):
        return lambda t: t.pop(name)

    def replace(name, fn):
        def edit(t):
            import torch

            t[name] = fn(torch, t[name])
        return edit

    def packed_router(t):       # the router stored as NVFP4 codes and scales, as no real checkpoint does
        import torch

        t["model.layers.0.mlp.gate.weight"] = torch.zeros(8, 32, dtype=torch.uint8)
        t["model.layers.0.mlp.gate.weight_scale"] = torch.ones(8, 4).to(torch.float8_e4m3fn)
        t["model.layers.0.mlp.gate.weight_scale_2"] = torch.tensor(1e-4)

    return {
        "no-block-scale": pop(f"{_EXPERT}.weight_scale"),
        "no-global-scale": pop(f"{_EXPERT}.weight_scale_2"),
        "block-scale-shape": replace(f"{_EXPERT}.weight_scale", lambda torch, x: x[:, :1].contiguous()),
        "block-scale-f32": replace(f"{_EXPERT}.weight_scale", lambda torch, x: x.float()),
        "global-scale-zero": replace(f"{_EXPERT}.weight_scale_2", lambda torch, x: torch.zeros(())),
        "global-scale-nan": replace(f"{_EXPERT}.weight_scale_2", lambda torch, x: torch.tensor(float("nan"))),
        "expert-rows": replace(f"{_EXPERT}.weight", lambda torch, x: x[:32].contiguous()),
        "expert-bf16-beside-scales": replace(f"{_EXPERT}.weight",
                                             lambda torch, x: torch.zeros(64, 32, dtype=torch.bfloat16)),
        "router-packed": packed_router,
    }


def sharded(mutate=None):
    """The base split into two shards with an index; mutate(folder, index) breaks it."""
    def build(base, out):
        folder = _copy(base, out)
        header, data = _split(folder / "model.safetensors")
        names = sorted(k for k in header if k != "__metadata__")
        halves = [names[: len(names) // 2], names[len(names) // 2:]]
        weight_map = {}
        for i, part in enumerate(halves):
            shard = f"model-{i + 1:05d}-of-00002.safetensors"
            sub, blob, offset = {}, b"", 0
            for n in part:
                b0, b1 = header[n]["data_offsets"]
                chunk = data[b0:b1]
                sub[n] = dict(header[n], data_offsets=[offset, offset + len(chunk)])
                blob += chunk
                offset += len(chunk)
                weight_map[n] = shard
            (folder / shard).write_bytes(_join(sub, blob))
        (folder / "model.safetensors").unlink()
        index = {"metadata": {"total_size": len(data)}, "weight_map": weight_map}
        if mutate is not None:
            index = mutate(folder, index) or index
        if isinstance(index, (bytes, str)):
            (folder / "model.safetensors.index.json").write_text(index if isinstance(index, str) else index.decode())
        else:
            (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return folder
    return build


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def template_case(template: str):
    return json_field("tokenizer_config.json", "chat_template", template)


def _st_cases() -> list:
    c = []
    add = lambda name, build, must_fail=True: c.append(Case("st-" + name, "st", build, must_fail))
    add("base", lambda b, o: _copy(b, o), must_fail=False)
    # config.json: wrong types, absurd numbers, broken files
    add("config-not-json", file_text("config.json", "{\"hidden_size\": 64,"))
    add("config-a-list", file_text("config.json", "[1, 2, 3]"))
    add("config-empty-object", file_text("config.json", "{}"))
    add("config-empty-file", file_text("config.json", ""))
    add("config-not-utf8", file_text("config.json", b"{\"model_type\": \"\xff\xfe\"}", binary=True))
    add("config-nested-100000", file_text("config.json", "{\"a\": " + _deep(100_000) + "}"))
    add("config-is-a-folder", make_dir("config.json"))
    add("config-symlink-loop", symlink_loop("config.json"))
    add("hidden-size-text", config_set(hidden_size="64"))
    add("hidden-size-fraction", config_set(hidden_size=64.5))
    add("hidden-size-negative", config_set(hidden_size=-64))
    add("hidden-size-zero", config_set(hidden_size=0))
    add("hidden-size-not-multiple-of-heads", config_set(hidden_size=66))
    add("hidden-size-disagrees-with-tensors", config_set(hidden_size=128))
    add("hidden-size-missing", config_set(hidden_size=_DELETE))
    add("layers-2-pow-40", config_set(num_hidden_layers=2 ** 40))
    add("layers-true", config_set(num_hidden_layers=True))
    add("layers-list", config_set(num_hidden_layers=[2]))
    add("layers-more-than-tensors", config_set(num_hidden_layers=40))
    add("heads-zero", config_set(num_attention_heads=0))
    add("heads-null-object", config_set(num_attention_heads={}))
    add("kv-heads-zero", config_set(num_key_value_heads=0))
    add("kv-heads-do-not-divide", config_set(num_key_value_heads=3))
    add("kv-heads-more-than-heads", config_set(num_key_value_heads=8))
    add("head-dim-zero", config_set(head_dim=0))
    add("head-dim-huge", config_set(head_dim=10 ** 7))
    add("vocab-1000-digits", config_raw("vocab_size", "9" * 1000))
    add("vocab-infinity", config_raw("vocab_size", "Infinity"))
    add("vocab-1e999", config_raw("vocab_size", "1e999"))
    add("vocab-disagrees-with-tensors", config_set(vocab_size=500))
    add("intermediate-disagrees", config_set(intermediate_size=99))
    add("intermediate-text", config_set(intermediate_size="big"))
    add("context-nan", config_raw("max_position_embeddings", "NaN"))
    add("context-negative", config_set(max_position_embeddings=-1))
    add("rms-eps-text", config_set(rms_norm_eps="tiny"))
    add("rms-eps-zero", config_set(rms_norm_eps=0))
    add("rope-theta-negative", config_set(rope_theta=-1.0))
    add("rope-theta-infinite", config_raw("rope_theta", "-Infinity"))
    add("rope-scaling-a-string", config_set(rope_scaling="llama3"))
    add("rope-llama3-no-low-freq", config_set(rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": 256}))
    add("rope-llama3-no-original", config_set(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                           "high_freq_factor": 4.0}))
    add("rope-llama3-factor-text", config_set(rope_scaling={"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0,
                                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 256}))
    add("rope-llama3-high-below-low", config_set(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                                                              "high_freq_factor": 1.0, "original_max_position_embeddings": 256}))
    add("rope-linear-no-factor", config_set(rope_scaling={"rope_type": "linear"}))
    add("rope-type-number", config_set(rope_scaling={"rope_type": 3, "factor": 2.0}))
    add("rope-yarn-unsupported", config_set(rope_scaling={"rope_type": "yarn", "factor": 2.0}))
    add("architectures-a-string", config_set(architectures="LlamaForCausalLM"))
    add("architectures-number", config_set(architectures=[42]))
    add("architecture-unknown", config_set(architectures=["GPTJForCausalLM"], model_type="gptj"))
    add("model-type-number", config_set(model_type=7))
    add("text-config-a-number", config_set(text_config=5))
    add("eos-text", config_set(eos_token_id="two"))
    add("eos-list-mixed", config_set(eos_token_id=[2, "x"]))
    add("bos-negative", config_set(bos_token_id=-1))
    add("tie-embeddings-text", config_set(tie_word_embeddings="yes"))
    add("experts-text", config_set(num_experts="8"))
    add("experts-9-of-8", config_set(num_experts=8, num_experts_per_tok=9))
    add("routed-scaling-text", config_set(num_experts=8, num_experts_per_tok=2, routed_scaling_factor="big"))
    add("mlp-only-layers-text", config_set(num_experts=8, num_experts_per_tok=2, mlp_only_layers="all"))
    # NVFP4 quantization settings (config.json quantization_config, ModelOpt's hf_quant_config.json)
    add("quant-config-a-string", config_set(quantization_config="nvfp4"))
    add("quant-groups-a-list", config_set(quantization_config={"quant_method": "compressed-tensors",
                                                              "config_groups": [1, 2]}))
    add("quant-weights-a-string", config_set(quantization_config={
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "config_groups": {"g": {"weights": "4bit", "format": "nvfp4-pack-quantized"}}}))
    add("quant-exclude-a-number", config_set(quantization_config={"quant_method": "modelopt", "quant_algo": "NVFP4",
                                                                 "exclude_modules": 5}))
    add("quant-declared-no-packed-weights", config_set(quantization_config={"quant_method": "modelopt",
                                                                           "quant_algo": "NVFP4"}))
    add("hf-quant-config-not-json", file_text("hf_quant_config.json", "{\"quantization\": "))
    add("hf-quant-config-a-list", file_text("hf_quant_config.json", {"quantization": [1]}))
    add("hf-quant-config-kv-a-number", file_text("hf_quant_config.json", {"quantization": {
        "quant_algo": "NVFP4", "kv_cache_quant_algo": 8}}))
    # NVFP4 mixture of experts (expert scales missing, misshapen, of the wrong type or value; a packed router)
    add("nvfp4-moe-base", nvfp4_moe(), must_fail=False)
    add("nvfp4-moe-ct-base", nvfp4_moe(layout="compressed-tensors", shape="tiny-qwen2-moe"), must_fail=False)
    for name, edit in _nvfp4_moe_edits().items():
        add("nvfp4-moe-" + name, nvfp4_moe(edit))
    add("nvfp4-moe-ct-no-shared-global-scale", nvfp4_moe(
        lambda t: t.pop("model.layers.1.mlp.shared_expert.up_proj.weight_global_scale"),
        layout="compressed-tensors", shape="tiny-qwen2-moe"))
    # safetensors header and data
    add("weights-4-bytes", raw_file(b"\x01\x02\x03\x04"))
    add("weights-empty", raw_file(b""))
    add("header-length-2-pow-63", raw_file(struct.pack("<Q", 2 ** 63) + b"{}" * 10))
    add("header-length-zero", raw_file(struct.pack("<Q", 0) + b"\0" * 64))
    add("header-not-json", header_edit(lambda h: b"{not json at all"))
    add("header-a-list", header_edit(lambda h: b"[1,2,3]"))
    add("header-not-utf8", header_edit(lambda h: b"{\"\xff\": 1}"))
    add("header-nested-100000", header_edit(lambda h: ("{\"a\": " + _deep(100_000) + "}").encode()))
    add("header-metadata-a-number", header_edit(lambda h: h.update(__metadata__=5)))
    add("entry-a-string", header_edit(lambda h: h.update({_first(h): "tensor"})))
    add("entry-no-dtype", header_edit(lambda h: h[_first(h)].pop("dtype")))
    add("dtype-unknown", entry_set("dtype", "F128"))
    add("dtype-number", entry_set("dtype", 5))
    add("shape-a-string", entry_set("shape", "64,64"))
    add("shape-negative", entry_set("shape", [-64, -64]))
    add("shape-floats", entry_set("shape", [64.0, 64.0]))
    add("shape-1000-digits", entry_raw("shape", "[" + "9" * 1000 + ", 1]"))
    add("shape-infinity", entry_raw("shape", "[Infinity, 1]"))
    add("shape-nine-dims", entry_set("shape", [1] * 9))
    add("shape-swapped", header_edit(lambda h: h[_first(h, "gate_proj.weight")].update(
        shape=list(reversed(h[_first(h, "gate_proj.weight")]["shape"])))))
    add("offsets-missing", header_edit(lambda h: h[_first(h)].pop("data_offsets")))
    add("offsets-one-number", entry_set("data_offsets", [0]))
    add("offsets-text", entry_set("data_offsets", ["0", "10"]))
    add("offsets-reversed", header_edit(lambda h: h[_first(h)].update(data_offsets=h[_first(h)]["data_offsets"][::-1])))
    add("offsets-past-end", header_edit(lambda h: h[_first(h)].update(
        data_offsets=[10 ** 12, 10 ** 12 + h[_first(h)]["data_offsets"][1] - h[_first(h)]["data_offsets"][0]])))
    add("offsets-overlap", header_edit(lambda h: h[_first(h, "k_proj.weight")].update(
        data_offsets=[h[_first(h, "k_proj.weight")]["data_offsets"][0] - 8,
                      h[_first(h, "k_proj.weight")]["data_offsets"][1] - 8])))
    add("size-disagrees-with-dtype", entry_set("dtype", "F32"))
    add("tensor-missing", header_edit(lambda h: h.pop(_first(h))))
    add("truncated-data", truncate_weights(-1000))
    add("truncated-header", truncate_weights(40))
    add("weights-a-folder", make_dir("model.safetensors"))
    add("weights-symlink-loop", symlink_loop("model.safetensors"))
    add("weights-dangling-link", dangling("model.safetensors"))
    add("no-weights", remove("model.safetensors"))
    # shards and the index
    add("sharded-base", sharded(), must_fail=False)
    add("index-not-json", sharded(lambda f, i: "{\"weight_map\": "))
    add("index-nested-100000", sharded(lambda f, i: "{\"weight_map\": " + _deep(100_000) + "}"))
    add("index-no-weight-map", sharded(lambda f, i: {"metadata": {}}))
    add("index-weight-map-a-list", sharded(lambda f, i: {"weight_map": list(i["weight_map"])}))
    add("index-shard-a-number", sharded(lambda f, i: {"weight_map": {k: 5 for k in i["weight_map"]}}))
    add("index-shard-outside", sharded(lambda f, i: {"weight_map": {**i["weight_map"],
                                                                    next(iter(i["weight_map"])): "../../etc/x.safetensors"}}))
    add("index-shard-missing", sharded(lambda f, i: (f / "model-00002-of-00002.safetensors").unlink()))
    add("index-shard-a-folder", sharded(lambda f, i: ((f / "model-00002-of-00002.safetensors").unlink(),
                                                      (f / "model-00002-of-00002.safetensors").mkdir())))
    add("index-wrong-shard", sharded(lambda f, i: {"weight_map": {k: "model-00001-of-00002.safetensors"
                                                                  for k in i["weight_map"]}}))
    add("index-names-absent-tensor", sharded(lambda f, i: {"weight_map": {**i["weight_map"],
                                                                          "model.layers.0.ghost.weight": "model-00001-of-00002.safetensors"}}))
    add("tensor-in-two-shards", sharded(lambda f, i: (
        shutil.copyfile(f / "model-00001-of-00002.safetensors", f / "model-00003-of-00002.safetensors"),
        {"weight_map": {**i["weight_map"], "extra": "model-00003-of-00002.safetensors"}})[1]))
    # tokenizer files and chat templates
    add("tokenizer-not-json", file_text("tokenizer.json", "{\"model\": "))
    add("tokenizer-empty-object", file_text("tokenizer.json", "{}"))
    add("tokenizer-nested-100000", file_text("tokenizer.json", "{\"model\": " + _deep(100_000) + "}"))
    add("tokenizer-a-folder", make_dir("tokenizer.json"))
    add("tokenizer-symlink-loop", symlink_loop("tokenizer.json"))
    add("tokenizer-config-not-json", file_text("tokenizer_config.json", "{\"chat_template\": "))
    add("tokenizer-config-nested-100000", file_text("tokenizer_config.json", "{\"a\": " + _deep(100_000) + "}"))
    add("chat-template-a-number", template_case(42))
    add("chat-template-an-object", template_case({"default": "x"}))
    add("chat-template-list-of-numbers", template_case([1, 2]))
    add("bos-token-a-number", json_field("tokenizer_config.json", "bos_token", 5))
    add("add-bos-token-text", json_field("tokenizer_config.json", "add_bos_token", "yes"))
    add("generation-config-not-json", file_text("generation_config.json", "{\"eos_token_id\": "))
    add("generation-eos-text", json_field("generation_config.json", "eos_token_id", "two"))
    add("chat-template-jinja-not-utf8", file_text("chat_template.jinja", b"{{ '\xff' }}", binary=True))
    add("chat-template-jinja-a-folder", make_dir("chat_template.jinja"))
    add("chat-template-syntax-error", template_case("{% for m in messages %}{{ m.content }"))
    add("chat-template-raise", template_case("{{ raise_exception('no conversations here') }}"))
    add("chat-template-divide-by-zero", template_case("{{ 1 / 0 }}"))
    add("chat-template-recursion", template_case("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"))
    add("chat-template-huge-string", template_case("{{ 'x' * 10 ** 10 }}"))
    add("chat-template-huge-list", template_case("{{ [1] * 10 ** 9 }}"))
    add("chat-template-huge-format", template_case("{{ '{:>99999999999}'.format('x') }}"))
    add("chat-template-huge-center", template_case("{{ 'x' | center(10 ** 10) }}"))
    add("chat-template-endless-output", template_case(
        "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxxxxxxxx{% endfor %}{% endfor %}"))
    # sandbox escapes: each would write the marker or print it if it got out
    escapes = [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('echo " + LEAK_MARK + " > " + LEAK_MARK + "').read() }}",
        "{{ lipsum.__globals__['os'].system('touch " + LEAK_MARK + "') }}",
        "{{ joiner.__init__.__globals__.__builtins__.open('" + LEAK_MARK + "', 'w').write('x') }}",
        "{{ namespace.__init__.__globals__.os.system('touch " + LEAK_MARK + "') }}",
        "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch " + LEAK_MARK + "') }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__['__builtins__']['open']('" + LEAK_MARK + "', 'w') }}",
        "{{ strftime_now.__globals__ }}",
        "{% set x = messages.append({'role': 'user', 'content': '" + LEAK_MARK + "'}) %}{{ messages }}",
        "{% set _ = messages.pop() %}{{ messages }}",
        "{{ (messages | first).update({'content': '" + LEAK_MARK + "'}) }}",
        "{{ ''.format.__self__.__class__ }}",
        "{{ '{0.__class__.__mro__}'.format('') }}",
        "{{ request.application.__globals__ }}",
    ]
    for i, t in enumerate(escapes):
        add(f"sandbox-escape-{i + 1:02d}", template_case(t), must_fail=False)
    return c


# ---------------------------------------------------------------------------------------------
# GGUF mutations


def _kv_replace(kv: list, key: str, vtype=None, value=None, delete: bool = False) -> list:
    out = [e for e in kv if e[0] != key]
    if not delete:
        out.append((key, vtype, value))
    return out


def gguf_case(kv_edit=None, tensor_edit=None, **layout):
    """The base GGUF rebuilt with kv_edit(kv) -> kv, tensor_edit(tensors) -> tensors and header overrides."""
    def build(base, out):
        kv = base_gguf_kv()
        vocab = len(dict((k, v) for k, _, v in kv)["tokenizer.ggml.tokens"][1])
        tensors = base_gguf_tensors(vocab)
        if kv_edit is not None:
            kv = kv_edit(kv) or kv
        if tensor_edit is not None:
            tensors = tensor_edit(tensors) or tensors
        path = out / "model.gguf"
        path.write_bytes(gguf_bytes(kv, tensors, **layout))
        return path
    return build


def kv_set(key, vtype, value):
    return gguf_case(lambda kv: _kv_replace(kv, key, vtype, value))


def kv_del(key):
    return gguf_case(lambda kv: _kv_replace(kv, key, delete=True))


def gguf_patch(offset_fn, raw: bytes):
    """The base GGUF with bytes overwritten at offset_fn(data)."""
    def build(base, out):
        data = bytearray(Path(base).read_bytes())
        at = offset_fn(bytes(data))
        data[at:at + len(raw)] = raw
        path = out / "model.gguf"
        path.write_bytes(bytes(data))
        return path
    return build


def _first_key_len_at(data: bytes) -> int:
    return 24


def _tensor_edit(index: int, **changes):
    def edit(tensors):
        tensors[index] = dict(tensors[index], **changes)
    return edit


def _gguf_path_build(fn):
    def build(base, out):
        path = out / "model.gguf"
        fn(base, path)
        return path
    return build


def _gguf_cases() -> list:
    c = []
    add = lambda name, build, must_fail=True: c.append(Case("gguf-" + name, "gguf", build, must_fail))
    add("base", gguf_case(), must_fail=False)
    # the file itself
    add("empty-file", _gguf_path_build(lambda b, p: p.write_bytes(b"")))
    add("ten-bytes", _gguf_path_build(lambda b, p: p.write_bytes(b"GGUF\x03\0\0\0\0\0")))
    add("a-folder", _gguf_path_build(lambda b, p: p.mkdir()))
    add("symlink-loop", _gguf_path_build(lambda b, p: (os.symlink(p.name + ".b", p),
                                                       os.symlink(p.name, p.parent / (p.name + ".b")))))
    add("dangling-link", _gguf_path_build(lambda b, p: os.symlink("/nonexistent/hearth.gguf", p)))
    add("magic-wrong", gguf_case(magic=b"GGUG"))
    add("magic-lowercase", gguf_case(magic=b"gguf"))
    add("version-1", gguf_case(version=1))
    add("version-99", gguf_case(version=99))
    add("version-2-pow-31", gguf_case(version=2 ** 31))
    add("kv-count-2-pow-60", gguf_case(n_kv=2 ** 60))
    add("kv-count-one-too-many", gguf_case(n_kv=len(base_gguf_kv()) + 1))
    add("kv-count-too-few", gguf_case(n_kv=3))
    add("tensor-count-2-pow-60", gguf_case(n_tensors=2 ** 60))
    add("tensor-count-one-too-many", gguf_case(n_tensors=len(base_gguf_tensors(263)) + 1))
    add("key-length-2-pow-50", gguf_patch(_first_key_len_at, struct.pack("<Q", 2 ** 50)))
    add("key-length-past-end", gguf_patch(_first_key_len_at, struct.pack("<Q", 10 ** 9)))
    add("key-not-utf8", gguf_case(raw_kv=_s(b"bad\xff\xfekey") + struct.pack("<I", U32) + struct.pack("<I", 1)))
    add("key-twice", gguf_case(lambda kv: kv + [("llama.block_count", U32, 2)]))
    add("value-type-99", gguf_case(raw_kv=_s("x.y") + struct.pack("<I", 99) + b"\0" * 8))
    add("string-length-2-pow-62", gguf_case(raw_kv=_s("x.s") + struct.pack("<I", STR) + struct.pack("<Q", 2 ** 62)))
    add("array-count-2-pow-62", gguf_case(raw_kv=_s("x.a") + struct.pack("<IIQ", ARR, U32, 2 ** 62)))
    add("array-element-type-99", gguf_case(raw_kv=_s("x.a") + struct.pack("<IIQ", ARR, 99, 1) + b"\0" * 8))
    add("array-of-arrays-deep", gguf_case(raw_kv=_s("x.a") + struct.pack("<IIQ", ARR, ARR, 1)
                                          + struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", ARR, 1)
                                          + struct.pack("<IQ", U8, 1) + b"\0"))
    add("float-nan", kv_set("llama.attention.layer_norm_rms_epsilon", F32, float("nan")))
    add("alignment-3", kv_set("general.alignment", U32, 3))
    add("alignment-zero", kv_set("general.alignment", U32, 0))
    add("alignment-text", kv_set("general.alignment", STR, "32"))
    # metadata of the wrong type or range
    add("architecture-a-number", kv_set("general.architecture", U32, 5))
    add("architecture-unknown", kv_set("general.architecture", STR, "gptj"))
    add("architecture-missing", kv_del("general.architecture"))
    add("embedding-length-text", kv_set("llama.embedding_length", STR, "64"))
    add("embedding-length-zero", kv_set("llama.embedding_length", U32, 0))
    add("embedding-length-disagrees", kv_set("llama.embedding_length", U32, 128))
    add("block-count-2-pow-40", kv_set("llama.block_count", U64, 2 ** 40))
    add("block-count-missing", kv_del("llama.block_count"))
    add("head-count-zero", kv_set("llama.attention.head_count", U32, 0))
    add("head-count-kv-3", kv_set("llama.attention.head_count_kv", U32, 3))
    add("head-count-kv-bool", kv_set("llama.attention.head_count_kv", BOOL, True))
    add("context-negative", kv_set("llama.context_length", I32, -1))
    add("context-float", kv_set("llama.context_length", F32, 256.0))
    add("feed-forward-disagrees", kv_set("llama.feed_forward_length", U32, 100))
    add("rms-eps-text", kv_set("llama.attention.layer_norm_rms_epsilon", STR, "1e-5"))
    add("rope-base-negative", kv_set("llama.rope.freq_base", F32, -5.0))
    add("rope-scaling-type-number", kv_set("llama.rope.scaling.type", U32, 1))
    add("rope-scaling-yarn", kv_set("llama.rope.scaling.type", STR, "yarn"))
    add("vocab-size-2-pow-40", kv_set("llama.vocab_size", U64, 2 ** 40))
    # tokenizer metadata
    add("tokens-numbers", kv_set("tokenizer.ggml.tokens", ARR, (U32, list(range(263)))))
    add("tokens-missing", kv_del("tokenizer.ggml.tokens"))
    add("token-type-short", kv_set("tokenizer.ggml.token_type", ARR, (I32, [1, 1, 1])))
    add("token-type-text", kv_set("tokenizer.ggml.token_type", ARR, (STR, ["x"] * 263)))
    add("scores-short", kv_set("tokenizer.ggml.scores", ARR, (F32, [0.0] * 5)))
    add("merges-no-space", kv_set("tokenizer.ggml.merges", ARR, (STR, ["he", "l l"])))
    add("merges-unknown-tokens", kv_set("tokenizer.ggml.merges", ARR, (STR, ["q z", "l l"])))
    add("merges-result-unknown", kv_set("tokenizer.ggml.merges", ARR, (STR, ["e h"])))
    add("merges-numbers", kv_set("tokenizer.ggml.merges", ARR, (U32, [1, 2, 3])))
    add("merges-empty-halves", kv_set("tokenizer.ggml.merges", ARR, (STR, [" ", "h "])))
    add("merges-a-string", kv_set("tokenizer.ggml.merges", STR, "h e"))
    add("tokenizer-model-bert", kv_set("tokenizer.ggml.model", STR, "bert"))
    add("tokenizer-model-number", kv_set("tokenizer.ggml.model", U32, 2))
    add("tokenizer-pre-unknown", kv_set("tokenizer.ggml.pre", STR, "klingon"))
    add("bos-id-text", kv_set("tokenizer.ggml.bos_token_id", STR, "1"))
    add("bos-id-huge", kv_set("tokenizer.ggml.bos_token_id", U64, 2 ** 63))
    add("chat-template-a-number", kv_set("tokenizer.chat_template", U32, 7))
    add("chat-template-escape", kv_set("tokenizer.chat_template", STR,
                                       "{{ cycler.__init__.__globals__.os.system('touch " + LEAK_MARK + "') }}"),
        must_fail=False)
    add("add-bos-text", kv_set("tokenizer.ggml.add_bos_token", STR, "yes"))
    # tensor infos
    add("tensor-dims-zero", gguf_case(tensor_edit=_tensor_edit(1, n_dims=0, dims=[])))
    add("tensor-dims-nine", gguf_case(tensor_edit=_tensor_edit(1, n_dims=9, dims=[1] * 9)))
    add("tensor-dim-zero", gguf_case(tensor_edit=_tensor_edit(1, dims=[0])))
    add("tensor-dim-2-pow-62", gguf_case(tensor_edit=_tensor_edit(1, dims=[2 ** 62])))
    add("tensor-type-99", gguf_case(tensor_edit=_tensor_edit(1, type=99)))
    add("tensor-type-q4-0-bad-rows", gguf_case(tensor_edit=_tensor_edit(1, type=2, dims=[48])))
    add("tensor-type-unsupported", gguf_case(tensor_edit=_tensor_edit(1, type=16, dims=[256], data=b"\0" * 66)))
    add("tensor-offset-unaligned", gguf_case(tensor_edit=_tensor_edit(2, offset=33)))
    add("tensor-offset-past-end", gguf_case(tensor_edit=_tensor_edit(2, offset=2 ** 40)))
    add("tensor-offset-overlap", gguf_case(tensor_edit=_tensor_edit(2, offset=0)))
    add("tensor-name-twice", gguf_case(tensor_edit=_tensor_edit(2, name="token_embd.weight")))
    add("tensor-name-unknown", gguf_case(tensor_edit=_tensor_edit(2, name="blk.0.mystery.weight")))
    add("tensor-name-not-utf8", gguf_case(tensor_edit=_tensor_edit(2, name=b"blk.0.\xff\xfe.weight")))
    add("token-embd-missing", gguf_case(tensor_edit=lambda ts: [t for t in ts if t["name"] != "token_embd.weight"]))
    add("layer-tensor-missing", gguf_case(tensor_edit=lambda ts: [t for t in ts if t["name"] != "blk.1.attn_k.weight"]))
    add("truncated-in-data", gguf_case(truncate=-4096))
    add("truncated-in-header", gguf_case(truncate=600))
    return c


def cases() -> list:
    return _st_cases() + _gguf_cases()


def by_name() -> dict:
    table = {c.name: c for c in cases()}
    assert len(table) == len(cases()), "case names must be unique"
    return table
