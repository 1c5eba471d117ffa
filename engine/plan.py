"""Execution plan (how to run a checkpoint) and memory plan (whether it fits).

`ExecutionPlan.discover` turns a decoder config and a tensor catalog into a decision: the decoder
archetype, the attention feature and the projection format, or a clear UnsupportedArchitecture that
names what is missing.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .catalog import TensorCatalog
from .checkpoint import DecoderConfig
from .errors import MissingTensors, UnsupportedArchitecture, UnsupportedTensorType
from .moe import logical_numel, parameter_counts, weight_formats
from .registry import family_for

DENSE_SWIGLU = "dense-swiglu"
MOE = "moe"
GROUPED_QUERY = "grouped-query"
RMS_NORMALIZED_GROUPED_QUERY = "rms-normalized-grouped-query"
# OLMoE: one RMSNorm over the whole q (and k) projection, all heads together, before rope
PROJECTION_NORMALIZED_GROUPED_QUERY = "projection-normalized-grouped-query"

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
    block: str = "dense SwiGLU"     # what a user reads: "MoE SwiGLU, 128 experts, top-8 (renormalised), every layer"
    parameters: int = 0             # every parameter in the checkpoint
    active_parameters: int = 0      # those one token passes through (all of them for a dense decoder)
    moe_layers: int = 0             # layers that route (the rest are dense SwiGLU)

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
        block, moe_layers = "dense SwiGLU", 0
        # logical counts: a packed NVFP4 weight holds two weights per byte
        parameters = active = sum(logical_numel(t) for t in catalog.globals.values()) + sum(
            logical_numel(t) for layer in catalog.layers for t in layer.roles.values())
        if decoder.moe is not None:
            if decoder.moe.unsupported:
                raise UnsupportedArchitecture(decoder.moe.unsupported)
            block = decoder.moe.describe(decoder.num_layers, *weight_formats(catalog))
            moe_layers = decoder.moe.moe_layer_count(decoder.num_layers)
            parameters, active = parameter_counts(decoder.moe, catalog)
        attention = GROUPED_QUERY
        if decoder.qk_norm:
            attention = (PROJECTION_NORMALIZED_GROUPED_QUERY if decoder.qk_norm_whole_projection
                         else RMS_NORMALIZED_GROUPED_QUERY)
        projection = _PROJECTION_FORMATS.get(quantization.lower(), quantization)
        rope = (decoder.rope_scaling or {}).get("rope_type", "none")
        if rope not in ("none", "llama3", "linear"):
            raise UnsupportedArchitecture(f"RoPE scaling '{rope}' is not supported (llama3 and linear are).")
        return cls(family.name, archetype, attention, projection, decoder.attention_bias,
                   catalog.tied, rope, block, parameters, active, moe_layers)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FitReport:
    ok: bool
    message: str


GiB = 1024 ** 3


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


# Full-length sessions the KV pool holds unless the user says otherwise (native/src/runtime/
# memory_plan.h has the same default).
DEFAULT_RESIDENT_SESSIONS = 4
# Left free on the GPU for the desktop and other programs unless the user sets a VRAM budget.
DEFAULT_GPU_RESERVE = 1 * GiB


@dataclass(frozen=True)
class MemoryPlan:
    """Every byte a load takes, before it happens. For cuda-native the parts come from the engine
    itself (engine._native.plan_memory: the buffers the native runtime then allocates exactly);
    for the torch backend they are estimated from the shapes."""
    weight_bytes: int            # resident weights in the engine's format
    kv_bytes_per_token: int
    context_length: int
    kv_block_size: int
    workspace_bytes: int         # activations, logits, sampling scratch
    max_context: int = 0         # the longest context the model supports
    sessions: int = 1            # full-length sessions the KV pool holds at once
    runtime_bytes: int = 0       # library handles, decode graphs (an estimate)
    reserve_bytes: int = 0       # left free for the desktop and other programs (the VRAM budget)
    kv_spare_blocks: int = 0     # blocks beyond the sessions' (cuda-native: the padding rows' one)
    workspace_parts: tuple = ()  # (name, bytes) of the workspace, where the engine reports them
    precision: str = "fast"

    @classmethod
    def for_model(cls, decoder: DecoderConfig, weight_bytes: int, context_length: int | None = None,
                  kv_block_size: int = 16, max_batch: int = 8, sessions: int = 1,
                  reserve_bytes: int = 0, precision: str = "fast") -> "MemoryPlan":
        """The torch backend's estimate (weights as given, one KV cache per session)."""
        context = int(context_length or decoder.max_position_embeddings)
        workspace = max_batch * 4 * (decoder.vocab_size + 8 * decoder.intermediate_size + 8 * decoder.hidden_size)
        if decoder.moe is not None:   # router logits and the k selected experts' activations per row
            moe = decoder.moe
            workspace += max_batch * 4 * (moe.num_experts + 2 * moe.top_k * (moe.expert_intermediate_size + 1))
        return cls(weight_bytes, decoder.kv_bytes_per_token(2), context, kv_block_size, workspace,
                   decoder.max_position_embeddings, sessions=sessions, runtime_bytes=64 * 1024 * 1024,
                   reserve_bytes=reserve_bytes, precision=precision)

    @classmethod
    def from_native(cls, decoder: DecoderConfig, native: dict, context_length: int, kv_block_size: int,
                    sessions: int, reserve_bytes: int, precision: str) -> "MemoryPlan":
        """The plan the native runtime computed for this config (engine._native.plan_memory)."""
        blocks = -(-context_length // kv_block_size) * sessions
        per_token = native["kv_block_bytes"] // kv_block_size
        return cls(int(native["weight_bytes"]), int(per_token), context_length, kv_block_size,
                   int(native["workspace_bytes"]), decoder.max_position_embeddings, sessions=sessions,
                   runtime_bytes=int(native["runtime_bytes"]), reserve_bytes=reserve_bytes,
                   kv_spare_blocks=int(native["kv_blocks"]) + 1 - blocks,
                   workspace_parts=tuple(sorted(native["workspace"].items(), key=lambda kv: -kv[1])),
                   precision=precision)

    @property
    def kv_blocks(self) -> int:
        """The pool's blocks: each session's full context."""
        return -(-self.context_length // self.kv_block_size) * self.sessions

    @property
    def kv_bytes(self) -> int:
        return (self.kv_blocks + self.kv_spare_blocks) * self.kv_block_size * self.kv_bytes_per_token

    @property
    def total_bytes(self) -> int:
        """What the load takes from the device."""
        return self.weight_bytes + self.kv_bytes + self.workspace_bytes + self.runtime_bytes

    def breakdown(self) -> list[tuple[str, int]]:
        """(part, bytes) as a user reads it; the parts add up to total_bytes."""
        kv = (f"KV cache ({self.sessions} session{'s' if self.sessions != 1 else ''} x "
              f"{self.context_length:,} tokens)")
        return [("weights", self.weight_bytes), (kv, self.kv_bytes), ("workspace", self.workspace_bytes),
                ("runtime (libraries, decode graphs)", self.runtime_bytes)]

    def max_context_for(self, free_bytes: int) -> int:
        """The longest context that fits `free_bytes` (after the reserve) at this many sessions."""
        room = (free_bytes - self.reserve_bytes - self.weight_bytes - self.workspace_bytes - self.runtime_bytes
                - self.kv_spare_blocks * self.kv_block_size * self.kv_bytes_per_token)
        if room <= 0:
            return 0
        tokens = room // (self.kv_bytes_per_token * max(1, self.sessions))
        return int(min(tokens // self.kv_block_size * self.kv_block_size, self.max_context or tokens))

    def max_sessions_for(self, free_bytes: int) -> int:
        room = (free_bytes - self.reserve_bytes - self.weight_bytes - self.workspace_bytes - self.runtime_bytes
                - self.kv_spare_blocks * self.kv_block_size * self.kv_bytes_per_token)
        per_session = -(-self.context_length // self.kv_block_size) * self.kv_block_size * self.kv_bytes_per_token
        return max(0, int(room // per_session)) if room > 0 else 0

    def fits(self, free_bytes: int, where: str = "GPU") -> FitReport:
        need = self.total_bytes
        budget = free_bytes - self.reserve_bytes
        keep = f", keeping {_gib(self.reserve_bytes)} free for other programs" if self.reserve_bytes else ""
        if need <= budget:
            return FitReport(True, f"Needs {_gib(need)} of {_gib(free_bytes)} free {where} memory{keep} "
                                   f"({_gib(self.weight_bytes)} weights, {_gib(self.kv_bytes)} KV cache "
                                   f"for {self.sessions} x {self.context_length:,} tokens).")
        message = f"Needs {_gib(need)}, {_gib(free_bytes)} free {where} memory{keep}: "
        advice = []
        context = self.max_context_for(free_bytes)
        if context >= 256:
            advice.append(f"reduce the context to {context:,} tokens")
        sessions = self.max_sessions_for(free_bytes)
        if 1 <= sessions < self.sessions:
            advice.append(f"keep {sessions} session{'s' if sessions != 1 else ''} resident instead of {self.sessions}")
        if advice:
            message += " or ".join(advice) + f", or close other programs using the {where}."
        else:
            message += (f"the weights alone need {_gib(self.weight_bytes)}; choose a smaller or more "
                        f"quantized model, or free {where} memory.")
        return FitReport(False, message)

    def split(self, decoder: DecoderConfig, ways: int, tied_embeddings: bool = False) -> "TensorParallelPlan":
        """This load split N ways by tensor parallel (engine/tensor_parallel.py): each GPU's plan."""
        return TensorParallelPlan.of(self, decoder, ways, tied_embeddings)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["workspace_parts"] = [list(p) for p in self.workspace_parts]
        return {**d, "kv_blocks": self.kv_blocks, "kv_bytes": self.kv_bytes, "total_bytes": self.total_bytes,
                "breakdown": self.breakdown()}


# ----------------------------------------------------------------------------- tensor parallel
# NCCL's own device memory on each rank (its channels' buffers: NCCL_BUFFSIZE, 4 MiB by default, per
# channel and peer, plus the communicator). An estimate until the native side measures it.
NCCL_RUNTIME_ESTIMATE = 256 * 1024 * 1024

# How each native workspace part (native/src/runtime/memory_plan.cpp) changes on one rank of N:
# "shard" parts hold only this rank's heads or feed-forward columns (1/N); "width" parts are sized by
# max(hidden, q, intermediate), of which q and intermediate shrink; the sampler lives on rank 0 only.
# Everything else (residual and delta rows, the gathered logits, rope, step metadata, cuBLASLt) is whole
# on every rank. These are estimates until native/ plans a rank itself.
_SHARDED_PARTS = {"qkv", "queries", "gate_up", "attention_partials_ml", "attention_partials_acc",
                  "attention_counters", "nvfp4_expanded"}
_WIDTH_PARTS = {"activations", "operand_split", "operand_fp16"}


def _align(n: float, to: int = 256) -> int:
    return -(-int(math.ceil(n)) // to) * to


@dataclass(frozen=True)
class TensorParallelPlan:
    """Per GPU what an N-way split keeps: rank r's MemoryPlan is `ranks[r]` (rank 0 also samples).
    Weights: this rank's shard (q/k/v, gate/up by output rows, o/down by input columns, a vocabulary
    slice of the embedding and lm_head, the norms replicated) at the single-GPU plan's bytes per
    element. KV cache: this rank's KV heads, 1/N. Workspace: the single-GPU parts rescaled (above)."""
    ways: int
    ranks: tuple

    @classmethod
    def of(cls, plan: MemoryPlan, decoder: DecoderConfig, ways: int, tied_embeddings: bool) -> "TensorParallelPlan":
        from dataclasses import replace

        from .tensor_parallel import ShardLayout, check_shardable

        check_shardable(decoder, ways)
        if ways == 1:
            return cls(1, (plan,))      # no split: the single-GPU plan itself
        whole = sum(ShardLayout(decoder, 1, 0).elements(tied_embeddings).values())
        per_element = plan.weight_bytes / whole
        d, n = decoder, ways
        q = d.num_heads * d.head_dim
        width = max(d.hidden_size, q // n, d.intermediate_size // n) / max(d.hidden_size, q, d.intermediate_size)
        ranks = []
        for rank in range(ways):
            layout = ShardLayout(decoder, ways, rank)
            weights = int(math.ceil(sum(layout.elements(tied_embeddings).values()) * per_element))
            if plan.workspace_parts:
                parts = []
                for name, size in plan.workspace_parts:
                    if name in _SHARDED_PARTS:
                        size = _align(size / n)
                    elif name in _WIDTH_PARTS:
                        size = _align(size * width)
                    elif name == "sampler" and rank > 0:
                        size = 0
                    parts.append((name, size))
                logits = dict(plan.workspace_parts).get("logits", 0)     # each rank's slice, before the gather
                parts.append(("logits_slice", _align(logits * layout.vocab_rows_per_rank / d.vocab_size)))
                parts = tuple(sorted(parts, key=lambda kv: -kv[1]))
                workspace = sum(size for _, size in parts)
            else:       # the torch estimate's terms (MemoryPlan.for_model): logits whole plus the slice
                rows = plan.workspace_bytes // (4 * (d.vocab_size + 8 * d.intermediate_size + 8 * d.hidden_size))
                workspace = rows * 4 * (d.vocab_size + layout.vocab_rows_per_rank + 8 * d.intermediate_size // n
                                        + 8 * d.hidden_size)
                parts = ()
            ranks.append(replace(plan, weight_bytes=weights, kv_bytes_per_token=plan.kv_bytes_per_token // n,
                                 workspace_bytes=workspace, workspace_parts=parts,
                                 runtime_bytes=plan.runtime_bytes + (NCCL_RUNTIME_ESTIMATE if n > 1 else 0)))
        return cls(ways, tuple(ranks))

    @property
    def total_bytes(self) -> int:
        return sum(r.total_bytes for r in self.ranks)

    def fits(self, free_per_gpu) -> FitReport:
        """Rank r on the r-th GPU of `free_per_gpu` (free bytes, as the devices report them)."""
        free = list(free_per_gpu)
        if len(free) < self.ways:
            return FitReport(False, f"A {self.ways}-way split needs {self.ways} GPUs; {len(free)} are visible.")
        short = [(r, p, f) for r, (p, f) in enumerate(zip(self.ranks, free)) if p.total_bytes > f - p.reserve_bytes]
        if not short:
            return FitReport(True, f"Fits split over {self.ways} GPUs: "
                                   + ", ".join(f"{_gib(p.total_bytes)} of {_gib(f)} free on GPU {r}"
                                               for r, (p, f) in enumerate(zip(self.ranks, free))) + ".")
        return FitReport(False, "Does not fit split over {} GPUs: ".format(self.ways) + "; ".join(
            f"GPU {r} needs {_gib(p.total_bytes)} and has {_gib(f)} free" for r, p, f in short) + ".")

    def to_dict(self) -> dict:
        return {"ways": self.ways, "total_bytes": self.total_bytes, "ranks": [r.to_dict() for r in self.ranks]}


@dataclass(frozen=True)
class SplitAdvice:
    ways: int           # the fewest GPUs the load fits on (1: one GPU is enough; 0: no split fits)
    gpus: tuple         # which GPUs (indices into the free list), rank 0 first
    message: str


def smallest_split(plan: MemoryPlan, decoder: DecoderConfig, free_per_gpu, tied_embeddings: bool = False,
                   limit: int = 8) -> SplitAdvice:
    """The smallest N whose split fits the GPUs with the most free memory (rank 0, which also samples,
    on the freest). One GPU is always tried first; splits the model's heads do not allow are skipped."""
    from .tensor_parallel import workable_ways

    free = list(free_per_gpu)
    order = sorted(range(len(free)), key=lambda i: (-free[i], i))
    if not free:
        return SplitAdvice(0, (), "No GPU is visible.")
    if plan.fits(free[order[0]]).ok:
        return SplitAdvice(1, (order[0],), f"Fits on GPU {order[0]} alone: {plan.fits(free[order[0]]).message}")
    for ways in workable_ways(decoder, min(limit, len(free))):
        if ways == 1:
            continue
        gpus = tuple(order[:ways])
        report = plan.split(decoder, ways, tied_embeddings).fits([free[i] for i in gpus])
        if report.ok:
            each = plan.split(decoder, ways, tied_embeddings).ranks[0].total_bytes
            return SplitAdvice(ways, gpus, f"Fits on no single GPU (needs {_gib(plan.total_bytes)}, the freest "
                                           f"has {_gib(free[order[0]])}) but split over {ways}: GPUs "
                                           f"{', '.join(map(str, gpus))}, about {_gib(each)} each.")
    possible = [n for n in workable_ways(decoder, limit) if n > 1]
    return SplitAdvice(0, (), f"Fits on no single GPU (needs {_gib(plan.total_bytes)}) and on no split of the "
                              f"{len(free)} visible; this model splits over "
                              f"{', '.join(map(str, possible)) or 'no number of'} GPUs.")


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
