"""Mixture-of-experts: which layers route, how they route, what that costs, and the reference math.

Four families, checked against transformers 5.24's modeling files (router = `mlp.gate`, [E, H]):

- Qwen3-MoE: layer i routes when i is not in `mlp_only_layers` and (i + 1) % `decoder_sparse_step`
  == 0. Softmax over all experts in fp32, top-k, renormalised when `norm_topk_prob`. Experts are
  `moe_intermediate_size` wide.
- Qwen2-MoE: the same, plus a shared expert (`shared_expert_intermediate_size`) on every token of
  a routed layer, scaled by sigmoid(x · `shared_expert_gate`) [1, H] and added to the experts'.
- Mixtral: every layer routes; top-k of the softmax then renormalised (the same as a softmax over
  the k logits). Experts are `intermediate_size` wide. Router `block_sparse_moe.gate`.
- OLMoE: every layer routes; softmax, top-k, renormalised only when `norm_topk_prob` (off in the
  released models). Experts are `intermediate_size` wide. (Its q / k norms span the whole
  projection: see `DecoderConfig.qk_norm_whole_projection`.)

Layers that do not route are dense SwiGLU MLPs of `intermediate_size` (the "hybrid" stack).
On disk every expert is its own tensor (`mlp.experts.{e}.{gate,up,down}_proj.weight`, Mixtral
`block_sparse_moe.experts.{e}.{w1,w3,w2}.weight`); transformers 5 stacks them only in memory.

This module never imports the checkpoint or catalog modules (they import it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional


# model_type -> how its config spells the MoE settings
_SHARED_EXPERT_FAMILIES = ("qwen2_moe",)
_ALWAYS_RENORMALISED = ("mixtral",)
_LAYER_RULE_FAMILIES = ("qwen2_moe", "qwen3_moe")        # mlp_only_layers / decoder_sparse_step
_EXPERT_FFN_IS_INTERMEDIATE = ("mixtral", "olmoe")        # no moe_intermediate_size: experts use intermediate_size

# Config keys that announce a router Hearth does not implement (DeepSeek-style grouped or sigmoid
# scoring, score correction biases, scaled routed outputs) and what to tell the user.
_OTHER_ROUTERS = {
    "scoring_func": "a '{value}' router scoring function (Hearth routes with a softmax)",
    "topk_method": "the '{value}' top-k method",
    "n_group": "grouped expert routing (n_group = {value})",
    "topk_group": "grouped expert routing (topk_group = {value})",
    "routed_scaling_factor": "a routed scaling factor of {value}",
    "moe_router_bias": "a router bias",
}


@dataclass(frozen=True)
class MoeLayout:
    """How a mixture-of-experts decoder routes, from its config.json."""
    num_experts: int
    top_k: int
    expert_intermediate_size: int      # each routed expert's SwiGLU width
    normalize_top_k: bool              # divide the k selected probabilities by their sum
    decoder_sparse_step: int = 1       # layer i routes when (i + 1) % step == 0 ...
    mlp_only_layers: tuple = ()        # ... and i is not listed here
    shared_expert_intermediate_size: int = 0   # Qwen2-MoE: one always-on expert, 0 = none
    shared_expert_gated: bool = False  # its output scaled by sigmoid(x · shared_expert_gate)
    router: str = "softmax-top-k"
    unsupported: str = ""              # why Hearth cannot run this variant ("" = it can)

    def is_moe_layer(self, i: int) -> bool:
        return i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0

    def moe_layer_count(self, num_layers: int) -> int:
        return sum(self.is_moe_layer(i) for i in range(num_layers))

    @property
    def has_shared_expert(self) -> bool:
        return self.shared_expert_intermediate_size > 0

    def describe(self, num_layers: int, experts: str = "", shared: str = "") -> str:
        """What a user reads: "MoE SwiGLU, 128 experts, top-8 (renormalised), every layer".

        `experts` / `shared` qualify the weight format (`weight_formats`): "MoE SwiGLU, 128 NVFP4
        experts, ...", "8 experts (NVFP4 gate, up; 16-bit down)", "a sigmoid-gated NVFP4 shared expert".
        """
        routed = self.moe_layer_count(num_layers)
        norm = "renormalised" if self.normalize_top_k else "not renormalised"
        if experts.startswith("("):
            text = f"MoE SwiGLU, {self.num_experts} experts {experts}, top-{self.top_k} ({norm})"
        else:
            text = f"MoE SwiGLU, {self.num_experts} {experts + ' ' if experts else ''}experts, top-{self.top_k} ({norm})"
        if self.has_shared_expert:
            kind = f"{shared} shared expert" if shared else "shared expert"
            text += f", a sigmoid-gated {kind}" if self.shared_expert_gated else f", a {kind}"
        if routed == num_layers:
            return text + ", every layer"
        return text + f", {routed} of {num_layers} layers (the rest dense SwiGLU)"


def layout_from_hf(text: dict, num_layers: int) -> Optional[MoeLayout]:
    """The routing layout of a Hugging Face (text) config, or None for a dense decoder."""
    experts = int(text.get("num_experts") or text.get("num_local_experts") or text.get("n_routed_experts") or 0)
    if experts <= 0:
        return None
    model_type = str(text.get("model_type") or "")
    if model_type in _EXPERT_FFN_IS_INTERMEDIATE:
        ffn = int(text.get("intermediate_size") or 0)
    else:
        ffn = int(text.get("moe_intermediate_size") or text.get("intermediate_size") or 0)
    step, dense_layers = 1, ()
    if model_type in _LAYER_RULE_FAMILIES:
        step = int(text.get("decoder_sparse_step") or 1)
        dense_layers = tuple(sorted(int(i) for i in (text.get("mlp_only_layers") or ())))
    shared = int(text.get("shared_expert_intermediate_size") or 0) if model_type in _SHARED_EXPERT_FAMILIES else 0
    layout = MoeLayout(
        num_experts=experts,
        top_k=int(text.get("num_experts_per_tok") or 0),
        expert_intermediate_size=ffn,
        normalize_top_k=True if model_type in _ALWAYS_RENORMALISED else bool(text.get("norm_topk_prob", False)),
        decoder_sparse_step=step,
        mlp_only_layers=dense_layers,
        shared_expert_intermediate_size=shared,
        shared_expert_gated=shared > 0,
    )
    return replace(layout, unsupported=unsupported_reason(text, layout, num_layers))


def unsupported_reason(text: dict, layout: MoeLayout, num_layers: int) -> str:
    """Why Hearth cannot run this MoE config, or "" when it can."""
    for key, what in _OTHER_ROUTERS.items():
        value = text.get(key)
        if value in (None, False, "softmax", "greedy") or (key == "routed_scaling_factor" and float(value) == 1.0):
            continue
        return f"This checkpoint uses {what.format(value=value)}, which Hearth does not implement."
    if int(text.get("ep_size") or 1) > 1:
        return (f"This checkpoint is laid out for expert parallelism over {text['ep_size']} devices (ep_size); "
                "Hearth runs every expert on one device.")
    if not 0 < layout.top_k <= layout.num_experts:
        return (f"config.json routes each token to {layout.top_k} of {layout.num_experts} experts; "
                "that needs between 1 and the number of experts.")
    if layout.expert_intermediate_size <= 0:
        return "config.json gives no expert feed-forward size (moe_intermediate_size)."
    if layout.decoder_sparse_step <= 0:
        return f"config.json has decoder_sparse_step = {layout.decoder_sparse_step}; it must be at least 1."
    if any(not 0 <= i < num_layers for i in layout.mlp_only_layers):
        return f"config.json lists mlp_only_layers {list(layout.mlp_only_layers)} outside its {num_layers} layers."
    if text.get("use_sliding_window") or (text.get("model_type") == "mixtral" and text.get("sliding_window")):
        return "This MoE checkpoint uses sliding-window attention, which Hearth's MoE decoders do not implement."
    if text.get("model_type") == "olmoe" and text.get("attention_bias"):
        return "This OLMoE checkpoint carries attention biases (o_proj included), which Hearth does not implement."
    if text.get("clip_qkv") is not None:
        return f"This checkpoint clips q, k and v to ±{text['clip_qkv']} (clip_qkv), which Hearth does not implement."
    if str(text.get("hidden_act") or "silu") != "silu":
        return f"The experts use the '{text['hidden_act']}' activation; Hearth's experts are SwiGLU (silu)."
    return ""


# ------------------------------------------------------------------------------------ parameters

def logical_numel(t) -> int:
    """Weights a tensor holds: a packed NVFP4 weight (U8 [N, K/2]) holds two per byte."""
    return 2 * t.numel if t.dtype == "U8" and len(t.shape) == 2 else t.numel


def weight_formats(catalog) -> tuple[str, str]:
    """(experts, shared expert) qualifiers for `MoeLayout.describe`: "" when 16-bit, "NVFP4" when every
    such projection is packed NVFP4, else which roles are ("(NVFP4 gate, up; 16-bit down)")."""
    def qualify(tensors: dict) -> str:      # role -> [TensorInfo]
        packed = {r: sum(t.dtype == "U8" for t in ts) for r, ts in tensors.items()}
        if not any(packed.values()):
            return ""
        if all(packed[r] == len(tensors[r]) for r in tensors):
            return "NVFP4"
        full = [r for r in tensors if packed[r] == len(tensors[r])]
        part = [r for r in tensors if 0 < packed[r] < len(tensors[r])]
        rest = [r for r in tensors if not packed[r]]
        words = ([f"NVFP4 {', '.join(full)}"] if full else []) + ([f"partly NVFP4 {', '.join(part)}"] if part else [])
        return "(" + ", ".join(words) + (f"; 16-bit {', '.join(rest)}" if rest else "") + ")"

    experts: dict = {}
    shared: dict = {}
    for layer in catalog.layers:
        for roles in layer.experts.values():
            for role, t in roles.items():
                experts.setdefault(role, []).append(t)
        for role in ("shared_gate", "shared_up", "shared_down"):
            if role in layer.roles:
                shared.setdefault(role.removeprefix("shared_"), []).append(layer.roles[role])
    order = ("gate", "up", "down")
    experts = {r: experts[r] for r in order if r in experts}
    shared = {r: shared[r] for r in order if r in shared}
    return qualify(experts), ("partly NVFP4" if qualify(shared).startswith("(") else qualify(shared))


def parameter_counts(layout: MoeLayout, catalog) -> tuple[int, int]:
    """(total, active per token) parameters of a MoE checkpoint, from its tensor catalog.

    Active = everything a token passes through: embeddings, attention, norms, routers, dense MLPs,
    the shared expert, and top_k of the num_experts routed experts in every MoE layer. The
    embedding and the lm_head both count, as model cards count them (30.5 B / 3.3 B for Qwen3-30B-A3B).
    Packed NVFP4 weights count both nibbles; their scales (not catalog roles) count nothing.
    """
    total = sum(logical_numel(t) for t in catalog.globals.values())     # tied: the embedding counts once
    active = total
    for layer in catalog.layers:
        dense = sum(logical_numel(t) for t in layer.roles.values())
        experts = [sum(logical_numel(t) for t in e.values()) for e in layer.experts.values()]
        total += dense + sum(experts)
        if experts:
            # the k largest, so a checkpoint with unequal experts never under-counts
            active += dense + sum(sorted(experts, reverse=True)[:layout.top_k])
        else:
            active += dense
    return total, active


# ------------------------------------------------------------------------------------ reference math

def route(h, router_weight, top_k: int, normalize: bool):
    """(weights [n, k], expert ids [n, k]) for rows h [n, hidden], as transformers routes.

    Softmax over all experts in fp32, then the k largest; Mixtral's "softmax over the top k" is the
    same as renormalising them. Ties resolve as torch.topk resolves them.
    """
    import torch

    logits = torch.nn.functional.linear(h, router_weight)
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(h.dtype), experts


@dataclass
class MoeWeights:
    """One MoE layer's weights in the fused layout (`moe_slot_shapes`): what transformers 5 holds in
    memory and what the native MoE block receives."""
    router: object                  # [E, H]
    gate_up: object                 # [E, 2I, H]: expert e's gate rows, then its up rows
    down: object                    # [E, H, I]
    shared_gate: object = None      # [S, H]
    shared_up: object = None        # [S, H]
    shared_down: object = None      # [H, S]
    shared_expert_router: object = None   # [1, H]: the shared expert's sigmoid gate


def feed_forward(h, w: MoeWeights, layout: MoeLayout):
    """The MoE block for rows h [n, hidden]: sum over the k routed experts of weight * SwiGLU_e(h),
    plus the (gated) shared expert. Reads only the experts some row selected."""
    import torch
    import torch.nn.functional as F

    weights, experts = route(h, w.router, layout.top_k, layout.normalize_top_k)
    out = torch.zeros_like(h)
    for e in torch.unique(experts).tolist():
        rows, slot = torch.where(experts == e)
        x = h[rows]
        gate, up = F.linear(x, w.gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w.down[e])
        out.index_add_(0, rows, y * weights[rows, slot, None])
    if w.shared_gate is not None:
        shared = F.linear(F.silu(F.linear(h, w.shared_gate)) * F.linear(h, w.shared_up), w.shared_down)
        if w.shared_expert_router is not None:
            shared = torch.sigmoid(F.linear(h, w.shared_expert_router)) * shared
        out = out + shared
    return out


# ------------------------------------------------------------------------------------ the native block's layout

def moe_slot_shapes(decoder) -> dict:
    """slot -> shape of each fused per-layer weight a MoE layer needs (row-major, the checkpoint dtype)."""
    moe = decoder.moe
    h, i, e, s = decoder.hidden_size, moe.expert_intermediate_size, moe.num_experts, moe.shared_expert_intermediate_size
    shapes = {"moe_router": (e, h), "moe_gate_up": (e, 2 * i, h), "moe_down": (e, h, i)}
    if moe.has_shared_expert:
        shapes.update(moe_shared_gate_up=(2 * s, h), moe_shared_down=(h, s), moe_shared_expert_gate=(1, h))
    return shapes


def moe_placements(decoder, catalog) -> list:
    """(slot, layer, TensorInfo, element offset) for every MoE-layer tensor, fused slots filled part
    by part, as `backends/cuda_native._placements` lists the dense ones.

    moe_gate_up [E, 2I, H]: expert e's gate (w1) at e*2I*H, its up (w3) at e*2I*H + I*H, the order
    transformers 5 concatenates them in. moe_down [E, H, I]: expert e at e*H*I. The shared expert's
    gate / up fuse like a dense layer's (gate rows first).
    """
    moe = decoder.moe
    h, i, s = decoder.hidden_size, moe.expert_intermediate_size, moe.shared_expert_intermediate_size
    out = []
    for n, entry in enumerate(catalog.layers):
        if not moe.is_moe_layer(n):
            continue
        out.append(("moe_router", n, entry.roles["router"], 0))
        for e in range(moe.num_experts):
            x = entry.experts[e]
            out += [("moe_gate_up", n, x["gate"], e * 2 * i * h), ("moe_gate_up", n, x["up"], e * 2 * i * h + i * h),
                    ("moe_down", n, x["down"], e * h * i)]
        if moe.has_shared_expert:
            out += [("moe_shared_gate_up", n, entry.roles["shared_gate"], 0),
                    ("moe_shared_gate_up", n, entry.roles["shared_up"], s * h),
                    ("moe_shared_down", n, entry.roles["shared_down"], 0),
                    ("moe_shared_expert_gate", n, entry.roles["shared_expert_router"], 0)]
    return out
