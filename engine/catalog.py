"""The tensor catalog: which checkpoint tensor plays which role in which layer.

Checkpoint names differ between families and formats; the catalog maps them onto one vocabulary
of roles (q, k, v, o, gate, up, down, norms, experts, router, quantization scales), and records what
is missing or unexpected. NVFP4 scales sit beside their weight: `scales` for a layer's own projections
(the shared expert's included), `expert_scales` per routed expert. Loaders walk the catalog, never the raw names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .checkpoint import DecoderConfig, TensorInfo

# Global roles: checkpoint name -> role
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "embed",
    "model.norm.weight": "final_norm",
    "lm_head.weight": "lm_head",
}

# Per-layer roles: suffix after "model.layers.{i}." -> role
LAYER_SUFFIXES = {
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "mlp_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "self_attn.q_proj.bias": "q_bias",
    "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
    "mlp.gate.weight": "router",                      # Qwen-MoE router
    "block_sparse_moe.gate.weight": "router",         # Mixtral router
    "mlp.shared_expert_gate.weight": "shared_expert_router",   # Qwen2-MoE: [1, H], sigmoid gate of the shared expert
}
_EXPERT = re.compile(r"^(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_EXPERT_ROLE = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
# Qwen2-MoE's always-on expert: roles shared_gate, shared_up, shared_down
_SHARED_EXPERT = re.compile(r"^mlp\.shared_expert\.(gate_proj|up_proj|down_proj)\.weight$")
# NVFP4 scales sit beside the weight they scale (ModelOpt: weight_scale_2, input_scale;
# compressed-tensors: weight_global_scale, input_global_scale, and the weight itself is weight_packed).
_SCALE = re.compile(r"^(.*)\.(weight_scale_2|weight_scale|input_scale|weight_global_scale|input_global_scale)$")
_PACKED = re.compile(r"^(.*)\.weight_packed$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _is_weight_name(rest: str) -> bool:
    return rest in LAYER_SUFFIXES or bool(_EXPERT.match(rest) or _SHARED_EXPERT.match(rest))


@dataclass
class LayerEntry:
    roles: dict = field(default_factory=dict)          # role -> TensorInfo
    experts: dict = field(default_factory=dict)        # expert index -> {role: TensorInfo}
    scales: dict = field(default_factory=dict)         # "q.weight_scale", "shared_up.weight_scale_2" etc. -> TensorInfo
    expert_scales: dict = field(default_factory=dict)  # expert index -> {"gate.weight_scale" etc.: TensorInfo}


@dataclass
class TensorCatalog:
    globals: dict                      # role -> TensorInfo
    layers: list                       # [LayerEntry]
    unexpected: list                   # names that fit no role
    missing: list                      # "layer 3: k" etc.

    @classmethod
    def build(cls, decoder: DecoderConfig, tensors: list[TensorInfo]) -> "TensorCatalog":
        globals_: dict = {}
        layers = [LayerEntry() for _ in range(decoder.num_layers)]
        unexpected = []
        for t in tensors:
            role = GLOBAL_NAMES.get(t.name)
            if role:
                globals_[role] = t
                continue
            m = _LAYER.match(t.name)
            if not m or int(m.group(1)) >= decoder.num_layers:
                unexpected.append(t.name)
                continue
            layer, rest = layers[int(m.group(1))], m.group(2)
            if (packed := _PACKED.match(rest)) and _is_weight_name(packed.group(1) + ".weight"):
                rest = packed.group(1) + ".weight"      # a compressed-tensors NVFP4 weight plays the same role
            scale = _SCALE.match(rest)
            if scale and scale.group(1) + ".weight" in LAYER_SUFFIXES:
                base = LAYER_SUFFIXES[scale.group(1) + ".weight"]
                layer.scales[f"{base}.{scale.group(2)}"] = t
            elif rest in LAYER_SUFFIXES:
                layer.roles[LAYER_SUFFIXES[rest]] = t
            elif (e := _EXPERT.match(rest)):
                layer.experts.setdefault(int(e.group(1)), {})[_EXPERT_ROLE[e.group(2)]] = t
            elif (s := _SHARED_EXPERT.match(rest)):
                layer.roles["shared_" + _EXPERT_ROLE[s.group(1)]] = t
            elif scale and (e := _EXPERT.match(scale.group(1) + ".weight")):
                layer.expert_scales.setdefault(int(e.group(1)), {})[
                    f"{_EXPERT_ROLE[e.group(2)]}.{scale.group(2)}"] = t
            elif scale and (s := _SHARED_EXPERT.match(scale.group(1) + ".weight")):
                layer.scales[f"shared_{_EXPERT_ROLE[s.group(1)]}.{scale.group(2)}"] = t
            else:
                unexpected.append(t.name)
        for i, layer in enumerate(layers):      # experts past num_experts belong to another config
            for e in [e for e in layer.experts if e >= decoder.num_experts]:
                unexpected += [t.name for t in layer.experts.pop(e).values()]
            for e in [e for e in layer.expert_scales if e >= decoder.num_experts]:
                unexpected += [t.name for t in layer.expert_scales.pop(e).values()]
        catalog = cls(globals_, layers, unexpected, [])
        catalog.missing = catalog._missing(decoder)
        return catalog

    def _missing(self, decoder: DecoderConfig) -> list[str]:
        missing = [r for r in ("embed", "final_norm") if r not in self.globals]
        if not decoder.tie_word_embeddings and "lm_head" not in self.globals and "embed" not in self.globals:
            missing.append("lm_head")
        for i, layer in enumerate(self.layers):
            needed = ["attn_norm", "mlp_norm", "q", "k", "v", "o"]
            if decoder.qk_norm:
                needed += ["q_norm", "k_norm"]
            if decoder.attention_bias:
                needed += ["q_bias", "k_bias", "v_bias"]
            if decoder.moe is not None and decoder.moe.is_moe_layer(i):
                needed += ["router"]
                if decoder.moe.has_shared_expert:
                    needed += ["shared_gate", "shared_up", "shared_down", "shared_expert_router"]
                for e in range(decoder.num_experts):
                    have = layer.experts.get(e, {})
                    missing += [f"layer {i}: expert {e} {r}" for r in ("gate", "up", "down") if r not in have]
            else:       # a dense layer, also inside a hybrid MoE stack
                needed += ["gate", "up", "down"]
            missing += [f"layer {i}: {r}" for r in needed if r not in layer.roles]
        return missing

    @property
    def tied(self) -> bool:
        return "lm_head" not in self.globals

    def lm_head(self) -> TensorInfo:
        return self.globals.get("lm_head") or self.globals["embed"]

    def role_counts(self) -> dict:
        counts: dict = {}
        for layer in self.layers:
            for role in layer.roles:
                counts[role] = counts.get(role, 0) + 1
            for experts in layer.experts.values():
                for role in experts:
                    counts["expert_" + role] = counts.get("expert_" + role, 0) + 1
            scales = len(layer.scales) + sum(len(x) for x in layer.expert_scales.values())
            if scales:
                counts["scale"] = counts.get("scale", 0) + scales
        return counts

    def to_dict(self) -> dict:
        return {
            "globals": {role: t.name for role, t in self.globals.items()},
            "layer_roles": self.role_counts(),
            "layers": len(self.layers),
            "unexpected": list(self.unexpected),
            "missing": list(self.missing),
        }
