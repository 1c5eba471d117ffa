"""Read GGUF files: inspect one from its header, or import it into a Hugging Face-layout folder.

`inspect_gguf` reads only the key/value table and the tensor infos (the data is memory-mapped and
never touched). `import_gguf` writes `config.json`, `model.safetensors` (bf16), `tokenizer.json`,
`tokenizer_config.json` and `generation_config.json`, so the rest of the engine only ever loads one
layout. Two things make an import more than a copy:

* llama.cpp's converter permutes the rows of attn_q / attn_k (it interleaves the two rotary halves of
  each head); `unpermute_qk` undoes it, with n_head for q and n_head_kv for k.
* A GGUF has no tokenizer.json. The vocabulary, merges and special tokens live in `tokenizer.ggml.*`
  metadata; `build_tokenizer` turns them back into a `tokenizers.Tokenizer`.

The import is atomic: it is built in a hidden folder next to the target and renamed into place at
the end. On any error, or on cancellation from the progress callback, nothing half-written stays.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from . import validate
from .checkpoint import CheckpointInfo, DecoderConfig, ModelMetadata, TensorInfo
from .errors import (CheckpointNotFound, CorruptCheckpoint, HearthError, ImportFailed,
                     UnsupportedArchitecture, UnsupportedTensorType)
from .progress import IMPORTING, ByteCounter, ProgressCallback

GGUF_MAGIC = b"GGUF"

# general.architecture -> (Hugging Face architectures name, model_type)
SUPPORTED_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
}

# GGUF tensor names -> Hugging Face names. Per-layer names are "blk.{i}.<key>.weight".
GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSOR_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")

# GGML token types (llama.cpp's llama_token_type)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# How llama.cpp splits text before byte-level BPE, by `tokenizer.ggml.pre` (see llama-vocab.cpp).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_LEVEL_PRE_TOKENIZERS = {
    # name -> (split each digit on its own first, split regex or None for the GPT-2 one)
    "default": (False, None),
    "gpt-2": (False, None),
    "gpt2": (False, None),
    "smollm": (True, None),
    "starcoder": (True, None),
    "refact": (True, None),
    "llama3": (False, _LLAMA3_SPLIT),
    "llama-v3": (False, _LLAMA3_SPLIT),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "smaug-bpe": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}


# ---------------------------------------------------------------------------------------------
# Reading the header
# ---------------------------------------------------------------------------------------------

def _open_reader(path: Path):
    """A GGUFReader over `path`, with every failure turned into an error that names the file."""
    import gguf

    path = Path(path)
    if not os.path.lexists(path):
        raise CheckpointNotFound(f"No such file: {path}")
    if path.is_dir():
        raise CorruptCheckpoint(f"{path} is a folder, not a GGUF file")
    # Every count, length, type and offset is checked against the file's size before the gguf
    # package's reader (which trusts them) is run over it.
    header = validate.gguf_header(path)
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # whatever the walk above did not foresee stays a typed error
        raise CorruptCheckpoint(f"{path.name} is truncated or corrupt: its GGUF header cannot be read "
                                f"({type(e).__name__}: {e})") from e
    reader.hearth_metadata = header["metadata"]
    return reader


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    checked = getattr(reader, "hearth_metadata", None)
    if checked is not None and key in checked:     # strings and string arrays, decoded by the walk
        return checked[key]
    try:
        return field.contents()
    except Exception as e:
        raise CorruptCheckpoint(f"{Path(reader.data.filename).name}: metadata key {key} cannot be read ({e})") from e


def _int(reader, key: str, lo: int, hi: int, default=None):
    return validate.gguf_int(_field(reader, key), key, Path(reader.data.filename).name, lo, hi, default)


def _f32(value) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def hf_tensor_name(gguf_name: str) -> Optional[str]:
    """The Hugging Face name of a GGUF tensor, or None if Hearth does not know it."""
    if gguf_name in GLOBAL_TENSOR_NAMES:
        return GLOBAL_TENSOR_NAMES[gguf_name]
    m = _LAYER_TENSOR.match(gguf_name)
    if m and m.group(2) in LAYER_TENSOR_NAMES:
        return f"model.layers.{m.group(1)}.{LAYER_TENSOR_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def _dominant_weight_type(tensors: Iterable[TensorInfo]) -> str:
    by_numel = Counter()
    for t in tensors:
        if len(t.shape) >= 2:
            by_numel[t.dtype] += t.numel
    return by_numel.most_common(1)[0][0] if by_numel else "F32"


def inspect_gguf(path) -> CheckpointInfo:
    """Everything about a GGUF model that its header says. Raises CheckpointNotFound,
    CorruptCheckpoint or UnsupportedArchitecture."""
    path = Path(path)
    reader = _open_reader(path)
    return _inspect_reader(path, reader)


def _inspect_reader(path: Path, reader) -> CheckpointInfo:
    name = path.name
    arch = validate.gguf_str(_field(reader, "general.architecture"), "general.architecture", name)
    if arch is None:
        raise CorruptCheckpoint(f"{name} has no general.architecture key; it is not a model GGUF")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitecture(
            f"{name} holds a {arch!r} model; Hearth can import GGUF files of these architectures: "
            f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}")
    hf_arch, model_type = SUPPORTED_ARCHITECTURES[arch]

    def need(key, lo=1, hi=validate.MAX_HIDDEN):
        value = _int(reader, f"{arch}.{key}", lo, hi)
        if value is None:
            raise CorruptCheckpoint(f"{name} lacks the metadata key {arch}.{key}")
        return value

    def number(key, lo, hi, default=None):
        value = validate.gguf_float(_field(reader, f"{arch}.{key}"), f"{arch}.{key}", name, lo, hi, default)
        if value is None:
            raise CorruptCheckpoint(f"{name} lacks the metadata key {arch}.{key}")
        return value

    tensors = [TensorInfo(name=t.name, dtype=t.tensor_type.name,
                          shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                          bytes=int(t.n_bytes), file=name, offset=int(t.data_offset))
               for t in reader.tensors]
    by_name = {t.name: t for t in tensors}
    if "token_embd.weight" not in by_name:
        raise CorruptCheckpoint(f"{name} has no token_embd.weight tensor")

    hidden = need("embedding_length")
    n_heads = need("attention.head_count", hi=validate.MAX_HEADS)
    n_kv = _int(reader, f"{arch}.attention.head_count_kv", 1, n_heads, n_heads)
    if hidden % n_heads and _field(reader, f"{arch}.attention.key_length") is None:
        raise CorruptCheckpoint(f"{name}: embedding_length {hidden} is not a multiple of its {n_heads} heads.")
    head_dim = _int(reader, f"{arch}.attention.key_length", 1, validate.MAX_HIDDEN, hidden // n_heads)
    tokens_field = reader.fields.get("tokenizer.ggml.tokens")
    vocab = (_int(reader, f"{arch}.vocab_size", 0, validate.MAX_VOCAB, 0) or
             (len(tokens_field.data) if tokens_field is not None else by_name["token_embd.weight"].shape[0]))
    tied = "output.weight" not in by_name
    bos, eos, pad = (_int(reader, f"tokenizer.ggml.{k}_token_id", 0, validate.MAX_VOCAB)
                     for k in ("bos", "eos", "padding"))
    context = need("context_length", hi=validate.MAX_CONTEXT)

    rope_scaling = None
    scaling_type = validate.gguf_str(_field(reader, f"{arch}.rope.scaling.type"), f"{arch}.rope.scaling.type", name)
    if scaling_type not in (None, "none"):
        rope_scaling = {"rope_type": scaling_type, "factor": _f32(number("rope.scaling.factor", 0.0, 1e6, 1.0))}
        original = _int(reader, f"{arch}.rope.scaling.original_context_length", 1, validate.MAX_CONTEXT)
        if original is not None:
            rope_scaling["original_max_position_embeddings"] = original

    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count", hi=validate.MAX_LAYERS),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": _f32(number("attention.layer_norm_rms_epsilon", 0.0, 1.0)),
        "rope_theta": _f32(number("rope.freq_base", 0.0, 1e12, 10000.0)),
        "rope_scaling": rope_scaling,
        "max_position_embeddings": context,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "bfloat16",
    }
    dtypes = dict(Counter(t.dtype for t in tensors))
    metadata = ModelMetadata(
        architecture=hf_arch, model_type=model_type,
        parameter_count=sum(t.numel for t in tensors),   # a tied lm_head has no tensor of its own
        dtypes=dtypes, quantization=_dominant_weight_type(tensors), context_length=context,
        vocab_size=vocab, tied_embeddings=tied,
        has_tokenizer=tokens_field is not None and "tokenizer.ggml.model" in reader.fields,
        has_chat_template="tokenizer.chat_template" in reader.fields)
    decoder = DecoderConfig(
        architecture=hf_arch, model_type=model_type, num_layers=config["num_hidden_layers"],
        hidden_size=hidden, num_heads=n_heads, num_kv_heads=n_kv, head_dim=head_dim,
        intermediate_size=config["intermediate_size"], vocab_size=vocab,
        max_position_embeddings=context, rms_norm_eps=config["rms_norm_eps"],
        rope_theta=config["rope_theta"], rope_scaling=rope_scaling, tie_word_embeddings=tied,
        bos_token_id=config["bos_token_id"], eos_token_ids=() if eos is None else (int(eos),))
    return CheckpointInfo(path=path, format="gguf", files={name: path.stat().st_size}, tensors=tensors,
                          config=config, metadata=metadata, decoder=decoder)


# ---------------------------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------------------------

def supported_tensor_types() -> frozenset:
    """GGML type names this build can dequantize (those the gguf package implements)."""
    from gguf import GGMLQuantizationType, quants

    return frozenset({"F32", "F16"} | {t.name for t in quants._type_traits}
                     ) & frozenset(t.name for t in GGMLQuantizationType)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's `permute(w, n_head)`: rows (head, half, i) were stored as (head, i, half)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even like torch does."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def dequantize_tensor(reader_tensor, config: dict) -> np.ndarray:
    """One GGUF tensor as float32 in Hugging Face shape and row order."""
    from gguf import quants

    shape = tuple(int(d) for d in reversed(reader_tensor.shape.tolist()))
    w = quants.dequantize(reader_tensor.data, reader_tensor.tensor_type).reshape(shape)
    m = _LAYER_TENSOR.match(reader_tensor.name)
    if m and m.group(2) == "attn_q":
        w = unpermute_qk(w, config["num_attention_heads"])
    elif m and m.group(2) == "attn_k":
        w = unpermute_qk(w, config["num_key_value_heads"])
    return w


def _check_tensors(path: Path, reader, supported: frozenset) -> None:
    for t in reader.tensors:
        if t.tensor_type.name not in supported:
            raise UnsupportedTensorType(
                f"{path.name}: tensor {t.name} is stored as {t.tensor_type.name}, which Hearth cannot "
                f"dequantize. Supported types: {', '.join(sorted(supported))}")
        if hf_tensor_name(t.name) is None:
            raise ImportFailed(f"{path.name}: Hearth does not know where tensor {t.name} belongs in a "
                               f"llama model, so it cannot import this file faithfully")


def _check_shapes(info: CheckpointInfo) -> None:
    """Each tensor's shape agrees with the metadata (before the q/k unpermute relies on it)."""
    from dataclasses import replace

    from .catalog import TensorCatalog
    from .weights import check_shapes

    renamed = [replace(t, name=hf_tensor_name(t.name)) for t in info.tensors]
    try:
        check_shapes(info.decoder, TensorCatalog.build(info.decoder, renamed))
    except CorruptCheckpoint as exc:
        raise CorruptCheckpoint(exc.message.replace("config.json", f"the metadata of {info.path.name}")) from None


def _write_safetensors(out: Path, reader, config: dict, counter: ByteCounter) -> None:
    """Stream every tensor into one bf16 safetensors file, never holding more than one in memory."""
    header, offset = {}, 0
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        nbytes = 2 * int(t.n_elements)
        header[hf_tensor_name(t.name)] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(out, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for t in reader.tensors:
            f.write(to_bf16_bits(dequantize_tensor(t, config)).tobytes())
            counter.advance(int(t.n_bytes), t.name)
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

def _added_tokens(tokens: list, token_types: list) -> list:
    """(id, content, special) for tokens llama.cpp always matches whole: control and user-defined."""
    return [(i, tok, tt == TOKEN_CONTROL) for i, (tok, tt) in enumerate(zip(tokens, token_types))
            if tt in (TOKEN_CONTROL, TOKEN_USER_DEFINED)]


def _byte_level_tokenizer(name: str, tokens: list, merges: list, pre: str):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if pre not in BYTE_LEVEL_PRE_TOKENIZERS:
        raise ImportFailed(f"{name} uses the pre-tokenizer {pre!r}, which Hearth does not know; known: "
                           f"{', '.join(sorted(BYTE_LEVEL_PRE_TOKENIZERS))}")
    if not merges:
        raise ImportFailed(f"{name} has a byte-level BPE vocabulary but no tokenizer.ggml.merges")
    digits, split = BYTE_LEVEL_PRE_TOKENIZERS[pre]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_tokenizer(name: str, tokens: list, scores: list, token_types: list,
                             add_space_prefix: bool, unk_id: Optional[int]):
    """A llama-style (sentencepiece BPE with byte fallback) vocabulary; merges rebuilt from scores."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    if not scores:
        raise ImportFailed(f"{name} has a sentencepiece vocabulary without tokenizer.ggml.scores")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    mergeable = {tok for tok, tt in zip(tokens, token_types) if tt in (TOKEN_NORMAL, TOKEN_UNKNOWN, 0)}
    ranked = []
    for tok in mergeable:
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[vocab[tok]], vocab[left], vocab[right], left, right))
    ranked.sort()
    merges = [(left, right) for *_, left, right in ranked]
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = ([normalizers.Prepend("\u2581")] if add_space_prefix else []) + [normalizers.Replace(" ", "\u2581")]
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    return tok


def build_tokenizer(path: Path, reader):
    """(tokenizers.Tokenizer, tokenizer_config dict) from the GGUF's tokenizer.ggml.* metadata."""
    from tokenizers import AddedToken, processors

    name = Path(path).name
    model = validate.gguf_str(_field(reader, "tokenizer.ggml.model"), "tokenizer.ggml.model", name)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if model is None or not tokens:
        raise ImportFailed(f"{name} carries no tokenizer (tokenizer.ggml.model / tokens are missing)")
    token_types = _field(reader, "tokenizer.ggml.token_type")
    validate.gguf_tokenizer(name, tokens, token_types, _field(reader, "tokenizer.ggml.scores"),
                            _field(reader, "tokenizer.ggml.merges"), model)
    token_types = token_types or [TOKEN_NORMAL] * len(tokens)
    bos, eos, unk, pad = (_int(reader, f"tokenizer.ggml.{k}_token_id", 0, validate.MAX_VOCAB)
                          for k in ("bos", "eos", "unknown", "padding"))
    for key in ("tokenizer.ggml.pre", "tokenizer.chat_template"):
        validate.gguf_str(_field(reader, key), key, name)
    for key in ("tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix"):
        validate.gguf_bool(_field(reader, key), key, name, False)
    if model == "gpt2":
        tok = _byte_level_tokenizer(name, tokens, _field(reader, "tokenizer.ggml.merges") or [],
                                    _field(reader, "tokenizer.ggml.pre", "default"))
        add_bos_default = False
    elif model == "llama":
        tok = _sentencepiece_tokenizer(name, tokens, _field(reader, "tokenizer.ggml.scores") or [],
                                       token_types, bool(_field(reader, "tokenizer.ggml.add_space_prefix", True)),
                                       unk)
        add_bos_default = True
    else:
        raise ImportFailed(f"{name} uses a {model!r} tokenizer; Hearth can import 'gpt2' (byte-level BPE) "
                           f"and 'llama' (sentencepiece BPE) tokenizers")

    added = _added_tokens(tokens, token_types)
    tok.add_special_tokens([AddedToken(c, special=True, normalized=False) for _, c, s in added if s])
    tok.add_tokens([AddedToken(c, special=False, normalized=False) for _, c, s in added if not s])

    def text(i):
        return None if i is None or not 0 <= int(i) < len(tokens) else tokens[int(i)]

    add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", add_bos_default))
    add_eos = bool(_field(reader, "tokenizer.ggml.add_eos_token", False))
    if (add_bos and text(bos)) or (add_eos and text(eos)):
        single = ([f"{text(bos)}:0"] if add_bos and text(bos) else []) + ["$A:0"] + \
                 ([f"{text(eos)}:0"] if add_eos and text(eos) else [])
        pair = single + ["$B:1"]
        special = {(text(i), int(i)) for i, on in ((bos, add_bos), (eos, add_eos)) if on and text(i)}
        tok.post_processor = processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                                           special_tokens=sorted(special))
    elif model == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(bos), "eos_token": text(eos), "unk_token": text(unk), "pad_token": text(pad),
        "add_bos_token": add_bos, "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_field(reader, f"{_field(reader, 'general.architecture')}.context_length", 0)) or None,
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": s} for i, c, s in added},
        "additional_special_tokens": [c for _, c, s in added if s],
    }
    template = _field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return tok, config


# ---------------------------------------------------------------------------------------------
# Import
# ---------------------------------------------------------------------------------------------

def import_gguf(gguf_path, out_dir, progress: Optional[ProgressCallback] = None) -> Path:
    """Convert a GGUF file into a Hugging Face-layout folder at `out_dir` (which must not exist).

    Reports ProgressEvent(stage="importing") with the bytes of GGUF tensors processed so far.
    Returns `out_dir`. Raises CheckpointNotFound, CorruptCheckpoint, UnsupportedArchitecture,
    UnsupportedTensorType or ImportFailed; on any failure `out_dir` is left as it was.
    """
    convert_gguf(gguf_path, out_dir, progress)
    return Path(out_dir)


def convert_gguf(gguf_path, out_dir, progress: Optional[ProgressCallback] = None) -> CheckpointInfo:
    """`import_gguf`, returning what the GGUF's header said (its CheckpointInfo) instead of the path."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = _open_reader(gguf_path)
    info = _inspect_reader(gguf_path, reader)
    _check_tensors(gguf_path, reader, supported_tensor_types())
    _check_shapes(info)
    tokenizer, tokenizer_config = build_tokenizer(gguf_path, reader)   # fail before writing anything
    if out_dir.exists():
        raise ImportFailed(f"Cannot import {gguf_path.name}: {out_dir} already exists")

    counter = ByteCounter(progress, IMPORTING, sum(int(t.n_bytes) for t in reader.tensors))
    counter.start(gguf_path.name)
    tmp = out_dir.parent / f".{out_dir.name}.importing-{uuid.uuid4().hex[:8]}"
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        from .library import write_failure

        raise ImportFailed(f"Cannot import {gguf_path.name} into {out_dir.parent}: {write_failure(e, out_dir.parent)}.") from e
    try:
        config = info.config
        _write_json(tmp / "config.json", config)
        generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
        if config["pad_token_id"] is not None:
            generation["pad_token_id"] = config["pad_token_id"]
        _write_json(tmp / "generation_config.json", generation)
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tokenizer_config)
        _write_safetensors(tmp / "model.safetensors", reader, config, counter)
        os.replace(tmp, out_dir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, HearthError) or not isinstance(e, Exception):
            raise
        from .library import write_failure

        raise ImportFailed(f"Importing {gguf_path.name} failed: {write_failure(e, out_dir.parent)}.") from e
    return info


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
