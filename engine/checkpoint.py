"""Inspect a checkpoint without loading it: files, every tensor, metadata, decoder config, catalog.

Only headers are read: a safetensors file's JSON header, a GGUF file's key/value table and tensor
infos. Everything a user or a planner needs to decide whether and how to load a model comes from here.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from .errors import (CheckpointNotFound, CorruptCheckpoint, MissingConfig, NotACheckpoint,
                     UnsupportedTensorType)

# safetensors dtype name -> bytes per element
SAFETENSORS_DTYPES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U32": 4, "U16": 2, "U64": 8,
}
# Packed 4-bit payloads (NVFP4) arrive as U8; their logical shape is twice as wide.
_MAX_HEADER_BYTES = 100 * 1024 * 1024


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
    num_experts: int = 0               # MoE only
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
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

    def to_dict(self) -> dict:
        return {
            "path": str(self.path),
            "format": self.format,
            "files": dict(self.files),
            "total_bytes": self.total_bytes,
            "weight_bytes": self.weight_bytes,
            "tensors": [{**asdict(t), "shape": list(t.shape)} for t in self.tensors],
            "metadata": asdict(self.metadata),
            "decoder": {**asdict(self.decoder), "eos_token_ids": list(self.decoder.eos_token_ids)},
            "catalog": self.catalog.to_dict() if self.catalog is not None else None,
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "plan_error": self.plan_error,
        }
