"""Which `architectures` names Hearth runs, and how.

One greppable table: a Hugging Face architecture name -> the family that implements it. An unknown
name is refused with the list of what is supported.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import UnsupportedArchitecture


@dataclass(frozen=True)
class Family:
    name: str                 # what a user reads: "Llama", "Qwen3"
    archetype: str            # "dense-swiglu" or "moe"
    qkv_bias: bool = False    # Qwen2 carries biases on q/k/v
    qk_norm: bool = False     # Qwen3 RMS-normalizes q and k per head


ARCHITECTURES = {
    "LlamaForCausalLM": Family("Llama", "dense-swiglu"),          # Llama 2, 3, 3.1, 3.2; SmolLM2
    "MistralForCausalLM": Family("Mistral", "dense-swiglu"),
    "Qwen2ForCausalLM": Family("Qwen2", "dense-swiglu", qkv_bias=True),
    "Qwen3ForCausalLM": Family("Qwen3", "dense-swiglu", qk_norm=True),
    "Qwen3MoeForCausalLM": Family("Qwen3-MoE", "moe", qk_norm=True),
    "MixtralForCausalLM": Family("Mixtral", "moe"),
}

# Families whose weights the backends can run today (MoE is planned, not yet executed).
RUNNABLE_ARCHETYPES = ("dense-swiglu",)


def family_for(architecture: str) -> Family:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES))
        what = architecture or "no architecture (config.json has no 'architectures')"
        raise UnsupportedArchitecture(
            f"{what} is not supported. Hearth runs: {supported}.") from None
