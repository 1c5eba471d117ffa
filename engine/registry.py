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
    qk_norm: bool = False     # Qwen3 RMS-normalizes q and k per head (OLMoE over the whole projection)


ARCHITECTURES = {
    "LlamaForCausalLM": Family("Llama", "dense-swiglu"),          # Llama 2, 3, 3.1, 3.2; SmolLM2
    "MistralForCausalLM": Family("Mistral", "dense-swiglu"),
    "Qwen2ForCausalLM": Family("Qwen2", "dense-swiglu", qkv_bias=True),
    "Qwen3ForCausalLM": Family("Qwen3", "dense-swiglu", qk_norm=True),
    # Mixture-of-experts (engine/moe.py has each family's layer rule and router)
    "Qwen3MoeForCausalLM": Family("Qwen3-MoE", "moe", qk_norm=True),   # Qwen3-30B-A3B, Qwen3-235B-A22B
    "Qwen2MoeForCausalLM": Family("Qwen2-MoE", "moe", qkv_bias=True),  # Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B
    "MixtralForCausalLM": Family("Mixtral", "moe"),                    # Mixtral 8x7B, 8x22B
    "OlmoeForCausalLM": Family("OLMoE", "moe", qk_norm=True),          # OLMoE-1B-7B
}

# Archetypes each backend runs today: the torch reference runs both; cuda-native refuses MoE until
# its native block exists (backends/cuda_native.py).
RUNNABLE_ARCHETYPES = ("dense-swiglu", "moe")


def family_for(architecture: str) -> Family:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES))
        what = architecture or "no architecture (config.json has no 'architectures')"
        raise UnsupportedArchitecture(
            f"{what} is not supported. Hearth runs: {supported}.") from None
