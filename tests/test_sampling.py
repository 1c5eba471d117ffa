"""Sampling: exact kept sets on fixed logits, greedy equivalences, seeded reproducibility."""
import math

import pytest
import torch

from engine.sampling import (GREEDY, SamplerState, SamplingParams, allowed_tokens, filtered_probabilities,
                             sample_token, step_uniform)

# probabilities at temperature 1: 0.4, 0.3, 0.15, 0.1, 0.05
PROBS = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15], dtype=torch.float64)
LOGITS = PROBS.log().float()


def test_greedy_settings_pick_argmax():
    logits = torch.randn(1000)
    best = int(torch.argmax(logits))
    for params in (GREEDY, SamplingParams(temperature=0.9, top_k=1), SamplingParams(temperature=0, top_p=0.5)):
        assert allowed_tokens(logits, params) == {best}
        assert sample_token(logits, SamplerState.start(params)) == best


@pytest.mark.parametrize("top_k,expected", [(1, {1}), (2, {1, 3}), (3, {1, 3, 4}), (5, {0, 1, 2, 3, 4})])
def test_top_k_sets(top_k, expected):
    assert allowed_tokens(LOGITS, SamplingParams(temperature=1.0, top_k=top_k)) == expected


@pytest.mark.parametrize("top_p,expected", [
    (0.3, {1}),            # 0.4 alone covers 0.3
    (0.39, {1}),
    (0.41, {1, 3}),        # 0.4 alone falls short of 0.41
    (0.69, {1, 3}),        # 0.4 + 0.3 reaches it
    (0.71, {1, 3, 4}),
    (0.9, {1, 3, 4, 2}),
    (1.0, {0, 1, 2, 3, 4}),
])
def test_top_p_sets(top_p, expected):
    assert allowed_tokens(LOGITS, SamplingParams(temperature=1.0, top_p=top_p)) == expected


@pytest.mark.parametrize("min_p,expected", [(0.5, {1, 3}), (0.24, {1, 3, 2, 4}), (0.76, {1}), (0.1, {0, 1, 2, 3, 4})])
def test_min_p_sets(min_p, expected):
    # thresholds: 0.5*0.4=0.2 keeps 0.4,0.3 ; 0.24*0.4=0.096 keeps down to 0.1 ; 0.76*0.4=0.304 keeps 0.4
    assert allowed_tokens(LOGITS, SamplingParams(temperature=1.0, min_p=min_p)) == expected


def test_filters_compose_in_order():
    # top-k 4 drops 0.05, renormalised: 0.421, 0.316, 0.158, 0.105; top-p 0.7 then keeps {1, 3}
    assert allowed_tokens(LOGITS, SamplingParams(temperature=1.0, top_k=4, top_p=0.7)) == {1, 3}
    probs = filtered_probabilities(LOGITS, SamplingParams(temperature=1.0, top_k=4, top_p=0.7))
    assert math.isclose(float(probs[1]), 0.4 / 0.7, rel_tol=1e-6) and math.isclose(float(probs.sum()), 1.0)


def test_temperature_sharpens():
    cold = filtered_probabilities(LOGITS, SamplingParams(temperature=0.5))
    assert math.isclose(float(cold[1] / cold[3]), (0.4 / 0.3) ** 2, rel_tol=1e-6)


def test_repetition_penalty_follows_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(50)
    history = [3, 7, 7, 11, 40]
    ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([history]), logits[None].clone())[0]
    from engine.sampling import apply_repetition_penalty

    assert torch.allclose(apply_repetition_penalty(logits, history, 1.3), ref)


def test_seeded_sampling_is_reproducible_and_varies_with_seed():
    logits = torch.randn(5000) * 2
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)

    def run(p):
        state, out = SamplerState.start(p), []
        for _ in range(40):
            tok = sample_token(logits, state)
            out.append(tok)
            state.advance(tok)
        return out

    assert run(params) == run(params)
    assert run(params) != run(SamplingParams(temperature=1.0, top_p=0.95, seed=99))
    assert all(t in allowed_tokens(logits, params) for t in run(params))


def test_sampled_frequencies_follow_the_distribution():
    counts = torch.zeros(5)
    state = SamplerState.start(SamplingParams(temperature=1.0, seed=5))
    for _ in range(4000):
        counts[sample_token(LOGITS, state)] += 1
        state.step += 1
    assert torch.allclose(counts / counts.sum(), PROBS.float(), atol=0.03)


def test_uniform_is_stable_and_in_range():
    assert step_uniform(42, 0) == step_uniform(42, 0)
    draws = [step_uniform(7, i) for i in range(2000)]
    assert all(0.0 <= u < 1.0 for u in draws) and abs(sum(draws) / len(draws) - 0.5) < 0.03


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(min_p=2),
                                 dict(top_k=-1), dict(max_tokens=0), dict(repetition_penalty=0)])
def test_invalid_parameters_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
