"""The memory plan's promise on the GPU: what the plan shows before a load is what the load takes
(device memory before and after the load, torch's CUDA context already up), within 3 % and never
above it by more than 64 MiB, for the 135M / 1B / 8B shapes at two context lengths."""
from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

MiB = 1024 ** 2


@pytest.mark.parametrize("context", [4096, 32768])
@pytest.mark.parametrize("shape", ["smollm2-135m", "llama3.2-1b", "llama3.1-8b"])
def test_load_takes_what_the_plan_says(shape, context, model_dir, record_property):
    from engine.backends import cuda_native
    from engine.backends.base import RunnerOptions
    from engine.checkpoint import inspect
    from engine.plan import DEFAULT_RESIDENT_SESSIONS, MemoryPlan

    info = inspect(model_dir(shape))
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
        took = free_before - torch.cuda.mem_get_info()[0]
        ratio = took / plan.total_bytes
        print(f"\n[{shape} ctx {context}] plan {plan.total_bytes / MiB:,.0f} MiB, the load took {took / MiB:,.0f} MiB "
              f"(x{ratio:.3f}; {(took - plan.total_bytes) / MiB:+,.0f} MiB); parts "
              + ", ".join(f"{name} {n / MiB:,.0f}" for name, n in plan.breakdown()))
        record_property("plan_bytes", plan.total_bytes)
        record_property("took_bytes", took)
        assert abs(took - plan.total_bytes) <= 0.03 * plan.total_bytes
        assert took <= plan.total_bytes + 64 * MiB
    finally:
        runner.close()
        gc.collect()
