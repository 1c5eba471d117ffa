"""GPU test helpers: every test here is marked cuda and skips cleanly without a GPU or the extension."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def _gpu_reason() -> str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    from engine.backends import cuda_native

    ok, reason = cuda_native.available()
    if not ok:
        return reason
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return ""


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "cuda" in item.keywords and Path(str(item.fspath)).parent == Path(__file__).parent:
            if reason is None:
                reason = _gpu_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"no GPU engine here: {reason}"))


@pytest.fixture(scope="session")
def model_dir(synth):
    """model_dir(shape) -> a synthetic checkpoint: from $HEARTH_CUDA_MODELS/<shape> when the GPU
    script made it there (fast, on the GPU), else written now."""
    root = os.environ.get("HEARTH_CUDA_MODELS")

    def get(shape: str) -> Path:
        if root and (Path(root) / shape / "config.json").exists():
            return Path(root) / shape
        if shape in ("llama3.1-8b", "qwen3-8b"):
            pytest.skip(f"{shape} is only tested where the GPU script generated it")
        return synth(shape)

    return get


@pytest.fixture(scope="session")
def plan_then_load():
    """plan_then_load(path, context) -> (MemoryPlan, bytes the load took): the native plan at the
    default resident sessions, then a load (device memory free before minus free after, torch's
    CUDA context already up; the runner closed again)."""
    import gc

    import torch

    from engine.backends import cuda_native
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect
    from engine.plan import DEFAULT_RESIDENT_SESSIONS, MemoryPlan

    def measure(path, context):
        info = inspect(path)
        raw = cuda_native.memory_plan(info, context, 8, DEFAULT_RESIDENT_SESSIONS, "fast")
        plan = MemoryPlan.from_native(info.decoder, raw, context, 16, DEFAULT_RESIDENT_SESSIONS, 0, "fast")
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free_before = torch.cuda.mem_get_info()[0]
        runner = cuda_native.load_runner(info, info.plan, RunnerOptions(context_length=context, max_batch=8,
                                                                         kv_blocks=plan.kv_blocks))
        try:
            torch.cuda.synchronize()
            return plan, free_before - torch.cuda.mem_get_info()[0]
        finally:
            runner.close()
            gc.collect()

    return measure
