"""Mixture of experts on a GPU machine, until the native MoE block exists: cuda-native refuses MoE
with its reason, and the torch reference on the GPU (fp32) matches the CPU reference per family."""
from __future__ import annotations

import numpy as np
import pytest

from engine import Engine, errors
from engine.backends.base import RunnerOptions
from engine.backends.torch_ref import load_runner
from engine.checkpoint import inspect

pytestmark = pytest.mark.cuda

MOE_SHAPES = ["tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-mixtral", "tiny-olmoe"]


def test_cuda_native_engine_refuses_moe_with_its_reason(synth, tmp_path):
    eng = Engine(backend="cuda-native", home=tmp_path)
    with pytest.raises(errors.UnsupportedArchitecture, match="mixture-of-experts.*--backend torch"):
        eng.load_model(synth("tiny-qwen3-moe", tokenizer=True))
    assert eng.loaded_models() == []


@pytest.mark.parametrize("shape", MOE_SHAPES)
def test_torch_reference_on_the_gpu_matches_the_cpu(synth, shape):
    info = inspect(synth(shape, seed=3))
    ids = np.random.RandomState(7).randint(0, info.decoder.vocab_size, 200).tolist()
    cpu = load_runner(info, info.plan, RunnerOptions(context_length=256)).score(ids)
    gpu = load_runner(info, info.plan, RunnerOptions(context_length=256), device="cuda").score(ids)
    assert float(np.linalg.norm(gpu - cpu) / np.linalg.norm(cpu)) <= 1e-4
