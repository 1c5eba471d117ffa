"""The boundary: every field read from a checkpoint file is checked here before anything trusts it.

One place per format. A checkpoint is untrusted input (a download, a copy cut short, a hand edit), so
each value gets its type, its range, and the sizes it implies against the file's real size checked
before anything is allocated or looped over. What fails is a typed error (engine/errors.py) that
names the file, the field and what was wrong; no reader behind this module sees an unchecked value.

- JSON files (config.json, the shard index, tokenizer and generation settings): `load_json` refuses
  NaN / Infinity, numbers of more than 20 digits and nesting deeper than Python can parse, then
  `config_int` / `config_float` / ... check each field a reader takes.
- safetensors: `safetensors_header` checks the length field, the header JSON and every entry
  (dtype, shape, offsets) against the file's size; `weight_file` refuses folders, dangling or
  looping links where a weight file should be.
- GGUF: `gguf_header` walks the key/value table and tensor infos with every count and string length
  bounded by the bytes left in the file, every tensor type known, every offset aligned and inside
  the file, before the gguf package's reader is let near it; `gguf_int`, `gguf_str` ... check the
  metadata values a reader takes, and `gguf_tokenizer` the vocabulary, merges and token types.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from pathlib import Path
from typing import Optional

from .errors import CorruptCheckpoint, MissingConfig

# Bounds no real checkpoint comes near; each keeps an absurd value from costing time or memory.
MAX_LAYERS = 1024
MAX_HIDDEN = 1 << 17            # hidden / intermediate / head_dim widths
MAX_HEADS = 1 << 12
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 32           # 4G tokens: beyond it a plan says "does not fit", not a crash
MAX_EXPERTS = 1 << 12
MAX_TENSOR_DIM = 1 << 40
MAX_DIMS = 8
MAX_JSON_BYTES = 64 << 20       # a config or settings file; tokenizer.json is read by `tokenizers`
MAX_INT_DIGITS = 20             # a u64 has 20 digits


# ---------------------------------------------------------------------------------------------
# JSON


class _Refused(ValueError):
    pass


def _parse_int(text: str) -> int:
    digits = text.lstrip("-")
    if len(digits) > MAX_INT_DIGITS:
        raise _Refused(f"a number of {len(digits)} digits ({text[:12]}...)")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:24]} is too large to be finite")
    return value


def _parse_constant(name: str):
    raise _Refused(f"{name} is not a number a checkpoint may hold")


def parse_json(raw, name: str, what: str):
    """A JSON value from bytes or text, refusing NaN / Infinity, huge numbers and absurd nesting."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
        if isinstance(raw, memoryview):
            text = bytes(raw).decode("utf-8")
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except _Refused as exc:
        raise CorruptCheckpoint(f"{name} ({what}) holds {exc}.") from None
    except RecursionError:
        raise CorruptCheckpoint(f"{name} ({what}) is nested too deeply to be a real {what}.") from None
    except UnicodeDecodeError:
        raise CorruptCheckpoint(f"{name} ({what}) is not UTF-8 text.") from None
    except ValueError as exc:
        raise CorruptCheckpoint(f"{name} ({what}) is not valid JSON: {exc}") from None


def readable_file(path: Path, what: str) -> int:
    """The size of a regular file, or a clear error for a folder, a dangling or looping link."""
    try:
        st = os.stat(path)
    except OSError as exc:
        reason = "a link that leads nowhere (or in a loop)" if os.path.islink(path) else exc.strerror
        raise CorruptCheckpoint(f"{Path(path).name} ({what}) cannot be read: {reason}.") from None
    import stat

    if stat.S_ISDIR(st.st_mode):
        raise CorruptCheckpoint(f"{Path(path).name} should be a file ({what}) but is a folder.")
    if not stat.S_ISREG(st.st_mode):
        raise CorruptCheckpoint(f"{Path(path).name} ({what}) is not a regular file.")
    return st.st_size


def load_json(path: Path, what: str, max_bytes: int = MAX_JSON_BYTES) -> dict:
    """A JSON object from a checkpoint file, every failure a CorruptCheckpoint naming the file."""
    path = Path(path)
    size = readable_file(path, what)
    if size > max_bytes:
        raise CorruptCheckpoint(f"{path.name} ({what}) is {size:,} bytes, far larger than such a file can be.")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CorruptCheckpoint(f"{path.name} ({what}) cannot be read: {exc.strerror}.") from None
    value = parse_json(raw, path.name, what)
    if not isinstance(value, dict):
        raise CorruptCheckpoint(f"{path.name} ({what}) is not a JSON object.")
    return value


def optional_json(path: Path, what: str) -> Optional[dict]:
    """load_json when the file is there (a link counts, even a broken one), else None."""
    if not os.path.lexists(path):
        return None
    return load_json(path, what)


# ---------------------------------------------------------------------------------------------
# Typed fields of a JSON object


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def config_int(obj: dict, key: str, lo: int, hi: int, default=None, file: str = "config.json",
               required: bool = False, error=MissingConfig) -> Optional[int]:
    """An integer field in [lo, hi]; an integral float (4096.0) is accepted, as transformers does."""
    value = obj.get(key)
    if value is None:
        if required:
            raise error(f"{file} lacks {key}, which Hearth needs to know the model's shape.")
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise error(f"{file}: {key} should be a whole number but is {_show(value)}.")
    if not lo <= value <= hi:
        raise error(f"{file}: {key} is {value:,}, outside what a model can have ({lo:,} to {hi:,}).")
    return value


def config_float(obj: dict, key: str, lo: float, hi: float, default=None, file: str = "config.json",
                 open_low: bool = True, error=MissingConfig) -> Optional[float]:
    value = obj.get(key)
    if value is None:
        return default
    if not (_is_int(value) or isinstance(value, float)):
        raise error(f"{file}: {key} should be a number but is {_show(value)}.")
    value = float(value)
    if not math.isfinite(value) or value > hi or value < lo or (open_low and value == lo):
        raise error(f"{file}: {key} is {value:g}, outside what a model can use "
                    f"({'more than' if open_low else 'from'} {lo:g} to {hi:g}).")
    return value


def config_bool(obj: dict, key: str, default: bool, file: str = "config.json") -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise MissingConfig(f"{file}: {key} should be true or false but is {_show(value)}.")
    return value


def config_str(obj: dict, key: str, default: str = "", file: str = "config.json") -> str:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise MissingConfig(f"{file}: {key} should be text but is {_show(value)}.")
    return value


def token_ids(value, key: str, file: str) -> tuple:
    """An id or a list of ids (eos_token_id), each a non-negative whole number below 2^24."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if len(items) > 1024 or not all(_is_int(i) and 0 <= i < MAX_VOCAB for i in items):
        raise MissingConfig(f"{file}: {key} should be a token id or a list of token ids but is {_show(value)}.")
    return tuple(items)


def _show(value) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, bytearray)) else repr(value)
    kind = {dict: "an object", list: "a list", str: "text", bool: "true/false", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)
    return f"{kind} ({text[:40]}{'...' if len(text) > 40 else ''})"


def decoder_fields(config: dict) -> dict:
    """The checked values of a Hugging Face config.json that DecoderConfig is built from."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise MissingConfig(f"config.json: text_config should be an object but is {_show(text)}.")
    text = text or config
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise MissingConfig(f"config.json: architectures should be a list of names but is {_show(archs)}.")
    for key in ("model_type",):
        config_str(text, key)
        config_str(config, key)
    hidden = config_int(text, "hidden_size", 1, MAX_HIDDEN, required=True)
    heads = config_int(text, "num_attention_heads", 1, MAX_HEADS, required=True)
    layers = config_int(text, "num_hidden_layers", 1, MAX_LAYERS, required=True)
    vocab = config_int(text, "vocab_size", 1, MAX_VOCAB, required=True)
    kv_heads = config_int(text, "num_key_value_heads", 1, heads) or heads
    head_dim = config_int(text, "head_dim", 1, MAX_HIDDEN)
    if head_dim is None:
        if hidden % heads:
            raise MissingConfig(f"config.json: hidden_size {hidden} is not a multiple of its {heads} attention "
                                "heads and no head_dim says how wide a head is.")
        head_dim = hidden // heads
    for key in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        config_int(text, key, 0, MAX_HIDDEN)
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        config_int(text, key, 0, MAX_EXPERTS)
    # num_experts_per_tok is judged against the expert count by the MoE layout (engine/moe.py), whose
    # reason a user reads ("top-9 of 8 experts"); only its type and sign are the boundary's.
    config_int(text, "num_experts_per_tok", 0, MAX_EXPERTS)
    config_int(text, "decoder_sparse_step", 0, MAX_LAYERS)
    config_int(text, "ep_size", 0, 1 << 16)
    factor = text.get("routed_scaling_factor")
    if factor is not None and not isinstance(factor, bool):
        config_float(text, "routed_scaling_factor", -1e6, 1e6, open_low=False)
    dense = text.get("mlp_only_layers")
    if dense is not None and not (isinstance(dense, list) and len(dense) <= MAX_LAYERS
                                  and all(_is_int(i) and 0 <= i < MAX_LAYERS for i in dense)):
        raise MissingConfig(f"config.json: mlp_only_layers should be a list of layer numbers but is {_show(dense)}.")
    context = config_int(text, "max_position_embeddings", 1, MAX_CONTEXT)
    eps = config_float(text, "rms_norm_eps", 0.0, 1.0)
    theta = config_float(text, "rope_theta", 0.0, 1e12)
    for key in ("tie_word_embeddings", "attention_bias", "qkv_bias", "norm_topk_prob"):
        config_bool(text, key, False)
        config_bool(config, key, False)
    for key in ("bos_token_id",):
        for where in (text, config):
            if where.get(key) is not None and not (_is_int(where[key]) and 0 <= where[key] < MAX_VOCAB):
                raise MissingConfig(f"config.json: {key} should be a token id but is {_show(where[key])}.")
    token_ids(text.get("eos_token_id"), "eos_token_id", "config.json")
    token_ids(config.get("eos_token_id"), "eos_token_id", "config.json")
    return dict(text=text, hidden=hidden, heads=heads, layers=layers, vocab=vocab, kv_heads=kv_heads,
                head_dim=head_dim, context=context, eps=eps, theta=theta,
                rope_scaling=rope_scaling(text))


# rope type -> the fields it needs, each (name, lowest, highest, whole number)
_ROPE_FIELDS = {
    "linear": (("factor", 0.0, 1e6, False),),
    "llama3": (("factor", 0.0, 1e6, False), ("low_freq_factor", 0.0, 1e6, False),
               ("high_freq_factor", 0.0, 1e6, False), ("original_max_position_embeddings", 0, MAX_CONTEXT, True)),
}


def rope_scaling(text: dict) -> Optional[dict]:
    """The rope scaling of a config (None when there is none), complete for the types Hearth runs."""
    scaling = text.get("rope_scaling")
    if scaling is None:
        scaling = text.get("rope_parameters")
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise MissingConfig(f"config.json: rope_scaling should be an object but is {_show(scaling)}.")
    if scaling.get("rope_theta") is not None:
        config_float(scaling, "rope_theta", 0.0, 1e12, file="config.json rope_parameters")
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return None
    if not isinstance(kind, str):
        raise MissingConfig(f"config.json: rope_scaling's rope_type should be a name but is {_show(kind)}.")
    for key, lo, hi, whole in _ROPE_FIELDS.get(kind, ()):
        if scaling.get(key) is None:
            raise MissingConfig(f"config.json: {kind} rope scaling needs {key}, which is missing.")
        if whole:
            config_int(scaling, key, lo + 1, hi, file=f"config.json {kind} rope scaling")
        else:
            config_float(scaling, key, lo, hi, file=f"config.json {kind} rope scaling")
    if kind == "llama3" and not float(scaling["high_freq_factor"]) > float(scaling["low_freq_factor"]):
        raise MissingConfig("config.json: llama3 rope scaling needs high_freq_factor above low_freq_factor.")
    return dict(scaling, rope_type=kind)


def tokenizer_settings(settings: dict, file: str = "tokenizer_config.json") -> None:
    """The tokenizer settings Hearth reads: the chat template, special tokens, add_bos_token."""
    template = settings.get("chat_template")
    if template is not None and not isinstance(template, str):
        named = isinstance(template, list) and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
            for t in template)
        if not named:
            raise CorruptCheckpoint(f"{file}: chat_template should be text (or a list of named templates) "
                                    f"but is {_show(template)}.")
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = settings.get(key)
        if value is None or isinstance(value, str):
            continue
        if not (isinstance(value, dict) and isinstance(value.get("content"), str)):
            raise CorruptCheckpoint(f"{file}: {key} should be a token's text but is {_show(value)}.")
    value = settings.get("add_bos_token")
    if value is not None and not isinstance(value, bool):
        raise CorruptCheckpoint(f"{file}: add_bos_token should be true or false but is {_show(value)}.")


def generation_settings(settings: dict, file: str = "generation_config.json") -> None:
    try:
        token_ids(settings.get("eos_token_id"), "eos_token_id", file)
    except MissingConfig as exc:
        raise CorruptCheckpoint(exc.message) from None


def quantization_settings(settings, file: str) -> None:
    """quantization_config (config.json) or hf_quant_config.json's "quantization": the shapes the
    NVFP4 reader (engine/nvfp4_checkpoint.py) walks: objects where it looks up keys, lists of module
    names, whole numbers for sizes."""
    if settings is None:
        return
    if not isinstance(settings, dict):
        raise CorruptCheckpoint(f"{file}: the quantization settings should be an object but are {_show(settings)}.")

    def fail(what):
        raise CorruptCheckpoint(f"{file}: the quantization settings' {what}.")

    for key in ("quant_algo", "quant_method", "format"):
        if settings.get(key) is not None and not isinstance(settings[key], str):
            fail(f"{key} should be a name but is {_show(settings[key])}")
    for key in ("ignore", "exclude_modules"):
        value = settings.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            fail(f"{key} should be a list of module names but is {_show(value)}")
    kv = settings.get("kv_cache_scheme") or settings.get("kv_cache_quant_algo")
    if kv is not None and not isinstance(kv, (str, dict)):
        fail(f"KV-cache scheme should be a name or an object but is {_show(kv)}")
    groups = settings.get("config_groups")
    if groups is not None and not isinstance(groups, dict):
        fail(f"config_groups should be an object but is {_show(groups)}")
    for name, group in (groups or {}).items():
        if not isinstance(group, dict):
            continue
        for part in ("weights", "input_activations"):
            value = group.get(part)
            if value is not None and not isinstance(value, dict):
                fail(f"{part} of group {name} should be an object but is {_show(value)}")
        if group.get("format") is not None and not isinstance(group["format"], str):
            fail(f"format of group {name} should be a name but is {_show(group['format'])}")


def shard_index(index: dict, folder: Path) -> dict:
    """weight_map of model.safetensors.index.json: tensor name -> a shard file inside the folder."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CorruptCheckpoint("model.safetensors.index.json has no weight_map.")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise CorruptCheckpoint(f"model.safetensors.index.json: the shard of {tensor} should be a file "
                                    f"name but is {_show(shard)}.")
        if "/" in shard or "\\" in shard or shard in (".", "..") or not shard.endswith(".safetensors"):
            raise CorruptCheckpoint(f"model.safetensors.index.json names the shard {shard!r}, which is not a "
                                    ".safetensors file in the model's folder.")
    return weight_map


# ---------------------------------------------------------------------------------------------
# safetensors

SAFETENSORS_DTYPES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U32": 4, "U16": 2, "U64": 8,
}
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def safetensors_header(file: Path) -> tuple:
    """(data start, [(name, dtype, shape, begin, end)]) of one safetensors file, every entry checked.

    Types of each field, shapes of at most 8 non-negative dimensions, offsets that are two whole
    numbers covering exactly the dtype's bytes, inside the file, not overlapping each other.
    """
    from .errors import UnsupportedTensorType

    file = Path(file)
    name = file.name
    size = readable_file(file, "weights")
    if size < 8:
        raise CorruptCheckpoint(f"{name} is truncated: it is {size} bytes, too short for a header.")
    try:
        with open(file, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > min(size - 8, MAX_SAFETENSORS_HEADER):
                raise CorruptCheckpoint(
                    f"{name} is corrupt or truncated: its header claims {header_len:,} bytes but the "
                    f"file holds {size - 8:,} after the length field.")
            raw = f.read(header_len)
    except OSError as exc:
        raise CorruptCheckpoint(f"{name} cannot be read: {exc.strerror}.") from None
    try:
        header = parse_json(raw, name, "safetensors header")
    except CorruptCheckpoint as exc:
        detail = exc.message.split("(safetensors header) ", 1)[-1].rstrip(".")
        raise CorruptCheckpoint(f"{name} has a malformed header ({detail}).") from None
    if not isinstance(header, dict):
        raise CorruptCheckpoint(f"{name} has a malformed header (it is not a JSON object).")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CorruptCheckpoint(f"{name}: the header's __metadata__ should map names to text.")
    data_start = 8 + header_len
    data_size = size - data_start
    entries = []
    for tname, entry in header.items():
        if tname == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise CorruptCheckpoint(f"{name}: the header entry for {tname} is malformed (not an object).")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise CorruptCheckpoint(f"{name}: the header entry for {tname} is malformed (its dtype is "
                                    f"{_show(dtype)}).")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
                and all(_is_int(d) and 0 <= d <= MAX_TENSOR_DIM for d in shape)):
            raise CorruptCheckpoint(f"{name}: the header entry for {tname} is malformed (its shape "
                                    f"{_show(shape)} is not a list of at most {MAX_DIMS} sizes).")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(x) for x in offsets)):
            raise CorruptCheckpoint(f"{name}: the header entry for {tname} is malformed (data_offsets "
                                    f"{_show(offsets)} is not two byte offsets).")
        if dtype not in SAFETENSORS_DTYPES:
            raise UnsupportedTensorType(f"{name}: tensor {tname} has dtype {dtype}, which Hearth cannot read.")
        begin, end = offsets
        if not 0 <= begin <= end:
            raise CorruptCheckpoint(f"{name}: tensor {tname} has a negative shape or offsets.")
        expected = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        if end - begin != expected:
            raise CorruptCheckpoint(
                f"{name}: tensor {tname} is {dtype} {list(shape)}, which needs {expected:,} bytes, "
                f"but the header gives it {end - begin:,}.")
        if end > data_size:
            raise CorruptCheckpoint(
                f"{name} is truncated: tensor {tname} ends at byte {data_start + end:,} but the file "
                f"has only {size:,} bytes. Download or copy it again.")
        entries.append((tname, dtype, tuple(shape), begin, end))
    entries.sort(key=lambda e: (e[3], e[4]))
    for before, after in zip(entries, entries[1:]):
        if after[3] < before[4]:
            raise CorruptCheckpoint(f"{name}: tensors {before[0]} and {after[0]} overlap in the file.")
    return data_start, entries


# ---------------------------------------------------------------------------------------------
# GGUF

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
MAX_GGUF_KEY = 1 << 16
MAX_GGUF_ARRAY_DEPTH = 3
# value type -> (struct format, bytes); 8 is a string, 9 an array
_GGUF_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
                 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_MIN_BYTES = {**{t: n for t, (_, n) in _GGUF_SCALARS.items()}, _GGUF_STRING: 8, _GGUF_ARRAY: 12}


class _Cursor:
    def __init__(self, buf, name: str):
        self.buf, self.pos, self.name, self.size = buf, 0, name, len(buf)

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str):
        if n > self.left():
            raise CorruptCheckpoint(f"{self.name} is truncated or corrupt: {what} needs {n:,} bytes at byte "
                                    f"{self.pos:,}, but the file ends at {self.size:,}.")
        start = self.pos
        self.pos += n
        return start

    def unpack(self, fmt: str, n: int, what: str):
        return struct.unpack_from(fmt, self.buf, self.take(n, what))[0]

    def string(self, what: str, limit: Optional[int] = None) -> str:
        n = self.unpack("<Q", 8, f"the length of {what}")
        if limit is not None and n > limit:
            raise CorruptCheckpoint(f"{self.name} is corrupt: {what} claims {n:,} bytes, more than such a "
                                    f"string can be.")
        start = self.take(n, what)
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptCheckpoint(f"{self.name} is corrupt: {what} is not UTF-8 text.") from None


def _gguf_value(cur: _Cursor, vtype: int, key: str, depth: int = 0):
    if vtype in _GGUF_SCALARS:
        fmt, n = _GGUF_SCALARS[vtype]
        value = cur.unpack(fmt, n, f"the value of {key}")
        if vtype in (6, 12) and not math.isfinite(value):
            raise CorruptCheckpoint(f"{cur.name} is corrupt: metadata key {key} is {value}, not a finite number.")
        return value
    if vtype == _GGUF_STRING:
        return cur.string(f"the text of {key}")
    if vtype == _GGUF_ARRAY:
        etype = cur.unpack("<I", 4, f"the element type of {key}")
        count = cur.unpack("<Q", 8, f"the length of {key}")
        if etype not in _MIN_BYTES:
            raise CorruptCheckpoint(f"{cur.name} is corrupt: metadata key {key} has elements of unknown type {etype}.")
        if etype == _GGUF_ARRAY and depth + 1 >= MAX_GGUF_ARRAY_DEPTH:
            raise CorruptCheckpoint(f"{cur.name} is corrupt: metadata key {key} nests arrays too deeply.")
        if count * _MIN_BYTES[etype] > cur.left():
            raise CorruptCheckpoint(f"{cur.name} is truncated or corrupt: metadata key {key} claims {count:,} "
                                    f"elements, more than the {cur.left():,} bytes left in the file can hold.")
        if etype in _GGUF_SCALARS:      # fixed-size elements: skip them in one step
            fmt, n = _GGUF_SCALARS[etype]
            start = cur.take(count * n, f"the elements of {key}")
            if etype in (6, 12) and count:
                import numpy as np

                values = np.frombuffer(cur.buf, dtype="<f4" if etype == 6 else "<f8", count=count, offset=start)
                if not np.isfinite(values).all():
                    raise CorruptCheckpoint(f"{cur.name} is corrupt: metadata key {key} holds a number that is "
                                            "not finite.")
            return _LazyArray(etype, count, start)
        return [_gguf_value(cur, etype, key, depth + 1) for _ in range(count)]
    raise CorruptCheckpoint(f"{cur.name} is corrupt: metadata key {key} has unknown value type {vtype}.")


class _LazyArray:
    """A fixed-size array left in the file (its bounds are checked; nothing is copied)."""
    def __init__(self, etype, count, start):
        self.etype, self.count, self.start = etype, count, start


def _ggml_traits() -> dict:
    """GGML type id -> (name, elements per block, bytes per block) for the types the gguf package knows."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}


def gguf_header(path: Path) -> dict:
    """Walk a GGUF file's header with every count, length, type and offset checked against its size.

    Returns {"version", "metadata": {key: value}, "tensors": [(name, type name, dims, offset, bytes)]}
    where offsets are absolute; string values and string arrays are decoded, fixed-size arrays are
    left in the file. Only after this passes is the gguf package's reader run over the file.
    """
    path = Path(path)
    size = readable_file(path, "GGUF model")
    name = path.name
    if size < 24:
        raise CorruptCheckpoint(f"{name} is truncated: {size} bytes cannot hold a GGUF header.")
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"{name} cannot be read: {exc}.") from None
    try:
        return _walk_gguf(memoryview(buf), name, size)
    finally:
        try:
            buf.close()
        except BufferError:     # a memoryview slice still referenced: the mapping closes with it
            pass


def _walk_gguf(buf, name: str, size: int) -> dict:
    cur = _Cursor(buf, name)
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise CorruptCheckpoint(f"{name} is not a GGUF file (it does not start with the GGUF magic bytes)")
    cur.pos = 4
    version = cur.unpack("<I", 4, "the version")
    if version not in GGUF_VERSIONS:
        raise CorruptCheckpoint(f"{name} is GGUF version {version}; Hearth reads versions "
                                f"{', '.join(map(str, GGUF_VERSIONS))}.")
    n_tensors = cur.unpack("<Q", 8, "the tensor count")
    n_kv = cur.unpack("<Q", 8, "the metadata count")
    if n_kv * 13 > cur.left():          # a key: length (8) + at least 1 byte; a type (4)
        raise CorruptCheckpoint(f"{name} is corrupt: it claims {n_kv:,} metadata keys, more than its "
                                f"{size:,} bytes can hold.")
    if n_tensors * 24 > cur.left():     # a name length (8), dim count (4), type (4), offset (8)
        raise CorruptCheckpoint(f"{name} is corrupt: it claims {n_tensors:,} tensors, more than its "
                                f"{size:,} bytes can hold.")
    metadata: dict = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key", limit=MAX_GGUF_KEY)
        if key in metadata:
            raise CorruptCheckpoint(f"{name} is corrupt: metadata key {key} appears twice.")
        vtype = cur.unpack("<I", 4, f"the type of {key}")
        metadata[key] = _gguf_value(cur, vtype, key)
    alignment = metadata.get("general.alignment", 32)
    if not (isinstance(alignment, int) and not isinstance(alignment, bool) and 0 < alignment <= 1 << 20
            and alignment & (alignment - 1) == 0):
        raise CorruptCheckpoint(f"{name} is corrupt: general.alignment is {alignment!r}, not a power of two.")
    traits = _ggml_traits()
    infos, names = [], set()
    for _ in range(n_tensors):
        tname = cur.string("a tensor name", limit=MAX_GGUF_KEY)
        if tname in names:
            raise CorruptCheckpoint(f"{name} is corrupt: tensor {tname} appears twice.")
        names.add(tname)
        n_dims = cur.unpack("<I", 4, f"the dimension count of {tname}")
        if not 1 <= n_dims <= 4:
            raise CorruptCheckpoint(f"{name} is corrupt: tensor {tname} has {n_dims} dimensions (GGUF allows 1 to 4).")
        dims = [cur.unpack("<Q", 8, f"the shape of {tname}") for _ in range(n_dims)]
        if any(not 1 <= d <= MAX_TENSOR_DIM for d in dims) or math.prod(dims) > MAX_TENSOR_DIM:
            raise CorruptCheckpoint(f"{name} is corrupt: tensor {tname} has the impossible shape {dims}.")
        ttype = cur.unpack("<I", 4, f"the type of {tname}")
        if ttype not in traits:
            from .errors import UnsupportedTensorType

            raise UnsupportedTensorType(f"{name}: tensor {tname} has GGML type {ttype}, which Hearth does not know.")
        type_name, block, type_bytes = traits[ttype]
        if dims[0] % block:
            raise CorruptCheckpoint(f"{name} is corrupt: tensor {tname} ({type_name}) has rows of {dims[0]} "
                                    f"values, not a whole number of its {block}-value blocks.")
        offset = cur.unpack("<Q", 8, f"the offset of {tname}")
        if offset % alignment:
            raise CorruptCheckpoint(f"{name} is corrupt: tensor {tname} starts at offset {offset:,}, not a "
                                    f"multiple of the file's {alignment}-byte alignment.")
        infos.append((tname, type_name, dims, offset, math.prod(dims) // block * type_bytes))
    data_start = -(-cur.pos // alignment) * alignment
    tensors = []
    for tname, type_name, dims, offset, nbytes in infos:
        start = data_start + offset
        if start + nbytes > size:
            raise CorruptCheckpoint(f"{name} is truncated: tensor {tname} ends at byte {start + nbytes:,} but "
                                    f"the file has only {size:,} bytes")
        tensors.append((tname, type_name, dims, start, nbytes))
    ordered = sorted(tensors, key=lambda t: t[3])
    for before, after in zip(ordered, ordered[1:]):
        if after[3] < before[3] + before[4]:
            raise CorruptCheckpoint(f"{name} is corrupt: tensors {before[0]} and {after[0]} overlap in the file.")
    # only the decoded values leave: fixed-size arrays stay as their bounds, the mapping closes
    metadata = {k: v for k, v in metadata.items() if not isinstance(v, _LazyArray)}
    return {"version": version, "metadata": metadata, "tensors": tensors}


def gguf_int(value, key: str, file: str, lo: int, hi: int, default=None) -> Optional[int]:
    """A GGUF metadata value that must be a whole number in [lo, hi]."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        import numpy as np

        if isinstance(value, np.integer) and not isinstance(value, np.bool_):
            value = int(value)
        else:
            raise CorruptCheckpoint(f"{file}: metadata key {key} should be a whole number but is {_show_gguf(value)}.")
    if not lo <= value <= hi:
        raise CorruptCheckpoint(f"{file}: metadata key {key} is {value:,}, outside what a model can have "
                                f"({lo:,} to {hi:,}).")
    return value


def gguf_float(value, key: str, file: str, lo: float, hi: float, default=None) -> Optional[float]:
    if value is None:
        return default
    try:
        number = float(value) if not isinstance(value, (str, bytes, list, bool)) else None
    except (TypeError, ValueError):
        number = None
    if number is None:
        raise CorruptCheckpoint(f"{file}: metadata key {key} should be a number but is {_show_gguf(value)}.")
    if not math.isfinite(number) or not lo < number <= hi:
        raise CorruptCheckpoint(f"{file}: metadata key {key} is {number:g}, outside what a model can use.")
    return value


def gguf_str(value, key: str, file: str, default=None) -> Optional[str]:
    if value is None:
        return default
    if not isinstance(value, str):
        raise CorruptCheckpoint(f"{file}: metadata key {key} should be text but is {_show_gguf(value)}.")
    return value


def gguf_bool(value, key: str, file: str, default: bool) -> bool:
    if value is None:
        return default
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise CorruptCheckpoint(f"{file}: metadata key {key} should be true or false but is {_show_gguf(value)}.")


def _show_gguf(value) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}"


def gguf_tokenizer(file: str, tokens, token_types, scores, merges, model) -> None:
    """The vocabulary arrays agree with each other and the merges name tokens of the vocabulary."""
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise CorruptCheckpoint(f"{file}: tokenizer.ggml.tokens should be a list of texts.")
    if len(tokens) > MAX_VOCAB:
        raise CorruptCheckpoint(f"{file}: tokenizer.ggml.tokens holds {len(tokens):,} tokens, more than a model has.")
    for key, values, kind in (("tokenizer.ggml.token_type", token_types, int),
                              ("tokenizer.ggml.scores", scores, float)):
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != len(tokens):
            raise CorruptCheckpoint(f"{file}: {key} should hold one entry per token ({len(tokens):,}) but holds "
                                    f"{len(values) if isinstance(values, list) else _show_gguf(values)}.")
        if not all(isinstance(v, (int, float) if kind is float else int) and not isinstance(v, bool)
                   for v in values):
            raise CorruptCheckpoint(f"{file}: {key} should hold numbers.")
    if merges is None:
        return
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise CorruptCheckpoint(f"{file}: tokenizer.ggml.merges should be a list of texts.")
    vocab = set(tokens)
    for i, merge in enumerate(merges):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right or left not in vocab or right not in vocab or left + right not in vocab:
            raise CorruptCheckpoint(f"{file}: merge {i:,} of tokenizer.ggml.merges ({merge[:40]!r}) does not join "
                                    "two tokens of the vocabulary into a third; the tokenizer is corrupt.")
