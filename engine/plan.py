"""Execution plan (how to run a checkpoint) and memory plan (whether it fits).

`ExecutionPlan.discover` turns a decoder config and a tensor catalog into a decision: the decoder
archetype, the attention feature and the projection format, or a clear UnsupportedArchitecture that
names what is missing.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .catalog import TensorCatalog
from .checkpoint import DecoderConfig
from .errors import MissingTensors, UnsupportedArchitecture, UnsupportedTensorType
from .registry import family_for

DENSE_SWIGLU = "dense-swiglu"
MOE = "moe"
GROUPED_QUERY = "grouped-query"
RMS_NORMALIZED_GROUPED_QUERY = "rms-normalized-grouped-query"

_PROJECTION_FORMATS = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "nvfp4": "nvfp4"}


@dataclass(frozen=True)
class ExecutionPlan:
    family: str
    archetype: str             # dense-swiglu | moe
    attention: str             # grouped-query | rms-normalized-grouped-query
    projection_format: str     # bf16 | fp16 | fp32 | nvfp4 | a GGUF quantization name
    qkv_bias: bool
    tied_embeddings: bool
    rope_scaling: str          # none | llama3 | linear | ...

    @classmethod
    def discover(cls, decoder: DecoderConfig, catalog: TensorCatalog, quantization: str = "bf16") -> "ExecutionPlan":
        if any(".linear_attn." in n for n in catalog.unexpected):
            raise UnsupportedArchitecture(
                "This checkpoint uses gated-delta linear attention (linear_attn.* tensors), "
                "which Hearth does not implement yet.")
        family = family_for(decoder.architecture)
        if catalog.missing:
            shown = ", ".join(catalog.missing[:6]) + (" …" if len(catalog.missing) > 6 else "")
            raise MissingTensors(f"The checkpoint lacks {len(catalog.missing)} tensor(s) a "
                                 f"{family.name} decoder needs: {shown}.")
        archetype = MOE if decoder.is_moe else DENSE_SWIGLU
        if archetype != family.archetype:
            raise UnsupportedArchitecture(
                f"{decoder.architecture} is declared {family.archetype} but its config describes {archetype}.")
        attention = RMS_NORMALIZED_GROUPED_QUERY if decoder.qk_norm else GROUPED_QUERY
        projection = _PROJECTION_FORMATS.get(quantization.lower(), quantization)
        rope = (decoder.rope_scaling or {}).get("rope_type", "none")
        if rope not in ("none", "llama3", "linear"):
            raise UnsupportedArchitecture(f"RoPE scaling '{rope}' is not supported (llama3 and linear are).")
        return cls(family.name, archetype, attention, projection, decoder.attention_bias,
                   catalog.tied, rope)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FitReport:
    ok: bool
    message: str


GiB = 1024 ** 3


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


@dataclass(frozen=True)
class MemoryPlan:
    weight_bytes: int            # resident weights in the engine's dtype
    kv_bytes_per_token: int
    context_length: int
    kv_block_size: int
    workspace_bytes: int         # activations, logits, sampling scratch
    max_context: int = 0         # the longest context the model supports

    @classmethod
    def for_model(cls, decoder: DecoderConfig, weight_bytes: int, context_length: int | None = None,
                  kv_block_size: int = 16, max_batch: int = 8) -> "MemoryPlan":
        context = int(context_length or decoder.max_position_embeddings)
        workspace = max_batch * 4 * (decoder.vocab_size + 8 * decoder.intermediate_size + 8 * decoder.hidden_size)
        workspace += 64 * 1024 * 1024  # library handles and graph pools
        return cls(weight_bytes, decoder.kv_bytes_per_token(2), context, kv_block_size, workspace,
                   decoder.max_position_embeddings)

    @property
    def kv_blocks(self) -> int:
        return -(-self.context_length // self.kv_block_size)

    @property
    def kv_bytes(self) -> int:
        return self.kv_blocks * self.kv_block_size * self.kv_bytes_per_token

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.workspace_bytes

    def max_context_for(self, free_bytes: int) -> int:
        room = free_bytes - self.weight_bytes - self.workspace_bytes
        if room <= 0:
            return 0
        tokens = room // self.kv_bytes_per_token
        return int(tokens // self.kv_block_size * self.kv_block_size)

    def fits(self, free_bytes: int, where: str = "GPU") -> FitReport:
        need = self.total_bytes
        if need <= free_bytes:
            return FitReport(True, f"Needs {_gib(need)} of {_gib(free_bytes)} free {where} memory "
                                   f"({_gib(self.weight_bytes)} weights, {_gib(self.kv_bytes)} KV cache "
                                   f"for {self.context_length:,} tokens).")
        context = self.max_context_for(free_bytes)
        message = f"Needs {_gib(need)}, {_gib(free_bytes)} free {where} memory: "
        if context >= 256:
            message += f"reduce the context to {context:,} tokens, or close other programs using the {where}."
        else:
            message += (f"the weights alone need {_gib(self.weight_bytes)}; choose a smaller or more "
                        f"quantized model, or free {where} memory.")
        return FitReport(False, message)

    def to_dict(self) -> dict:
        return {**asdict(self), "kv_blocks": self.kv_blocks, "kv_bytes": self.kv_bytes,
                "total_bytes": self.total_bytes}


def check_dtypes_loadable(info) -> None:
    """Refuse tensor types no backend can load, naming the first offender."""
    loadable = {"BF16", "F16", "F32"}
    scheme = getattr(info, "quant_scheme", None)
    for t in info.tensors:
        if scheme is not None and t.dtype in ("U8", "F8_E4M3"):
            continue            # NVFP4 packed weights and block scales, paired and checked at inspection
        if t.dtype not in loadable:
            raise UnsupportedTensorType(
                f"Tensor {t.name} is {t.dtype}; Hearth loads bf16, fp16 and fp32 safetensors. "
                "Import GGUF files through the model library, which converts them.")
