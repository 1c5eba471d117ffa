"""Inspect a checkpoint without loading it: files, every tensor, metadata, decoder config, catalog.

Only headers are read: a safetensors file's JSON header, a GGUF file's key/value table and tensor
infos. Everything a user or a planner needs to decide whether and how to load a model comes from here.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .errors import (CheckpointNotFound, CorruptCheckpoint, MissingConfig, NotACheckpoint,
                     UnsupportedArchitecture)
from . import validate
from .moe import MoeLayout, layout_from_hf

if TYPE_CHECKING:
    from .catalog import TensorCatalog

# safetensors dtype name -> bytes per element (packed 4-bit NVFP4 payloads arrive as U8)
SAFETENSORS_DTYPES = validate.SAFETENSORS_DTYPES


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str                 # safetensors dtype name, or the GGML type name for GGUF (Q4_1, F32, ...)
    shape: tuple[int, ...]
    bytes: int
    file: str                  # file name relative to the checkpoint folder
    offset: int                # absolute byte offset of the data in that file

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class DecoderConfig:
    architecture: str          # e.g. LlamaForCausalLM
    model_type: str            # e.g. llama
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict] = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False       # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False              # RMS-normalized q and k per head (Qwen3)
    # OLMoE normalizes q and k over the whole projection (one RMS over all heads), not per head.
    qk_norm_whole_projection: bool = False
    num_experts: int = 0               # MoE only
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0     # each routed expert's width (Mixtral, OLMoE: intermediate_size)
    moe: Optional[MoeLayout] = None    # which layers route and how (engine/moe.py)
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "vocab_size"):
            if int(getattr(self, name)) <= 0:
                raise MissingConfig(f"config.json: {name} must be a positive number")
        if self.num_heads % self.num_kv_heads:
            raise MissingConfig(f"config.json: {self.num_heads} attention heads cannot be grouped "
                                f"over {self.num_kv_heads} key/value heads")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes


@dataclass(frozen=True)
class ModelMetadata:
    architecture: str
    model_type: str
    parameter_count: int
    dtypes: dict               # dtype -> tensor count
    quantization: str          # bf16, fp16, fp32, nvfp4, or a GGUF type mix such as Q4_1
    context_length: int
    vocab_size: int
    tied_embeddings: bool
    has_tokenizer: bool
    has_chat_template: bool


@dataclass
class CheckpointInfo:
    path: Path                 # folder (safetensors) or file (gguf)
    format: str                # "safetensors" or "gguf"
    files: dict                # file name -> bytes on disk
    tensors: list              # [TensorInfo]
    config: dict               # config.json (or the equivalent built from GGUF metadata)
    metadata: ModelMetadata
    decoder: DecoderConfig
    catalog: "TensorCatalog" = None
    plan: object = None        # ExecutionPlan, or None when unsupported (see plan_error)
    plan_error: str = ""
    quant_scheme: object = None  # nvfp4_checkpoint.NvFp4Scheme when the checkpoint declares NVFP4

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    @property
    def weight_bytes(self) -> int:
        return sum(t.bytes for t in self.tensors)

    def tensor(self, name: str) -> TensorInfo:
        return self._by_name()[name]

    def _by_name(self) -> dict:
        cached = self.__dict__.get("_tensor_index")
        if cached is None:
            cached = {t.name: t for t in self.tensors}
            self.__dict__["_tensor_index"] = cached
        return cached

    def tensor_format(self, t: TensorInfo) -> tuple:
        """(format, bits per weight) of one tensor: ("bf16", 16), ("nvfp4", 4.5), ("e4m3 block scale", 0) ..."""
        from .nvfp4_checkpoint import tensor_format

        return tensor_format(self.quant_scheme, t)

    def to_dict(self) -> dict:
        tensors = []
        for t in self.tensors:
            fmt, bits = self.tensor_format(t)
            tensors.append({**asdict(t), "shape": list(t.shape), "format": fmt, "bits_per_weight": bits})
        return {
            "path": str(self.path),
            "format": self.format,
            "files": dict(self.files),
            "total_bytes": self.total_bytes,
            "weight_bytes": self.weight_bytes,
            "tensors": tensors,
            "quantization_scheme": self.quant_scheme.to_dict() if self.quant_scheme is not None else None,
            "metadata": asdict(self.metadata),
            "decoder": {**asdict(self.decoder), "eos_token_ids": list(self.decoder.eos_token_ids)},
            "catalog": self.catalog.to_dict() if self.catalog is not None else None,
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "plan_error": self.plan_error,
        }


# ---------------------------------------------------------------------------------------------
# Reading headers


def read_safetensors_header(file: Path) -> list[TensorInfo]:
    """Every tensor of one safetensors file, checked against the file's real size (engine/validate.py)."""
    data_start, entries = validate.safetensors_header(file)
    return [TensorInfo(tname, dtype, shape, end - begin, Path(file).name, data_start + begin)
            for tname, dtype, shape, begin, end in entries]


def _load_json(file: Path, what: str) -> dict:
    return validate.load_json(file, what)


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if os.path.lexists(index):
        weight_map = validate.shard_index(_load_json(index, "shard index"), folder)
        files = []
        for shard in dict.fromkeys(weight_map.values()):
            path = folder / shard
            if not os.path.lexists(path):
                raise CorruptCheckpoint(f"The shard {shard} named in model.safetensors.index.json is missing.")
            validate.readable_file(path, "weights")
            files.append(path)
        return files
    files = sorted(p for p in folder.glob("*.safetensors"))
    for path in files:
        validate.readable_file(path, "weights")
    return files


def _check_shard_index(folder: Path, tensors: list) -> None:
    """Each tensor the index names lives in the shard it names."""
    index = folder / "model.safetensors.index.json"
    if not os.path.lexists(index):
        return
    where = {t.name: t.file for t in tensors}
    for tensor, shard in validate.shard_index(_load_json(index, "shard index"), folder).items():
        if where.get(tensor) != shard:
            raise CorruptCheckpoint(f"model.safetensors.index.json puts {tensor} in {shard}, but "
                                    + (f"it is in {where[tensor]}." if tensor in where else "no shard holds it."))


def decoder_config_from_hf(config: dict) -> DecoderConfig:
    """The decoder hyper-parameters from a Hugging Face config.json."""
    checked = validate.decoder_fields(config)      # every value below has its type and range checked
    text = checked["text"]
    archs = config.get("architectures") or []
    hidden, heads, layers, vocab = checked["hidden"], checked["heads"], checked["layers"], checked["vocab"]
    intermediate = int(text.get("intermediate_size") or text.get("moe_intermediate_size") or 0)
    kv_heads, head_dim = checked["kv_heads"], checked["head_dim"]
    eos = text.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = validate.token_ids(eos, "eos_token_id", "config.json")
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    moe = layout_from_hf(dict(text, model_type=model_type), layers)
    experts = moe.num_experts if moe else 0
    return DecoderConfig(
        architecture=str(archs[0]) if archs else "",
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=checked["context"] or 2048,
        rms_norm_eps=checked["eps"] or 1e-6,
        rope_theta=float(checked["theta"] or (text.get("rope_parameters") or {}).get("rope_theta") or 10000.0),
        rope_scaling=checked["rope_scaling"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        # Qwen2-MoE spells its q/k/v bias qkv_bias (on by default)
        attention_bias=bool(text.get("attention_bias", text.get("qkv_bias", model_type in ("qwen2", "qwen2_moe")))),
        qk_norm=model_type in ("qwen3", "qwen3_moe", "olmoe"),
        qk_norm_whole_projection=model_type == "olmoe",
        num_experts=experts,
        num_experts_per_tok=moe.top_k if moe else 0,
        moe_intermediate_size=moe.expert_intermediate_size if moe else 0,
        moe=moe,
        bos_token_id=text.get("bos_token_id", config.get("bos_token_id")),
        eos_token_ids=eos_ids,
    )


def _quantization(config: dict, tensors: list[TensorInfo]) -> str:
    qc = config.get("quantization_config") or {}
    algo = str(qc.get("quant_algo") or qc.get("quant_method") or "").lower()
    if "nvfp4" in algo or any(t.name.endswith("weight_scale_2") for t in tensors):
        return "nvfp4"
    if algo:
        return algo
    counts: dict = {}
    for t in tensors:
        if len(t.shape) == 2:
            counts[t.dtype] = counts.get(t.dtype, 0) + t.bytes
    dominant = max(counts, key=counts.get) if counts else "BF16"
    return {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}.get(dominant, dominant.lower())


def inspect(path) -> CheckpointInfo:
    """Inspect a Hugging Face folder (single or sharded safetensors) or a .gguf file.

    Reads headers only. The result carries the tensor catalog and the execution plan (or the
    reason there is none in `plan_error`).
    """
    from .catalog import TensorCatalog
    from .plan import ExecutionPlan
    from .errors import HearthError

    path = Path(path).expanduser()
    if not path.exists():
        raise CheckpointNotFound(f"Nothing exists at {path}.")
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            from .gguf_import import inspect_gguf

            info = inspect_gguf(path)
        elif path.suffix.lower() == ".safetensors":
            return inspect(path.parent)
        else:
            raise NotACheckpoint(f"{path.name} is neither a Hugging Face checkpoint folder nor a .gguf file.")
    else:
        info = _inspect_folder(path)
    info.catalog = TensorCatalog.build(info.decoder, info.tensors)
    scheme = info.quant_scheme
    if scheme is not None and not scheme.unsupported:
        from .nvfp4_checkpoint import pair

        try:
            pair(info)      # malformed or missing scales are typed errors, as a truncated file is
        except UnsupportedArchitecture as exc:       # well-formed but not runnable (a quantized router)
            info.plan, info.plan_error = None, exc.message
            return info
    try:
        plan = ExecutionPlan.discover(info.decoder, info.catalog, info.metadata.quantization)
        if scheme is not None:
            from .nvfp4_checkpoint import check_runnable

            check_runnable(info)
        info.plan = plan
    except HearthError as exc:
        info.plan, info.plan_error = None, exc.message
    return info


def _inspect_folder(folder: Path) -> CheckpointInfo:
    files = _safetensors_files(folder)
    config_file = folder / "config.json"
    if not files:
        if config_file.exists():
            raise NotACheckpoint(
                f"{folder.name} has a config.json but no .safetensors weights "
                "(PyTorch .bin checkpoints are not supported: convert them to safetensors).")
        raise NotACheckpoint(f"{folder} holds no checkpoint: no config.json and no .safetensors files.")
    if not config_file.exists():
        raise MissingConfig(f"{folder.name} has weights but no config.json, so its architecture is unknown.")
    config = _load_json(config_file, "model configuration")
    tensors: list[TensorInfo] = []
    for file in files:
        tensors.extend(read_safetensors_header(file))
    seen: dict = {}
    for t in tensors:
        if seen.setdefault(t.name, t.file) != t.file:
            raise CorruptCheckpoint(f"Tensor {t.name} is in both {seen[t.name]} and {t.file}; the shards "
                                    "belong to different downloads.")
    _check_shard_index(folder, tensors)
    decoder = decoder_config_from_hf(config)
    settings = validate.optional_json(folder / "tokenizer_config.json", "tokenizer settings") or {}
    validate.tokenizer_settings(settings)
    generation = validate.optional_json(folder / "generation_config.json", "generation settings")
    if generation is not None:
        validate.generation_settings(generation)
    template_file = folder / "chat_template.jinja"
    if os.path.lexists(template_file):
        validate.readable_file(template_file, "chat template")
        try:
            template_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise CorruptCheckpoint("chat_template.jinja is not readable UTF-8 text.") from None
    if os.path.lexists(folder / "tokenizer.json"):
        validate.readable_file(folder / "tokenizer.json", "tokenizer")
    has_template = os.path.lexists(template_file) or bool(settings.get("chat_template"))
    dtypes: dict = {}
    for t in tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
    from . import nvfp4_checkpoint

    validate.quantization_settings(config.get("quantization_config"), "config.json")
    hf_quant = validate.optional_json(folder / "hf_quant_config.json", "quantization settings")
    if hf_quant is not None:
        validate.quantization_settings(hf_quant.get("quantization"), "hf_quant_config.json")
    scheme = nvfp4_checkpoint.detect(folder, config, tensors)
    metadata = ModelMetadata(
        architecture=decoder.architecture,
        model_type=decoder.model_type,
        parameter_count=(nvfp4_checkpoint.parameter_count(scheme, tensors) if scheme is not None
                         else sum(t.numel for t in tensors)),
        dtypes=dtypes,
        quantization=("nvfp4" if scheme is not None and scheme.algorithm.startswith("NVFP4")
                      else _quantization(config, tensors)),
        context_length=decoder.max_position_embeddings,
        vocab_size=decoder.vocab_size,
        tied_embeddings=decoder.tie_word_embeddings or not any(t.name == "lm_head.weight" for t in tensors),
        has_tokenizer=(folder / "tokenizer.json").exists(),
        has_chat_template=has_template,
    )
    try:
        all_files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    except OSError as exc:
        raise CorruptCheckpoint(f"{folder.name} cannot be listed: {exc.strerror}.") from None
    return CheckpointInfo(folder, "safetensors", all_files, tensors, config, metadata, decoder,
                          quant_scheme=scheme)
