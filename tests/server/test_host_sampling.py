"""Which sampler a step takes on a device-sampling backend: an observed reply (logprobs) reads the logits
back and samples on the host; a constrained one does too where the device sampler takes no token mask,
and goes to the device with its mask words where it does (cuda-native). Shown with runners that sample
"on the device" (always token 7, or the largest allowed id under the mask words they are given) and
expose their logits, so which path ran is visible in the tokens."""
from __future__ import annotations

import threading

import numpy as np
import torch

from engine.sampling import SamplerState, SamplingParams
from engine.scheduler import ModelLoop, Request

VOCAB = 16


class DeviceSamplingRunner:
    backend_name = "cuda-native"

    def __init__(self):
        self.logits = np.zeros((1, VOCAB), dtype=np.float32)
        self.device_steps = 0

    def prefill(self, seq, tokens):
        self.logits = np.tile(np.arange(VOCAB, dtype=np.float32), (1, 1))   # argmax: the last id

    def decode(self, seqs, tokens):
        self.logits = np.tile(np.arange(VOCAB, dtype=np.float32), (len(seqs), 1))

    def sample(self, states):
        self.device_steps += 1
        return [7] * len(states)

    def decode_and_sample(self, seqs, tokens, states):
        self.decode(seqs, tokens)
        return self.sample(states)

    def last_logits(self):
        return self.logits


class OnlyEvenTokens:
    def __init__(self):
        self.seen = []

    def allowed_mask(self, vocab_size):
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[0::2] = True
        return mask

    def advance(self, token):
        self.seen.append(token)


def _request(seq, constraint=None, observer=None, max_tokens=3):
    state = SamplerState.start(SamplingParams(temperature=0, max_tokens=max_tokens))
    state.constraint, state.observer = constraint, observer
    return Request(seq=seq, prompt=[1, 2], state=state, max_tokens=max_tokens, eos_ids=frozenset({99}),
                   context_limit=100, start_length=0)


def _tokens(r):
    out = []
    while True:
        kind, value = r.events.get(timeout=10)
        if kind != "token":
            return out
        out.append(value)


def test_constrained_and_observed_rows_sample_on_the_host_others_on_the_device():
    runner = DeviceSamplingRunner()
    loop = ModelLoop(runner, threading.RLock(), max_batch=4)
    try:
        plain = loop.submit(_request(1))
        assert _tokens(plain) == [7, 7, 7]                       # the device sampler's choice
        constraint = OnlyEvenTokens()
        constrained = loop.submit(_request(2, constraint=constraint))
        assert _tokens(constrained) == [14, 14, 14]              # the largest even id: masked on the host
        assert constraint.seen == [14, 14, 14]
        seen = []
        observed = loop.submit(_request(3, observer=lambda logits, token: seen.append((logits.shape, token))))
        assert _tokens(observed) == [15, 15, 15]                 # unmasked argmax, sampled on the host
        assert seen == [((VOCAB,), 15)] * 3
    finally:
        loop.close()


class DeviceMaskingRunner(DeviceSamplingRunner):
    """Takes token masks as cuda-native's sampler does: mask words in the sampling call."""
    device_masks = True

    def sample(self, states):
        from engine.sampling import mask_words

        self.device_steps += 1
        out = []
        for st in states:
            words = mask_words(st.constraint, VOCAB) if st.constraint is not None else None
            if words is None:
                out.append(7)
                continue
            allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:VOCAB])
            out.append(int(allowed.max()))
        return out


def test_a_device_that_takes_masks_samples_constrained_rows_itself():
    runner = DeviceMaskingRunner()
    loop = ModelLoop(runner, threading.RLock(), max_batch=4)
    try:
        constraint = OnlyEvenTokens()
        constrained = loop.submit(_request(2, constraint=constraint))
        assert _tokens(constrained) == [14, 14, 14] and constraint.seen == [14, 14, 14]
        assert runner.device_steps == 3                          # every step on the device
        seen = []
        observed = loop.submit(_request(3, observer=lambda logits, token: seen.append(token)))
        assert _tokens(observed) == [15, 15, 15] and runner.device_steps == 3   # logprobs: the host
    finally:
        loop.close()
