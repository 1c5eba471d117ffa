"""The contract every backend implements: a ModelRunner owns one resident model.

A runner holds the weights and the KV cache of every sequence of that model. Sequences are small
integer handles. The engine facade (engine/engine.py) turns chat sessions into sequences; runners
know nothing about sessions, tokenizers or templates.

Positions: a sequence holds `length(seq)` tokens in its KV cache. `prefill` appends tokens and leaves
the logits of its last token; `decode` appends one token to each of several sequences. `sample`
draws one token per row of the last logits (on the device for cuda-native), so only token ids cross
back to the host.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..sampling import SamplerState


@dataclass(frozen=True)
class RunnerOptions:
    context_length: int          # the longest sequence the runner must hold
    kv_block_size: int = 16      # tokens per KV block (paged backends)
    kv_blocks: int = 0           # the KV pool's blocks (the memory plan's); 0 = the native default
    max_batch: int = 8           # most sequences decoded together
    compute_dtype: str = "float32"  # torch backend: float32 or bfloat16
    # How the torch backend stores K and V: "auto" = the compute dtype. "bfloat16" stores them as
    # cuda-native does, so the reference computes in fp32 over the engine's own cache format.
    kv_dtype: str = "auto"
    # cuda-native: "fast" (scaled fp16 weights and activations, one product per projection) or
    # "exact" (bf16 weights, fp32 activations as two bf16 products). The torch backend ignores it.
    precision: str = "fast"
    # cuda-native: prompt tokens per forward pass (the workspace's rows). 2,048 against 512 measured
    # +6 % / +19 % / +51 % prefill of 2,048 tokens (8B / 1B / 135M, H200, 2026-12-03) for +0.42 GB
    # of workspace on the 8B.
    prefill_chunk: int = 2048


class ModelRunner(ABC):
    backend_name: str = "?"

    @abstractmethod
    def allocate_sequence(self) -> int: ...

    @abstractmethod
    def release_sequence(self, seq: int) -> None: ...

    @abstractmethod
    def length(self, seq: int) -> int: ...

    @abstractmethod
    def truncate(self, seq: int, length: int) -> None:
        """Forget every cached token from position `length` on."""

    @abstractmethod
    def prefill(self, seq: int, token_ids: Sequence[int]) -> None:
        """Append tokens to the sequence; keep the logits of the last one as row 0."""

    @abstractmethod
    def decode(self, seqs: Sequence[int], token_ids: Sequence[int]) -> None:
        """Append one token to each sequence; keep their logits as rows in that order."""

    @abstractmethod
    def sample(self, states: Sequence[SamplerState]) -> list[int]:
        """One token per row of the last logits. Does not advance the states."""

    def decode_and_sample(self, seqs: Sequence[int], token_ids: Sequence[int],
                          states: Sequence[SamplerState]) -> list[int]:
        """One whole decode step: feed one token per sequence and sample the next.

        The scheduler calls this once per step. A backend may override it to run the step in one
        native call (graph replay, device sampling, one token id per sequence read back).
        """
        self.decode(seqs, token_ids)
        return self.sample(states)

    @abstractmethod
    def last_logits(self) -> np.ndarray:
        """float32 [rows, vocab] of the last prefill or decode (tests and scoring)."""

    @abstractmethod
    def score(self, token_ids: Sequence[int]) -> np.ndarray:
        """Teacher-forced float32 logits [len, vocab]; touches no sequence."""

    def memory(self) -> dict:
        """Bytes used by weights and KV cache, and KV blocks free / total where paged."""
        return {}

    @abstractmethod
    def close(self) -> None:
        """Free every resource; the runner is unusable afterwards."""
