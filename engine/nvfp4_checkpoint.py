"""NVFP4 checkpoints on disk: recognising the two layouts, checking their scale tensors, reading them.

    ModelOpt            hf_quant_config.json {"quantization": {"quant_algo": "NVFP4", "group_size": 16,
                        "exclude_modules": [...]}}, or config.json quantization_config.quant_method
                        "modelopt"; per projection: weight (U8 [N, K/2]), weight_scale (F8_E4M3
                        [N, K/16]), weight_scale_2 (F32 scalar), input_scale (F32, unused weight-only).
    compressed-tensors  config.json quantization_config {"quant_method": "compressed-tensors",
                        "format": "nvfp4-pack-quantized", "config_groups": {...}, "ignore": [...]};
                        per projection: weight_packed, weight_scale, weight_global_scale (F32 [1], the
                        inverse of ModelOpt's), optionally input_global_scale.

Hearth runs both weight-only: activations stay 16-bit (as vLLM's Marlin FP4 path does on GPUs
without FP4 tensor cores), so input scales are read past. The format maths is in engine/nvfp4.py.

Mixture of experts: every routed expert's gate / up / down and the shared expert's projections may be
NVFP4 (the same tensors and checks, per expert: `NvFp4Layers.experts`, `read_experts`); routers and the
shared expert's sigmoid gate stay 16-bit, as both tools leave them (a quantized one is refused).
"""
from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from . import nvfp4
from .errors import CorruptCheckpoint, MissingTensors, UnsupportedArchitecture

MODELOPT = "modelopt"
COMPRESSED_TENSORS = "compressed-tensors"
NVFP4_FORMAT = "nvfp4-pack-quantized"          # compressed-tensors' format name
PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")          # a dense layer's (a MoE layer has q/k/v/o)
SHARED_PROJECTIONS = ("shared_gate", "shared_up", "shared_down")  # Qwen2-MoE's shared expert, a MoE layer's own
EXPERT_PROJECTIONS = ("gate", "up", "down")                        # each routed expert's
ROUTERS = ("router", "shared_expert_router")                       # always 16-bit (real checkpoints exclude them)
# slots the engine runs as one product: a layer's q/k/v and gate/up, the shared expert's gate/up ...
FUSED_GROUPS = (("q", "k", "v"), ("gate", "up"), ("shared_gate", "shared_up"))
EXPERT_FUSED = ("gate", "up")                                      # ... and each expert's gate/up
# Where each layout keeps the global scale, and whether it is the multiplier or its inverse.
GLOBAL_SCALE_NAME = {MODELOPT: "weight_scale_2", COMPRESSED_TENSORS: "weight_global_scale"}
SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "weight_global_scale", "input_scale", "input_global_scale")


@dataclass(frozen=True)
class NvFp4Scheme:
    """What a checkpoint's quantization settings say, and whether Hearth can run them."""
    layout: str                      # modelopt | compressed-tensors
    algorithm: str                   # NVFP4, NVFP4_AWQ, ... as the checkpoint names it
    group_size: int
    exclusions: tuple = ()           # modules left unquantized (patterns as written)
    activations: str = "16-bit"      # what the checkpoint's activations were calibrated for
    kv_cache: str = ""               # a KV-cache quantization scheme, "" when none
    unsupported: str = ""            # why Hearth cannot run it, "" when it can

    @property
    def global_scale_name(self) -> str:
        return GLOBAL_SCALE_NAME[self.layout]

    @property
    def weight_suffix(self) -> str:
        return "weight" if self.layout == MODELOPT else "weight_packed"

    def excludes(self, module: str) -> bool:
        """True when `module` (e.g. lm_head, model.layers.0.mlp.down_proj) is listed as not quantized."""
        for pattern in self.exclusions:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], module):
                    return True
            elif fnmatch.fnmatchcase(module, pattern) or module.endswith("." + pattern) or module == pattern:
                return True
        return False

    def to_dict(self) -> dict:
        return {**asdict(self), "exclusions": list(self.exclusions)}


# ---------------------------------------------------------------------------------------------
# Recognising the layouts


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"{path.name} (quantization settings) cannot be read: {exc}") from None
    if not isinstance(value, dict):
        raise CorruptCheckpoint(f"{path.name} (quantization settings) is not a JSON object.")
    return value


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _modelopt(settings: dict) -> NvFp4Scheme:
    algo = str(settings.get("quant_algo") or "").upper()
    group = _int(settings.get("group_size"), 0)
    weights = {}
    for g in (settings.get("config_groups") or {}).values():
        if isinstance(g, dict) and isinstance(g.get("weights"), dict):
            weights = g["weights"]
            group = group or _int(weights.get("group_size"), 0)
    group = group or nvfp4.BLOCK
    exclusions = tuple(settings.get("exclude_modules") or settings.get("ignore") or ())
    kv = settings.get("kv_cache_quant_algo") or settings.get("kv_cache_scheme") or ""
    kv = kv if isinstance(kv, str) else str(kv.get("type") or "quantized") + str(kv.get("num_bits") or "")
    unsupported = ""
    if algo == "NVFP4_AWQ":
        unsupported = ("This ModelOpt checkpoint is NVFP4 with AWQ: its activations must be pre-scaled "
                       "(pre_quant_scale), which Hearth does not implement yet.")
    elif algo != "NVFP4":
        unsupported = f"This ModelOpt checkpoint is quantized as {algo or 'an unnamed scheme'}; Hearth runs NVFP4 only."
    return NvFp4Scheme(MODELOPT, algo or "?", group, exclusions, "16-bit", str(kv), unsupported)


def _compressed_tensors(qc: dict) -> Optional[NvFp4Scheme]:
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    formats = {str(g.get("format") or qc.get("format") or "") for g in groups} or {str(qc.get("format") or "")}
    if NVFP4_FORMAT not in formats:
        return None
    unsupported, group_sizes, activations = "", set(), "16-bit"
    if len(formats) > 1:
        unsupported = (f"This checkpoint mixes quantization formats ({', '.join(sorted(formats))}); "
                       "Hearth runs NVFP4 checkpoints whose quantized layers are all NVFP4.")
    for g in groups:
        w = g.get("weights") or {}
        group_sizes.add(_int(w.get("group_size"), 0))
        if (_int(w.get("num_bits"), 0), str(w.get("type"))) != (4, "float") and not unsupported:
            unsupported = (f"A config group quantizes weights as {w.get('num_bits')}-bit {w.get('type')}; "
                           "NVFP4 weights are 4-bit float.")
        a = g.get("input_activations")
        if isinstance(a, dict):
            activations = f"{a.get('num_bits')}-bit {a.get('type')} (run 16-bit)"
    group = min(group_sizes - {0}, default=nvfp4.BLOCK)
    kv = qc.get("kv_cache_scheme")
    kv_text = "" if not kv else f"{kv.get('num_bits', '?')}-bit {kv.get('type', '?')}" if isinstance(kv, dict) else str(kv)
    return NvFp4Scheme(COMPRESSED_TENSORS, "NVFP4", group if len(group_sizes - {0}) <= 1 else -1,
                       tuple(qc.get("ignore") or ()), activations, kv_text, unsupported)


def detect(folder: Path, config: dict, tensors: list = ()) -> Optional[NvFp4Scheme]:
    """The NVFP4 scheme a Hugging Face folder declares, or None when it declares none.

    A folder with ModelOpt's weight_scale_2 tensors but no settings file is taken as ModelOpt NVFP4.
    """
    qc = config.get("quantization_config") if isinstance(config.get("quantization_config"), dict) else {}
    method = str(qc.get("quant_method") or "").lower()
    hf_quant = Path(folder) / "hf_quant_config.json"
    scheme = None
    if hf_quant.exists():
        settings = _read_json(hf_quant).get("quantization")
        if isinstance(settings, dict):
            scheme = _modelopt(settings)
    if scheme is None and method == "modelopt":
        scheme = _modelopt(qc)
    if scheme is None and method == "compressed-tensors":
        scheme = _compressed_tensors(qc)
    if scheme is None and any(t.name.endswith(".weight_scale_2") for t in tensors):
        scheme = NvFp4Scheme(MODELOPT, "NVFP4", nvfp4.BLOCK)
    if scheme is None:
        return None
    if scheme.layout == MODELOPT:
        # ModelOpt's NVFP4 is W4A4 when it ships input scales; without them it is weight-only.
        has_input = any(t.name.endswith(".input_scale") for t in tensors)
        scheme = _replace(scheme, activations="nvfp4 (run 16-bit)" if has_input else "16-bit")
    if not scheme.unsupported:
        if scheme.group_size != nvfp4.BLOCK:
            what = "several group sizes" if scheme.group_size < 0 else f"groups of {scheme.group_size}"
            scheme = _replace(scheme, unsupported=f"This NVFP4 checkpoint uses {what}; NVFP4 has one "
                                                  f"block scale per {nvfp4.BLOCK} inputs, which is all Hearth runs.")
        elif scheme.kv_cache:
            scheme = _replace(scheme, unsupported=(
                f"This checkpoint also quantizes the KV cache ({scheme.kv_cache}); Hearth keeps the KV "
                "cache in 16 bits and does not apply KV-cache scales yet."))
    return scheme


def _replace(scheme: NvFp4Scheme, **changes) -> NvFp4Scheme:
    return NvFp4Scheme(**{**asdict(scheme), **changes})


# ---------------------------------------------------------------------------------------------
# Per-tensor facts for the inspector


def tensor_format(scheme: Optional[NvFp4Scheme], t) -> tuple[str, float]:
    """(format, bits per weight) of one tensor, e.g. ("nvfp4", 4.5) or ("e4m3 block scale", 8)."""
    suffix = t.name.rsplit(".", 1)[-1]
    if scheme is not None and t.dtype == "U8" and suffix in ("weight", "weight_packed") and len(t.shape) == 2:
        return "nvfp4", round(nvfp4.bits_per_weight((t.shape[0], t.shape[1] * 2)), 3)
    if scheme is not None and suffix in SCALE_SUFFIXES:
        kind = {"weight_scale": "e4m3 block scale", "weight_scale_2": "fp32 global scale",
                "weight_global_scale": "fp32 global scale (inverse)", "input_scale": "input scale (unused)",
                "input_global_scale": "input scale (unused)"}[suffix]
        return kind, 0.0
    bits = {"BF16": 16, "F16": 16, "F32": 32, "F64": 64, "F8_E4M3": 8, "F8_E5M2": 8, "U8": 8, "I8": 8}
    return t.dtype.lower(), float(bits.get(t.dtype, 0))


def logical_shape(t) -> tuple:
    """The weight's [N, K] (a packed NVFP4 tensor stores K/2 bytes per row)."""
    if t.dtype == "U8" and len(t.shape) == 2:
        return (t.shape[0], t.shape[1] * 2)
    return tuple(t.shape)


def parameter_count(scheme: NvFp4Scheme, tensors: list) -> int:
    """Weights as a model counts them: packed tensors count both nibbles, scales count nothing."""
    total = 0
    for t in tensors:
        if t.name.rsplit(".", 1)[-1] in SCALE_SUFFIXES:
            continue
        total += int(np.prod(logical_shape(t))) if tensor_format(scheme, t)[0] == "nvfp4" else t.numel
    return total


# ---------------------------------------------------------------------------------------------
# Pairing weights with their scales, and checking them


@dataclass(frozen=True)
class NvFp4Entry:
    """One NVFP4 projection as the checkpoint stores it."""
    role: str
    weight: object              # TensorInfo, U8 [N, K/2]
    block_scale: object         # TensorInfo, F8_E4M3 [N, K/16]
    global_scale: object        # TensorInfo, F32 scalar
    inverse: bool               # True for compressed-tensors (weight_global_scale divides)


@dataclass
class NvFp4Layers:
    scheme: NvFp4Scheme
    layers: list = field(default_factory=list)      # per layer: {role: NvFp4Entry} (q..down, shared_*)
    experts: list = field(default_factory=list)     # per layer: {expert index: {role: NvFp4Entry}} ({} if dense)

    @property
    def count(self) -> int:
        return sum(len(layer) for layer in self.layers) + sum(
            len(roles) for layer in self.experts for roles in layer.values())


_WHAT = {"q": "q projection", "k": "k projection", "v": "v projection", "o": "o projection",
         "gate": "gate projection", "up": "up projection", "down": "down projection",
         "shared_gate": "shared expert's gate projection", "shared_up": "shared expert's up projection",
         "shared_down": "shared expert's down projection"}


def _entry(scheme: NvFp4Scheme, role: str, t, scales: dict, want: Optional[tuple], what: str) -> Optional[NvFp4Entry]:
    """The checked NVFP4 entry of one projection, or None when it is stored 16-bit.

    `scales` holds the scale tensors beside it under "{role}.{suffix}" (LayerEntry.scales or one
    expert's LayerEntry.expert_scales); `want` is the [N, K] config.json implies, `what` names it.
    """
    if t is None or t.dtype != "U8":
        if t is not None and f"{role}.weight_scale" in scales:
            raise CorruptCheckpoint(
                f"{t.name} has NVFP4 scales beside it but is stored as {t.dtype}; a packed NVFP4 "
                "weight is U8 (two 4-bit values per byte).")
        return None
    block = scales.get(f"{role}.weight_scale")
    glob = scales.get(f"{role}.{scheme.global_scale_name}")
    module = t.name.rsplit(".", 1)[0]
    if block is None:
        raise MissingTensors(f"{t.name} is a packed NVFP4 weight but {module}.weight_scale, its "
                             "block scales, is missing: the checkpoint is incomplete.")
    if glob is None:
        raise MissingTensors(f"{t.name} is a packed NVFP4 weight but {module}.{scheme.global_scale_name}, "
                             "its global scale, is missing: the checkpoint is incomplete.")
    if len(t.shape) != 2:
        raise CorruptCheckpoint(f"{t.name} should be a packed NVFP4 matrix [N, K/2] but has shape {list(t.shape)}.")
    n, k = logical_shape(t)
    if want is not None and (n, k) != tuple(want):
        raise CorruptCheckpoint(
            f"{t.name} holds an NVFP4 weight of {n} x {k}, but config.json implies "
            f"{want[0]} x {want[1]} for the {what}. The weights and the configuration belong to different models.")
    if k % nvfp4.BLOCK:
        raise CorruptCheckpoint(f"{t.name} has {k} inputs, not a multiple of the NVFP4 block of "
                                f"{nvfp4.BLOCK}.")
    if block.dtype != "F8_E4M3":
        raise CorruptCheckpoint(f"{block.name} should hold fp8 e4m3 block scales but is {block.dtype}; "
                                "the checkpoint was not written as NVFP4.")
    if tuple(block.shape) != (n, k // nvfp4.BLOCK):
        raise CorruptCheckpoint(
            f"{block.name} has shape {list(block.shape)}, but a {n} x {k} NVFP4 weight needs one block "
            f"scale per {nvfp4.BLOCK} inputs: {[n, k // nvfp4.BLOCK]}.")
    if glob.dtype != "F32":
        raise CorruptCheckpoint(f"{glob.name} should be one fp32 global scale but is {glob.dtype}.")
    if glob.numel != 1:
        raise CorruptCheckpoint(f"{glob.name} should be one fp32 global scale per tensor, but it holds "
                                f"{glob.numel} values (shape {list(glob.shape)}).")
    return NvFp4Entry(role, t, block, glob, scheme.layout == COMPRESSED_TENSORS)


def _refuse_quantized_routers(layer, i: int) -> None:
    for role in ROUTERS:
        t = layer.roles.get(role)
        if t is None:
            continue
        scale = next((layer.scales[f"{role}.{s}"] for s in ("weight_scale", "weight_scale_2", "weight_global_scale")
                      if f"{role}.{s}" in layer.scales), None)
        if t.dtype == "U8" or scale is not None:
            what = "router" if role == "router" else "shared expert's sigmoid gate"
            module = t.name.rsplit(".", 1)[0]
            raise UnsupportedArchitecture(
                f"This checkpoint quantizes the {what} of layer {i} ({module}"
                f"{', stored ' + t.dtype if t.dtype == 'U8' else ', with ' + scale.name.rsplit('.', 1)[-1]}); "
                "Hearth runs NVFP4 experts with 16-bit routers, as ModelOpt and llm-compressor write them "
                "(their exclude_modules / ignore lists name every router).")


def pair(info) -> NvFp4Layers:
    """Every NVFP4 projection of an inspected checkpoint with its scales, each checked: each layer's
    attention and dense-MLP projections and its shared expert's (`layers`), and each routed expert's
    gate / up / down (`experts`).

    Raises MissingTensors when a packed weight has no block or global scale, CorruptCheckpoint when a
    weight or scale has the wrong dtype or shape, UnsupportedArchitecture when a router is quantized.
    """
    scheme = info.quant_scheme
    from .weights import expected_shapes

    want = expected_shapes(info.decoder)
    result = NvFp4Layers(scheme)
    for i, layer in enumerate(info.catalog.layers):
        _refuse_quantized_routers(layer, i)
        found = {}
        for role in PROJECTIONS + SHARED_PROJECTIONS:
            entry = _entry(scheme, role, layer.roles.get(role), layer.scales, want.get(role), _WHAT[role])
            if entry is not None:
                found[role] = entry
        experts = {}
        for e in sorted(layer.experts):
            scales = layer.expert_scales.get(e, {})
            roles = {}
            for role in EXPERT_PROJECTIONS:
                entry = _entry(scheme, role, layer.experts[e].get(role), scales, want.get("expert_" + role),
                               f"{_WHAT[role]} of expert {e}")
                if entry is not None:
                    roles[role] = entry
            if roles:
                experts[e] = roles
        result.layers.append(found)
        result.experts.append(experts)
    if not result.count:
        raise MissingTensors("The checkpoint declares NVFP4 quantization but holds no packed NVFP4 weight.")
    return result


def check_runnable(info) -> NvFp4Layers:
    """The checked pairing, or UnsupportedArchitecture naming why this NVFP4 scheme cannot run."""
    if info.quant_scheme.unsupported:
        raise UnsupportedArchitecture(info.quant_scheme.unsupported)
    for name in info.catalog.unexpected:
        if name.rsplit(".", 1)[-1] in SCALE_SUFFIXES and not name.startswith("model.layers."):
            raise UnsupportedArchitecture(
                f"This checkpoint quantizes {name.rsplit('.', 1)[0]} too; Hearth runs NVFP4 projections "
                "in the decoder layers and keeps the embedding and lm_head 16-bit.")
    for t in info.catalog.globals.values():
        if t.dtype == "U8":
            raise UnsupportedArchitecture(
                f"{t.name} is stored packed; Hearth keeps the embedding and lm_head 16-bit.")
    return pair(info)


def coverage(info, layers: Optional[NvFp4Layers] = None) -> list:
    """[(part, NVFP4 projections, all projections)] per part of the decoder that has projections:
    attention, dense MLP, experts, shared expert. What the inspector prints."""
    layers = layers if layers is not None else pair(info)
    parts = {"attention": [0, 0], "dense MLP": [0, 0], "experts": [0, 0], "shared expert": [0, 0]}
    for layer, found, experts in zip(info.catalog.layers, layers.layers, layers.experts):
        for role in layer.roles:
            part = ("attention" if role in ("q", "k", "v", "o") else "dense MLP" if role in ("gate", "up", "down")
                    else "shared expert" if role in SHARED_PROJECTIONS else None)
            if part:
                parts[part][0] += role in found
                parts[part][1] += 1
        for e, roles in layer.experts.items():
            parts["experts"][0] += sum(r in experts.get(e, {}) for r in roles)
            parts["experts"][1] += len(roles)
    return [(part, n, total) for part, (n, total) in parts.items() if total]


# ---------------------------------------------------------------------------------------------
# Reading


def read_entry(reader, entry: NvFp4Entry) -> nvfp4.NvFp4Tensor:
    """Read one projection into the resident form: packed codes, e4m3 bits, fp32 multiplier."""
    def raw(t) -> np.ndarray:
        out = np.empty(t.bytes, dtype=np.uint8)
        reader.read_into(t, memoryview(out))
        return out

    packed = raw(entry.weight).reshape(entry.weight.shape)
    block = raw(entry.block_scale).reshape(entry.block_scale.shape)
    value = raw(entry.global_scale).view("<f4")[0]
    if not np.isfinite(value) or value <= 0:
        raise CorruptCheckpoint(f"{entry.global_scale.name} is {value}; a global scale must be a positive number.")
    multiplier = np.float32(np.float32(1.0) / value) if entry.inverse else np.float32(value)
    return nvfp4.NvFp4Tensor(packed, block, multiplier)


def _read_fused(reader, roles: dict, groups, advance) -> dict:
    """{role: NvFp4Tensor}, the parts of each group in `groups` on the largest of their global scales."""
    tensors = {}
    for role, entry in roles.items():
        tensors[role] = read_entry(reader, entry)
        if advance is not None:
            advance(entry.weight.bytes + entry.block_scale.bytes + entry.global_scale.bytes, entry.weight.name)
    for group in groups:
        if all(r in tensors for r in group):
            common = max(tensors[r].global_scale for r in group)
            for r in group:
                tensors[r] = nvfp4.with_global_scale(tensors[r], common)
    return tensors


def read_layer(reader, layer: dict, advance=None) -> dict:
    """{role: NvFp4Tensor} of one layer, fused groups sharing one global scale as the engine runs them.

    Parts of a fused slot (q/k/v, gate/up, the shared expert's gate/up) with different global scales
    are brought onto the largest of them (engine.nvfp4.with_global_scale); the returned parts are the
    rows of the fused weight, so the torch reference computes over exactly what a fused kernel holds
    resident.
    """
    return _read_fused(reader, layer, FUSED_GROUPS, advance)


def read_experts(reader, layer_experts: dict, advance=None) -> dict:
    """{expert index: {role: NvFp4Tensor}} of one layer's routed experts (`NvFp4Layers.experts[i]`).

    Each expert's gate and up are one fused slot (moe_gate_up: gate rows, then up rows) and share one
    global scale, the larger of the two, as read_layer does for q/k/v; down keeps its own.
    """
    return {e: _read_fused(reader, roles, (EXPERT_FUSED,), advance) for e, roles in sorted(layer_experts.items())}


def scale_tensors(layers: NvFp4Layers) -> set:
    """Names of every scale tensor the pairing uses."""
    names = set()
    entries = [e for layer in layers.layers for e in layer.values()]
    entries += [e for layer in layers.experts for roles in layer.values() for e in roles.values()]
    for entry in entries:
        names.update((entry.block_scale.name, entry.global_scale.name))
    return names


def resident_bytes(info, dense_bytes_per_weight: int, packed: bool) -> int:
    """Bytes of weights once loaded: NVFP4 projections packed (cuda-native), or dequantized (torch)."""
    total = 0
    for t in info.tensors:
        suffix = t.name.rsplit(".", 1)[-1]
        kind = tensor_format(info.quant_scheme, t)[0]
        if suffix in ("input_scale", "input_global_scale"):
            continue
        if kind == "nvfp4":
            n, k = logical_shape(t)
            total += t.bytes + n * (k // nvfp4.BLOCK) + 4 if packed else n * k * dense_bytes_per_weight
        elif suffix not in SCALE_SUFFIXES:
            total += t.numel * dense_bytes_per_weight
    return total
