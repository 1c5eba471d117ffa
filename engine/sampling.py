"""Sampling parameters and the reference sampler (torch).

The filters apply in this order, each to the survivors of the one before, renormalized:
repetition penalty (on raw logits) -> temperature -> top-k -> top-p -> min-p. Temperature 0 or
top-k 1 is greedy (argmax, ties to the lowest id). A seeded draw at step `n` of a reply uses a
uniform number derived only from (seed, n), so the same seed always gives the same text.
The CUDA backend implements the same filters on the device (native/src/kernels/sampling.cu).
A `TokenConstraint` on the state (structured output, engine/constraints.py) masks the logits before
every filter, and an `observer` sees each step's logits and token (logprobs); such rows are sampled
here on the host on every backend (engine/scheduler.py).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import Callable, Optional, Protocol, Sequence


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 0             # 0 = off
    top_p: float = 1.0         # 1 = off
    min_p: float = 0.0         # 0 = off
    repetition_penalty: float = 1.0
    seed: Optional[int] = None  # None = a fresh random seed per reply
    max_tokens: int = 512
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def with_seed(self) -> "SamplingParams":
        """A copy with a concrete seed, so a reply can be reproduced from what was stored."""
        return self if self.seed is not None else replace(self, seed=secrets.randbits(31))

    def to_dict(self) -> dict:
        return {
            "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
            "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
            "seed": self.seed, "max_tokens": self.max_tokens, "stop": list(self.stop),
        }


GREEDY = SamplingParams(temperature=0.0)


class TokenConstraint(Protocol):
    """Which tokens may come next (a grammar); advanced with every token the sampler returns."""

    def allowed_mask(self, vocab_size: int):
        """A bool torch tensor [vocab_size] of the tokens allowed now, or None for no restriction."""

    def advance(self, token: int) -> None: ...


def mask_words(constraint: TokenConstraint, vocab_size: int):
    """The constraint's allowed tokens as a device sampler takes them: uint32 words [ceil(vocab / 32)],
    bit i % 32 of word i // 32 set where token i is allowed (None: no restriction). A constraint may
    give them itself (`allowed_bits`, e.g. the grammar's own bitmask), else its bool mask is packed."""
    import numpy as np

    own = getattr(constraint, "allowed_bits", None)
    if own is not None:
        return own(vocab_size)
    mask = constraint.allowed_mask(vocab_size)
    if mask is None:
        return None
    bits = np.zeros(-(-vocab_size // 32) * 32, dtype=bool)
    bits[:vocab_size] = np.asarray(mask.cpu() if hasattr(mask, "cpu") else mask, dtype=bool)[:vocab_size]
    return np.packbits(bits, bitorder="little").view("<u4").astype(np.uint32)


@dataclass
class SamplerState:
    """What one sequence's sampler carries between steps."""
    params: SamplingParams
    seed: int
    step: int = 0
    history: list[int] = field(default_factory=list)  # token ids the repetition penalty sees
    constraint: Optional[TokenConstraint] = None
    observer: Optional[Callable] = None        # observer(logits, token) after each draw (host sampling)

    @classmethod
    def start(cls, params: SamplingParams, history: Sequence[int] = ()) -> "SamplerState":
        params = params.with_seed()
        return cls(params=params, seed=int(params.seed), history=list(history))

    def advance(self, token: int) -> None:
        self.step += 1
        self.history.append(token)
        if self.constraint is not None:
            self.constraint.advance(token)


def step_uniform(seed: int, step: int) -> float:
    """The uniform draw in [0, 1) for (seed, step): a splitmix64 hash, identical on every platform."""
    z = (seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


def apply_repetition_penalty(logits, history: Sequence[int], penalty: float):
    """HF-style: a seen token's positive logit is divided by the penalty, a negative one multiplied."""
    if penalty == 1.0 or not history:
        return logits
    import torch

    logits = logits.clone()
    ids = torch.tensor(sorted(set(history)), dtype=torch.long, device=logits.device)
    seen = logits.index_select(-1, ids)
    logits.index_copy_(-1, ids, torch.where(seen > 0, seen / penalty, seen * penalty))
    return logits


def filtered_probabilities(logits, params: SamplingParams, history: Sequence[int] = ()):
    """Float64 probabilities over the vocabulary after every filter; zero outside the kept set.

    `logits` is a 1-D tensor. Greedy settings keep exactly the argmax.
    """
    import torch

    x = apply_repetition_penalty(logits.double(), history, params.repetition_penalty)
    if params.greedy:
        probs = torch.zeros_like(x)
        probs[int(torch.argmax(x))] = 1.0
        return probs
    probs = torch.softmax(x / params.temperature, dim=-1)
    if params.top_k and params.top_k < probs.numel():
        kth = torch.topk(probs, params.top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, 0) - sorted_probs  # mass strictly before each token
        keep_sorted = before < params.top_p
        keep = torch.zeros_like(keep_sorted)
        keep[order] = keep_sorted
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    if params.min_p > 0.0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    return probs


def allowed_tokens(logits, params: SamplingParams, history: Sequence[int] = ()) -> set[int]:
    """The token ids a sampler may return for these logits and parameters."""
    import torch

    probs = filtered_probabilities(logits, params, history)
    return set(torch.nonzero(probs > 0).flatten().tolist())


def sample_token(logits, state: SamplerState) -> int:
    """Draw one token from a 1-D logits tensor, advancing nothing (the caller advances state)."""
    token = _draw(logits, state)
    if state.observer is not None:             # e.g. the server's logprobs: sees the raw logits
        state.observer(logits, token)
    return token


def _draw(logits, state: SamplerState) -> int:
    import torch

    if state.constraint is not None:
        mask = state.constraint.allowed_mask(logits.numel())
        if mask is not None:
            logits = logits.masked_fill(~mask.to(logits.device), float("-inf"))
    probs = filtered_probabilities(logits, state.params, state.history)
    if state.params.greedy:
        return int(torch.argmax(probs))
    u = step_uniform(state.seed, state.step)
    cdf = torch.cumsum(probs, 0)
    index = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype)))
    index = min(index, probs.numel() - 1)
    while probs[index] == 0 and index > 0:  # rounding at the top of the CDF
        index -= 1
    return index
