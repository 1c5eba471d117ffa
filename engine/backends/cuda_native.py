"""The cuda-native backend: a ModelRunner over Hearth's compiled engine (engine._native).

Python only orchestrates here: it maps checkpoint tensors onto the engine's fused weight slots,
reports progress as each tensor lands on the GPU, turns native errors into engine errors, and
converts sampler states into plain parameters. Every computation (weights conversion, forward pass,
paged KV cache, sampling) happens in native/src.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..checkpoint import CheckpointInfo
from ..errors import (BackendUnavailable, ContextOverflow, EngineOutOfMemory, UnknownSession,
                      UnsupportedArchitecture, UnsupportedTensorType)
from ..progress import LOADING_WEIGHTS, PREPARING_RUNNER, ByteCounter, ProgressCallback, ProgressEvent
from ..sampling import SamplerState, mask_words
from .base import ModelRunner, RunnerOptions

_DTYPE_CODES = {"BF16": 0, "F16": 1, "F32": 2}
_SUPPORTED_HEAD_DIMS = (32, 64, 96, 128, 256)
# Checkpoint role -> (native slot, which part of a fused slot: index into the fused rows)
_LAYER_ROLES = {
    "attn_norm": ("attn_norm", None), "mlp_norm": ("mlp_norm", None),
    "q": ("wqkv", 0), "k": ("wqkv", 1), "v": ("wqkv", 2),
    "q_bias": ("bqkv", 0), "k_bias": ("bqkv", 1), "v_bias": ("bqkv", 2),
    "q_norm": ("q_norm", None), "k_norm": ("k_norm", None),
    "o": ("wo", None), "gate": ("wgu", 0), "up": ("wgu", 1), "down": ("wdown", None),
}
_cublas_preloaded = False


def _native():
    from .. import _native  # noqa: WPS433 (import on demand: the extension may be missing)

    return _native


def available() -> tuple[bool, str]:
    """(True, "") when the extension has CUDA compiled in and a device answers; never raises."""
    try:
        native = _native()
    except Exception as exc:  # ImportError, or a broken build
        return False, f"the compiled engine does not import ({exc})"
    try:
        info = native.build_info()
    except Exception as exc:
        return False, f"the compiled engine cannot report its build ({exc})"
    if not info.get("cuda_compiled"):
        return False, info.get("reason") or "this build has no CUDA code"
    if not info.get("runtime") or not hasattr(native, "Model"):
        return False, "this build has no CUDA runtime"
    if info.get("device_count", 0) < 1:
        return False, info.get("reason") or "no CUDA device"
    return True, ""


def device_memory() -> tuple[int, int]:
    """(free, total) bytes of GPU 0, as the CUDA runtime reports them."""
    import torch  # only for the query; the engine itself does not need torch

    if not torch.cuda.is_available():
        return 0, 0
    free, total = torch.cuda.mem_get_info(0)
    return int(free), int(total)


def _preload_cublaslt() -> None:
    """Load libcublasLt.so.13 from the nvidia-cublas wheel, where installed, so the engine's
    dlopen by soname finds it; where the toolkit's copy is on the loader path, that one is used."""
    global _cublas_preloaded
    if _cublas_preloaded:
        return
    _cublas_preloaded = True
    try:
        import nvidia  # namespace package of NVIDIA's wheels
    except ImportError:
        return
    for root in getattr(nvidia, "__path__", []):
        candidate = Path(root) / "cu13" / "lib" / "libcublasLt.so.13"
        if candidate.exists():
            try:
                ctypes.CDLL(str(candidate), mode=getattr(os, "RTLD_GLOBAL", 0))
            except OSError:
                pass
            return


def refuse_unsupported(info: CheckpointInfo) -> None:
    """What the native engine cannot run, refused before any GPU work (also where no GPU is)."""
    d = info.decoder
    if d.is_moe:
        moe = d.moe
        if moe.unsupported:
            raise UnsupportedArchitecture(moe.unsupported)
        problems = []
        if d.hidden_size % 16 or moe.expert_intermediate_size % 16 or moe.shared_expert_intermediate_size % 16:
            problems.append(f"hidden size {d.hidden_size} and expert sizes {moe.expert_intermediate_size}"
                            + (f" / {moe.shared_expert_intermediate_size}" if moe.has_shared_expert else "")
                            + " must be multiples of 16")
        if moe.top_k > 32:
            problems.append(f"it routes each token to {moe.top_k} experts (at most 32)")
        if moe.num_experts > 4096:
            problems.append(f"it has {moe.num_experts} experts (at most 4,096)")
        if problems:
            raise UnsupportedArchitecture(
                "The cuda-native backend cannot run this mixture-of-experts model: " + "; ".join(problems)
                + ". Load it with the torch backend (--backend torch).")


def _nvfp4_layers(info: CheckpointInfo):
    """The NVFP4 projections of every layer, checked (None for a 16-bit checkpoint). The engine runs
    NVFP4 on every layer projection or on none: a checkpoint that keeps some of them 16-bit is refused."""
    if info.quant_scheme is None:
        return None
    from ..nvfp4_checkpoint import PROJECTIONS, check_runnable

    layers = check_runnable(info)
    d = info.decoder
    for i, roles in enumerate(layers.layers):
        routes = d.is_moe and d.moe.is_moe_layer(i)
        wanted = [r for r in PROJECTIONS if not (routes and r in ("gate", "up", "down"))]
        if routes:
            experts = (getattr(layers, "experts", None) or [{}] * len(layers.layers))[i]
            short = [e for e in range(d.moe.num_experts)
                     if any(r not in experts.get(e, {}) for r in ("gate", "up", "down"))]
            if short:
                raise UnsupportedTensorType(
                    f"Layer {i} keeps expert {short[0]} in 16 bits beside NVFP4 projections; the cuda-native "
                    "backend runs NVFP4 on every layer projection and expert or on none. The torch backend "
                    "runs this model (--backend torch).")
            if d.moe.has_shared_expert:
                wanted += ["shared_gate", "shared_up", "shared_down"]
        missing = [r for r in wanted if r not in roles]
        if missing:
            raise UnsupportedTensorType(
                f"Layer {i} keeps {', '.join(missing)} in 16 bits beside NVFP4 projections; the cuda-native "
                "backend runs NVFP4 on every layer projection or on none. The torch backend runs this model "
                "(--backend torch).")
    return layers


def _model_config(info: CheckpointInfo, precision: str = "fast") -> dict:
    d = info.decoder
    refuse_unsupported(info)
    if d.head_dim not in _SUPPORTED_HEAD_DIMS:
        raise UnsupportedArchitecture(f"The cuda-native backend supports head sizes {_SUPPORTED_HEAD_DIMS}, "
                                      f"not {d.head_dim}.")
    config = {
        "layers": d.num_layers, "hidden": d.hidden_size, "heads": d.num_heads,
        "kv_heads": d.num_kv_heads, "head_dim": d.head_dim, "intermediate": d.intermediate_size,
        "vocab": d.vocab_size, "rms_eps": float(d.rms_norm_eps), "rope_theta": float(d.rope_theta),
        "tied_embeddings": "lm_head" not in info.catalog.globals,
        "qkv_bias": bool(d.attention_bias), "qk_norm": bool(d.qk_norm), "precision": precision,
        "nvfp4": _nvfp4_layers(info) is not None,
        "qk_norm_whole": bool(getattr(d, "qk_norm_whole_projection", False)),
    }
    if d.is_moe:
        moe = d.moe
        config.update(moe_experts=moe.num_experts, moe_top_k=moe.top_k, moe_inter=moe.expert_intermediate_size,
                      moe_shared_inter=moe.shared_expert_intermediate_size, moe_normalize=bool(moe.normalize_top_k),
                      moe_layers=[1 if moe.is_moe_layer(i) else 0 for i in range(d.num_layers)])
    scaling = d.rope_scaling or {}
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "llama3":
        config.update(rope_type="llama3", rope_factor=float(scaling["factor"]),
                      rope_low_freq_factor=float(scaling["low_freq_factor"]),
                      rope_high_freq_factor=float(scaling["high_freq_factor"]),
                      rope_original_max_positions=int(scaling["original_max_position_embeddings"]))
    elif kind == "linear":
        config.update(rope_type="linear", rope_factor=float(scaling["factor"]))
    elif kind != "default":
        raise UnsupportedArchitecture(f"The cuda-native backend does not implement {kind!r} rope scaling.")
    return config


def _cache_config(context_length: int, block_size: int, max_batch: int, block_count: int,
                  prefill_chunk: int = 2048) -> dict:
    return {"block_size": int(block_size), "block_count": int(block_count),
            "max_sequence_blocks": -(-int(context_length) // int(block_size)),
            "max_batch": int(max_batch), "chunk_tokens": int(prefill_chunk)}


def memory_plan(info: CheckpointInfo, context_length: int, max_batch: int, sessions: int,
                precision: str, block_size: int = 16) -> Optional[dict]:
    """The native runtime's own memory plan for this checkpoint (engine._native.plan_memory: the
    buffers a load allocates), or None where the extension has no CUDA runtime compiled in."""
    try:
        native = _native()
    except Exception:
        return None
    if not hasattr(native, "plan_memory"):
        return None
    blocks = -(-int(context_length) // block_size) * int(sessions)
    try:
        config = _model_config(info, precision)
    except UnsupportedArchitecture:  # the load will say why; the plan falls back to the estimate
        return None
    return dict(native.plan_memory(config, _cache_config(context_length, block_size, max_batch, blocks)))


def _placements(info: CheckpointInfo, nvfp4_layers=None):
    """(slot, layer, TensorInfo, element offset) for every 16-bit tensor the engine loads, fused slots
    (q/k/v, gate/up) filled part by part. NVFP4 projections (`nvfp4_layers`) load separately."""
    d = info.decoder
    cat = info.catalog
    H, I = d.hidden_size, d.intermediate_size
    qkv_rows = (d.q_size, d.kv_size, d.kv_size)
    out = [("embed", -1, cat.globals["embed"], 0), ("final_norm", -1, cat.globals["final_norm"], 0)]
    if "lm_head" in cat.globals:
        out.append(("lm_head", -1, cat.globals["lm_head"], 0))
    for i, entry in enumerate(cat.layers):
        for role, t in entry.roles.items():
            if role not in _LAYER_ROLES or (nvfp4_layers is not None and role in nvfp4_layers.layers[i]):
                continue
            slot, part = _LAYER_ROLES[role]
            if slot in ("bqkv", "q_norm", "k_norm") and not (d.attention_bias if slot == "bqkv" else d.qk_norm):
                continue
            offset = 0
            if slot == "wqkv":
                offset = sum(qkv_rows[:part]) * H
            elif slot == "bqkv":
                offset = sum(qkv_rows[:part])
            elif slot == "wgu":
                offset = part * I * H
            out.append((slot, i, t, offset))
    if d.is_moe:
        from ..moe import moe_placements

        packed = {"moe_gate_up", "moe_down", "moe_shared_gate_up", "moe_shared_down"}
        out += [p for p in moe_placements(d, cat) if nvfp4_layers is None or p[0] not in packed]
    return out


class CudaRunner(ModelRunner):
    backend_name = "cuda-native"
    device_masks = True   # the device sampler applies structured output's token mask (sampling.cu)

    def __init__(self, info: CheckpointInfo, options: RunnerOptions,
                 progress: Optional[ProgressCallback] = None):
        native = _native()
        self._native = native
        self.decoder = info.decoder
        self.options = options
        if info.format != "safetensors":
            raise UnsupportedTensorType("The cuda-native backend loads safetensors checkpoints.")
        nvfp4_layers = _nvfp4_layers(info)
        config = _model_config(info, options.precision)
        placements = _placements(info, nvfp4_layers)
        for _, _, t, _ in placements:
            if t.dtype not in _DTYPE_CODES:
                raise UnsupportedTensorType(f"The cuda-native backend reads bf16, fp16 and fp32 tensors, "
                                            f"not {t.dtype} ({t.name}).")
        cache = _cache_config(options.context_length, options.kv_block_size, options.max_batch,
                              options.kv_blocks, options.prefill_chunk)
        _preload_cublaslt()
        total = sum(p[2].bytes for p in placements)
        if nvfp4_layers is not None:
            entries = [e for layer in nvfp4_layers.layers for e in layer.values()]
            entries += [e for layer in getattr(nvfp4_layers, "experts", None) or []
                        for expert in layer.values() for e in expert.values()]
            total += sum(e.weight.bytes + e.block_scale.bytes + e.global_scale.bytes for e in entries)
        counter = ByteCounter(progress, LOADING_WEIGHTS, total)
        counter.start("allocating GPU memory")
        try:
            self._model = native.Model(config, cache)
        except native.OutOfMemory as exc:
            message, needed, free = exc.args
            raise EngineOutOfMemory(f"Not enough GPU memory for this model: {message}.",
                                    needed_bytes=int(needed), free_bytes=int(free)) from None
        try:
            for slot, layer, t, offset in placements:
                self._model.load_tensor(getattr(native.Slot, slot), layer, str(Path(info.path) / t.file),
                                        t.offset, t.bytes, _DTYPE_CODES[t.dtype], offset, t.numel)
                counter.advance(t.bytes, t.name)
            if nvfp4_layers is not None:
                self._load_nvfp4(info, nvfp4_layers, counter)
            self._model.finish_load()
        except native.OutOfMemory as exc:
            self._model = None
            message, needed, free = exc.args
            raise EngineOutOfMemory(f"Not enough GPU memory for this model: {message}.",
                                    needed_bytes=int(needed), free_bytes=int(free)) from None
        except BaseException:
            self._model = None  # frees every device buffer
            raise
        if progress:
            progress(ProgressEvent(PREPARING_RUNNER, total, total, "weights resident on the GPU"))
        self._sequences: set[int] = set()

    def _load_nvfp4(self, info: CheckpointInfo, layers, counter: ByteCounter) -> None:
        """Each layer's NVFP4 projections, fused as the engine holds them (q/k/v and gate/up rows
        stacked on one global scale: nvfp4_checkpoint.read_layer), copied packed into their slots."""
        from ..nvfp4_checkpoint import read_layer
        from ..weights import TensorReader

        slots = {"wqkv": ("q", "k", "v"), "wo": ("o",), "wgu": ("gate", "up"), "wdown": ("down",)}
        with TensorReader(info) as reader:
            for i, roles in enumerate(layers.layers):
                tensors = read_layer(reader, roles, counter.advance)
                routes = info.decoder.is_moe and info.decoder.moe.is_moe_layer(i)
                for slot, parts in slots.items():
                    if routes and slot in ("wgu", "wdown"):
                        continue
                    group = [tensors[r] for r in parts]
                    codes = np.concatenate([t.packed for t in group]) if len(group) > 1 else group[0].packed
                    scales = (np.concatenate([t.block_scales for t in group]) if len(group) > 1
                              else group[0].block_scales)
                    self._model.load_nvfp4(getattr(self._native.Slot, slot), i, codes, scales,
                                           float(group[0].global_scale))
                if routes:
                    self._load_nvfp4_experts(reader, layers, i, tensors, counter)

    def _load_nvfp4_experts(self, reader, layers, i: int, tensors: dict, counter: ByteCounter) -> None:
        """Layer i's NVFP4 experts (gate and up of each on one global scale: nvfp4_checkpoint.read_experts)
        and its shared expert (read_layer fused its gate / up), each copied packed into its slot."""
        from ..nvfp4_checkpoint import read_experts

        def put(slot, e, parts):
            codes = np.concatenate([t.packed for t in parts]) if len(parts) > 1 else parts[0].packed
            scales = np.concatenate([t.block_scales for t in parts]) if len(parts) > 1 else parts[0].block_scales
            self._model.load_nvfp4_expert(getattr(self._native.Slot, slot), i, e, codes, scales,
                                          float(parts[0].global_scale))

        experts = read_experts(reader, layers.experts[i], counter.advance)
        for e in range(self.decoder.moe.num_experts):
            put("moe_gate_up", e, [experts[e]["gate"], experts[e]["up"]])
            put("moe_down", e, [experts[e]["down"]])
        if self.decoder.moe.has_shared_expert:
            put("moe_shared_gate_up", 0, [tensors["shared_gate"], tensors["shared_up"]])
            put("moe_shared_down", 0, [tensors["shared_down"]])

    # ----------------------------------------------------------------------------- helpers
    def _m(self):
        if self._model is None:
            raise BackendUnavailable("This runner was closed.")
        return self._model

    def _seq(self, seq: int) -> int:
        if seq not in self._sequences:
            raise UnknownSession(f"Sequence {seq} does not exist (released or never created).")
        return seq

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._native.CacheFull as exc:
            message = str(exc)
            if "KV cache is full" in message:  # the pool, not this sequence's context
                total = self._m().memory()["kv_blocks_total"] * self.options.kv_block_size
                message = (f"The KV cache is full: the chats in progress hold all {total:,} tokens this model "
                           f"was loaded with ({message}). Finish or delete a chat, or load the model with "
                           "more resident sessions or a shorter context.")
            raise ContextOverflow(message) from None
        except self._native.OutOfMemory as exc:
            message, needed, free = exc.args
            raise EngineOutOfMemory(message, needed_bytes=int(needed), free_bytes=int(free)) from None

    # ----------------------------------------------------------------------------- contract
    def allocate_sequence(self) -> int:
        seq = self._m().allocate_sequence()
        self._sequences.add(seq)
        return seq

    def release_sequence(self, seq: int) -> None:
        if seq in self._sequences:
            self._sequences.discard(seq)
            self._m().release_sequence(seq)

    def length(self, seq: int) -> int:
        return self._m().length(self._seq(seq))

    def truncate(self, seq: int, length: int) -> None:
        m = self._m()
        m.truncate(self._seq(seq), max(0, min(int(length), m.length(seq))))

    def prefill(self, seq: int, token_ids: Sequence[int]) -> None:
        if not token_ids:
            raise ValueError("prefill needs at least one token")
        self._call(self._m().prefill, self._seq(seq), [int(t) for t in token_ids])

    def decode(self, seqs: Sequence[int], token_ids: Sequence[int]) -> None:
        seqs = [self._seq(s) for s in seqs]
        self._call(self._m().decode, seqs, [int(t) for t in token_ids])

    def _sample_rows(self, states: Sequence[SamplerState]) -> list[dict]:
        rows = []
        for st in states:
            p = st.params
            rows.append({"temperature": float(p.temperature), "top_k": int(p.top_k), "top_p": float(p.top_p),
                         "min_p": float(p.min_p), "repetition_penalty": float(p.repetition_penalty),
                         "seed": int(st.seed) & 0xFFFFFFFFFFFFFFFF, "step": int(st.step),
                         "history": [int(t) for t in st.history] if p.repetition_penalty != 1.0 else [],
                         "mask": (mask_words(st.constraint, self.decoder.vocab_size)
                                  if st.constraint is not None else None)})
        return rows

    def sample(self, states: Sequence[SamplerState]) -> list[int]:
        return [int(t) for t in self._call(self._m().sample, self._sample_rows(states))]

    def decode_and_sample(self, seqs: Sequence[int], token_ids: Sequence[int],
                          states: Sequence[SamplerState]) -> list[int]:
        """One native call: metadata upload, the bucket's CUDA-graph replay, device sampling, and one
        token id per sequence read back."""
        if len(states) != len(seqs):
            raise ValueError("decode_and_sample needs one sampler state per sequence")
        seqs = [self._seq(s) for s in seqs]
        return [int(t) for t in self._call(self._m().decode_sample, seqs, [int(t) for t in token_ids],
                                           self._sample_rows(states))]

    def graph_buckets(self) -> list[int]:
        """Batch sizes whose decode step was captured as a CUDA graph at load (empty: none)."""
        return list(self._m().graph_buckets())

    def last_logits(self) -> np.ndarray:
        return self._m().last_logits()

    def score(self, token_ids: Sequence[int]) -> np.ndarray:
        ids = [int(t) for t in token_ids]
        if not ids:
            return np.zeros((0, self.decoder.vocab_size), dtype=np.float32)
        out = np.empty((len(ids), self.decoder.vocab_size), dtype=np.float32)
        seq = self.allocate_sequence()
        try:
            self._call(self._m().score_into, seq, ids, out)
        finally:
            self.release_sequence(seq)
        return out

    def memory(self) -> dict:
        return dict(self._m().memory()) if self._model is not None else {}

    def close(self) -> None:
        self._sequences.clear()
        self._model = None  # the native destructor frees weights, KV pool and workspace


def load_runner(info: CheckpointInfo, plan, options: RunnerOptions,
                progress: Optional[ProgressCallback] = None) -> CudaRunner:
    refuse_unsupported(info)
    ok, reason = available()
    if not ok:
        raise BackendUnavailable(f"The cuda-native backend cannot run here: {reason}.")
    return CudaRunner(info, options, progress)
