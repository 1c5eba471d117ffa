"""The memory plan's promise on the GPU: what the plan shows before a load is what the load takes
(device memory before and after the load, torch's CUDA context already up), within 3 % and never
above it by more than 64 MiB, for the 135M / 1B / 8B shapes at two context lengths."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cuda

MiB = 1024 ** 2


@pytest.mark.parametrize("context", [4096, 32768])
@pytest.mark.parametrize("shape", ["smollm2-135m", "llama3.2-1b", "llama3.1-8b"])
def test_load_takes_what_the_plan_says(shape, context, model_dir, plan_then_load, record_property):
    plan, took = plan_then_load(model_dir(shape), context)
    ratio = took / plan.total_bytes
    print(f"\n[{shape} ctx {context}] plan {plan.total_bytes / MiB:,.0f} MiB, the load took {took / MiB:,.0f} MiB "
          f"(x{ratio:.3f}; {(took - plan.total_bytes) / MiB:+,.0f} MiB); parts "
          + ", ".join(f"{name} {n / MiB:,.0f}" for name, n in plan.breakdown()))
    record_property("plan_bytes", plan.total_bytes)
    record_property("took_bytes", took)
    assert abs(took - plan.total_bytes) <= 0.03 * plan.total_bytes
    assert took <= plan.total_bytes + 64 * MiB
