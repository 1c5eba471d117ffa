"""The torch reference backend: the correctness oracle for cuda-native, and the CPU fallback.

Clarity over speed. A straightforward Llama-family decoder (Llama 2/3/3.1 rope scaling, Mistral,
SmolLM2, Qwen2 q/k/v bias, Qwen3 q/k RMSNorm, tied embeddings), computing in float32 (default) or
bfloat16, with a contiguous KV cache per sequence that grows as needed. Mixture-of-experts layers
(Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, hybrid dense / MoE stacks) run `moe.feed_forward`. NVFP4
projections, experts included, are dequantized into the compute dtype at load.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..checkpoint import CheckpointInfo, DecoderConfig
from ..errors import ContextOverflow, UnknownSession, UnsupportedArchitecture
from ..moe import MoeWeights, feed_forward as moe_feed_forward
from ..nvfp4 import NvFp4Tensor
from ..nvfp4_checkpoint import pair, read_experts, read_layer
from ..plan import ExecutionPlan
from ..progress import ByteCounter, LOADING_WEIGHTS, ProgressCallback
from ..registry import RUNNABLE_ARCHETYPES
from ..sampling import SamplerState, sample_token
from ..weights import TensorReader, check_shapes
from .base import ModelRunner, RunnerOptions

_TORCH_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def rope_inverse_frequencies(decoder: DecoderConfig) -> torch.Tensor:
    """float64 inverse frequencies, with Llama-3 or linear scaling applied as Hugging Face does."""
    hd = decoder.head_dim
    inv = 1.0 / (decoder.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    scaling = decoder.rope_scaling or {}
    kind = scaling.get("rope_type")
    if kind == "linear":
        inv = inv / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    gate: Optional[torch.Tensor] = None    # dense SwiGLU layers
    up: Optional[torch.Tensor] = None
    down: Optional[torch.Tensor] = None
    q_bias: Optional[torch.Tensor] = None
    k_bias: Optional[torch.Tensor] = None
    v_bias: Optional[torch.Tensor] = None
    q_norm: Optional[torch.Tensor] = None
    k_norm: Optional[torch.Tensor] = None
    moe: Optional[MoeWeights] = None       # mixture-of-experts layers instead of gate / up / down


@dataclass
class _Sequence:
    length: int = 0
    keys: list = field(default_factory=list)     # per layer [kv_heads, capacity, head_dim]
    values: list = field(default_factory=list)


class TorchRunner(ModelRunner):
    backend_name = "torch"

    def __init__(self, info: CheckpointInfo, plan: ExecutionPlan, options: RunnerOptions,
                 progress: Optional[ProgressCallback] = None, device: str = "cpu"):
        if plan.archetype not in RUNNABLE_ARCHETYPES:
            raise UnsupportedArchitecture(f"The torch backend does not run {plan.archetype} decoders yet.")
        check_shapes(info.decoder, info.catalog)
        self.decoder = info.decoder
        self.options = options
        self.device = torch.device(device)
        self.dtype = COMPUTE_DTYPES[options.compute_dtype]
        self.kv_dtype = self.dtype if options.kv_dtype == "auto" else COMPUTE_DTYPES[options.kv_dtype]
        self.context_length = options.context_length
        self.kv_heads = self.decoder.num_kv_heads      # this process's KV heads (a tensor-parallel rank's share)
        self._load(info, progress)
        self.inv_freq = rope_inverse_frequencies(self.decoder)
        self._sequences: dict[int, _Sequence] = {}
        self._next_id = 1
        self._logits: Optional[torch.Tensor] = None

    # ----------------------------------------------------------------------------- loading
    def _load(self, info: CheckpointInfo, progress: Optional[ProgressCallback]) -> None:
        catalog = info.catalog
        counter = ByteCounter(progress, LOADING_WEIGHTS, info.weight_bytes)
        counter.start("reading weights")
        self.weight_bytes = 0
        pairing = pair(info) if info.quant_scheme is not None else None
        packed = pairing.layers if pairing is not None else [{} for _ in catalog.layers]
        packed_experts = pairing.experts if pairing is not None else [{} for _ in catalog.layers]
        with TensorReader(info) as reader:
            def dequantized(t: NvFp4Tensor) -> torch.Tensor:
                value = torch.from_numpy(t.dequantize()).to(device=self.device, dtype=self.dtype)
                self.weight_bytes += value.numel() * value.element_size()
                return value

            def take(t):
                staging = torch.empty(t.bytes, dtype=torch.uint8)
                reader.read_into(t, memoryview(staging.numpy()))
                value = staging.view(_TORCH_DTYPES[t.dtype]).reshape(t.shape)
                value = value.to(device=self.device, dtype=self.dtype)
                self.weight_bytes += value.numel() * value.element_size()
                counter.advance(t.bytes, t.name)
                return value

            self.embed = take(catalog.globals["embed"])
            self.layers = []
            for i, (entry, nvfp4_roles) in enumerate(zip(catalog.layers, packed)):
                moe_layer = self.decoder.moe is not None and self.decoder.moe.is_moe_layer(i)
                # NVFP4 projections dequantize to the compute dtype, fused groups (q/k/v, gate/up, each
                # expert's gate/up) over one global scale as the native engine holds them: the oracle
                # for its kernels.
                nvfp4 = read_layer(reader, nvfp4_roles, counter.advance)
                tensors = {role: dequantized(nvfp4[role]) if role in nvfp4 else take(t)
                           for role, t in entry.roles.items() if role in _Layer.__dataclass_fields__}
                if moe_layer:       # router, experts and shared expert: moe.MoeWeights
                    experts = read_experts(reader, packed_experts[i], counter.advance)

                    def weight(role, t, e=None):
                        got = nvfp4.get(role) if e is None else experts.get(e, {}).get(role)
                        return dequantized(got) if got is not None else take(t)

                    tensors["moe"] = self._moe_weights(entry, weight)
                self.layers.append(_Layer(**tensors))
            self.final_norm = take(catalog.globals["final_norm"])
            self.lm_head = take(catalog.globals["lm_head"]) if "lm_head" in catalog.globals else self.embed

    def _moe_weights(self, entry, weight) -> MoeWeights:
        """The router, the experts fused and stacked in expert order (gate_up [E, 2I, H], down
        [E, H, I], as moe.moe_placements lays them out), and the shared expert if any.
        weight(role, TensorInfo, expert=None) reads one tensor (NVFP4 ones dequantized)."""
        experts = range(self.decoder.num_experts)
        gate_up = torch.stack([torch.cat([weight("gate", entry.experts[e]["gate"], e),
                                          weight("up", entry.experts[e]["up"], e)]) for e in experts])
        down = torch.stack([weight("down", entry.experts[e]["down"], e) for e in experts])
        shared = {role: weight(role, entry.roles[role]) for role in ("shared_gate", "shared_up", "shared_down",
                                                                      "shared_expert_router") if role in entry.roles}
        return MoeWeights(router=weight("router", entry.roles["router"]), gate_up=gate_up, down=down, **shared)

    # ----------------------------------------------------------------------------- sequences
    def allocate_sequence(self) -> int:
        seq_id = self._next_id
        self._next_id += 1
        seq = _Sequence()
        d = self.decoder
        for _ in range(d.num_layers):
            seq.keys.append(torch.empty(self.kv_heads, 0, d.head_dim, device=self.device, dtype=self.kv_dtype))
            seq.values.append(torch.empty(self.kv_heads, 0, d.head_dim, device=self.device, dtype=self.kv_dtype))
        self._sequences[seq_id] = seq
        return seq_id

    def _seq(self, seq_id: int) -> _Sequence:
        try:
            return self._sequences[seq_id]
        except KeyError:
            raise UnknownSession(f"Sequence {seq_id} does not exist (released or never created).") from None

    def release_sequence(self, seq: int) -> None:
        self._sequences.pop(seq, None)

    def length(self, seq: int) -> int:
        return self._seq(seq).length

    def truncate(self, seq: int, length: int) -> None:
        s = self._seq(seq)
        s.length = max(0, min(length, s.length))

    # ----------------------------------------------------------------------------- forward
    def _reserve(self, s: _Sequence, needed: int) -> None:
        if needed > self.context_length:
            raise ContextOverflow(f"The conversation needs {needed:,} tokens; this model was loaded with a "
                                  f"context of {self.context_length:,}.")
        capacity = s.keys[0].shape[1]
        if needed <= capacity:
            return
        new_cap = min(self.context_length, max(needed, 2 * capacity, 64))
        for i in range(len(s.keys)):
            for cache in (s.keys, s.values):
                grown = torch.empty(cache[i].shape[0], new_cap, cache[i].shape[2], device=self.device,
                                    dtype=self.kv_dtype)
                grown[:, :s.length] = cache[i][:, :s.length]
                cache[i] = grown

    # Tensor-parallel hooks (engine/tensor_parallel.py overrides them on each rank). In one process the
    # embedding lookup is whole, the o / down products are complete sums, and the logits span the vocabulary.
    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed[ids]

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return partial

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.lm_head)

    @torch.inference_mode()
    def _forward(self, s: _Sequence, token_ids: Sequence[int], all_logits: bool) -> torch.Tensor:
        d = self.decoder
        n = len(token_ids)
        start = s.length
        self._reserve(s, start + n)
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=self.device)
        x = self._embed(ids)                                                 # [n, hidden]
        positions = torch.arange(start, start + n, dtype=torch.float64)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos().to(self.device, self.dtype)[None]                    # [1, n, hd]
        sin = emb.sin().to(self.device, self.dtype)[None]
        total = start + n
        mask = torch.ones(n, total, dtype=torch.bool, device=self.device).tril(diagonal=start)
        group = d.num_heads // d.num_kv_heads
        for i, w in enumerate(self.layers):
            heads, kv_heads = w.q.shape[0] // d.head_dim, w.k.shape[0] // d.head_dim   # this process's share
            h = rms_norm(x, w.attn_norm, d.rms_norm_eps)
            q, k = F.linear(h, w.q, w.q_bias), F.linear(h, w.k, w.k_bias)
            if d.qk_norm_whole_projection:       # OLMoE: one RMS over all heads, before the split
                q, k = rms_norm(q, w.q_norm, d.rms_norm_eps), rms_norm(k, w.k_norm, d.rms_norm_eps)
            q = q.view(n, heads, d.head_dim).transpose(0, 1)
            k = k.view(n, kv_heads, d.head_dim).transpose(0, 1)
            v = F.linear(h, w.v, w.v_bias).view(n, kv_heads, d.head_dim).transpose(0, 1)
            if w.q_norm is not None and not d.qk_norm_whole_projection:
                q = rms_norm(q, w.q_norm, d.rms_norm_eps)
                k = rms_norm(k, w.k_norm, d.rms_norm_eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            s.keys[i][:, start:total] = k
            s.values[i][:, start:total] = v
            keys = s.keys[i][:, :total].to(self.dtype).repeat_interleave(group, dim=0)
            values = s.values[i][:, :total].to(self.dtype).repeat_interleave(group, dim=0)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + self._reduce(F.linear(attn.transpose(0, 1).reshape(n, heads * d.head_dim), w.o))
            h = rms_norm(x, w.mlp_norm, d.rms_norm_eps)
            if w.moe is not None:
                x = x + moe_feed_forward(h, w.moe, d.moe)
            else:
                x = x + self._reduce(F.linear(F.silu(F.linear(h, w.gate)) * F.linear(h, w.up), w.down))
        s.length = total
        x = x if all_logits else x[-1:]
        return self._head(rms_norm(x, self.final_norm, d.rms_norm_eps)).float()

    def prefill(self, seq: int, token_ids: Sequence[int]) -> None:
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        self._logits = self._forward(self._seq(seq), token_ids, all_logits=False)

    def decode(self, seqs: Sequence[int], token_ids: Sequence[int]) -> None:
        rows = [self._forward(self._seq(s), [t], all_logits=False) for s, t in zip(seqs, token_ids)]
        self._logits = torch.cat(rows, dim=0)

    def sample(self, states: Sequence[SamplerState]) -> list[int]:
        return [sample_token(self._logits[i], st) for i, st in enumerate(states)]

    def last_logits(self) -> np.ndarray:
        return self._logits.cpu().numpy()

    def score(self, token_ids: Sequence[int]) -> np.ndarray:
        seq = self.allocate_sequence()
        try:
            return self._forward(self._seq(seq), token_ids, all_logits=True).cpu().numpy()
        finally:
            self.release_sequence(seq)

    def memory(self) -> dict:
        d = self.decoder
        kv = sum(s.keys[0].shape[1] for s in self._sequences.values()) * d.num_layers * 2 * self.kv_heads * d.head_dim
        return {"weight_bytes": self.weight_bytes, "kv_bytes": kv * self.kv_dtype.itemsize,
                "sequences": len(self._sequences)}

    def close(self) -> None:
        self._sequences.clear()
        self.layers = []
        self.embed = self.lm_head = None
        self._logits = None


def load_runner(info: CheckpointInfo, plan: ExecutionPlan, options: RunnerOptions,
                progress: Optional[ProgressCallback] = None, device: Optional[str] = None) -> TorchRunner:
    return TorchRunner(info, plan, options, progress, device or "cpu")
