"""The one memory plan (issue: what the plan shows before a load is what the load allocates): its
parts add up, follow the settings (context, resident sessions, precision, reserve), and the advice
names the change that makes a load fit. The GPU side (the load takes what the plan says) is in
tests/cuda/test_memory_plan_cuda.py."""
import pytest

from engine.checkpoint import inspect
from engine.plan import MemoryPlan

native = pytest.importorskip("engine._native")
if not hasattr(native, "plan_memory"):
    pytest.skip("the extension was built without the CUDA runtime", allow_module_level=True)

GiB = 1024 ** 3


@pytest.fixture(scope="module")
def info(default_model):
    return inspect(default_model.path)


def _plan(info, context=4096, sessions=4, precision="fast", reserve=GiB):
    from engine.backends import cuda_native

    raw = cuda_native.memory_plan(info, context, 8, sessions, precision)
    return raw, MemoryPlan.from_native(info.decoder, raw, context, 16, sessions, reserve, precision)


def test_parts_add_up(info):
    raw, plan = _plan(info)
    assert sum(raw["workspace"].values()) == raw["workspace_bytes"]
    assert plan.total_bytes == raw["total_bytes"]
    assert sum(n for _, n in plan.breakdown()) == plan.total_bytes
    assert plan.kv_bytes == raw["kv_bytes"]
    d = info.decoder
    assert plan.kv_bytes_per_token == d.kv_bytes_per_token(2)
    # weights: every tensor the engine keeps, 2 bytes an element (the lm_head shares the table if tied)
    assert plan.weight_bytes >= 2 * sum(t.numel for t in info.tensors) - 2 * d.vocab_size * d.hidden_size


def test_plan_follows_context_sessions_and_precision(info):
    _, base = _plan(info)
    _, long = _plan(info, context=8192)
    _, one = _plan(info, sessions=1)
    _, exact = _plan(info, precision="exact")
    per_context = -(-4096 // 16) * 16 * base.kv_bytes_per_token
    assert long.kv_bytes - base.kv_bytes == 4 * per_context
    assert base.kv_bytes - one.kv_bytes == 3 * per_context
    assert exact.weight_bytes == base.weight_bytes   # bf16 and fp16 are both 2 bytes
    parts = dict(exact.workspace_parts)
    assert parts["operand_split"] > 0 and "operand_fp16" in dict(base.workspace_parts)


def test_advice_names_what_to_change(info):
    _, plan = _plan(info, context=4096, sessions=4, reserve=GiB)
    free = plan.total_bytes + plan.reserve_bytes
    assert plan.fits(free).ok
    short = free - plan.kv_bytes // 2
    report = plan.fits(short)
    assert not report.ok
    assert "reduce the context to" in report.message and "resident instead of 4" in report.message
    ctx = plan.max_context_for(short)
    assert _plan(info, context=ctx)[1].fits(short).ok
    assert not plan.fits(plan.weight_bytes // 2).ok


def test_engine_plan_is_the_native_plan_on_cuda_native(info):
    """The engine shows the plan the runner then allocates (the same native function, same config)."""
    from engine.engine import Engine

    eng = Engine(backend="torch")
    eng.backend = "cuda-native"  # plan as the GPU engine would, without a GPU
    plan = eng.memory_plan(str(info.path), context_length=4096)
    assert plan.workspace_parts and plan.sessions == eng.resident_sessions
    assert plan.total_bytes == _plan(info, sessions=eng.resident_sessions)[1].total_bytes


def test_an_nvfp4_checkpoint_is_planned_packed(default_model, tmp_path):
    """cuda-native keeps NVFP4 projections packed: the plan's weights are the codes and block scales
    (resident_bytes(packed=True), up to the 256-byte alignment of each piece) and its workspace holds
    one projection expanded to 16 bits for the tensor-core product."""
    from engine.backends import cuda_native
    from engine.nvfp4_checkpoint import resident_bytes
    from engine.quantize import write_nvfp4

    info4 = inspect(write_nvfp4(default_model.path, tmp_path / "nvfp4"))
    raw = cuda_native.memory_plan(info4, 4096, 8, 4, "fast")
    d = info4.decoder
    pieces = d.num_layers * 20 + 4  # an upper bound on the pieces the layout aligns
    packed = resident_bytes(info4, 2, packed=True)
    assert packed <= raw["weight_bytes"] <= packed + 256 * pieces
    dense = cuda_native.memory_plan(inspect(default_model.path), 4096, 8, 4, "fast")
    assert raw["weight_bytes"] < 0.5 * dense["weight_bytes"]
    largest = max(d.q_size + 2 * d.kv_size, 2 * d.intermediate_size) * d.hidden_size
    assert raw["workspace"]["nvfp4_expanded"] == -(-largest * 2 // 256) * 256
    assert "nvfp4_expanded" not in dense["workspace"] or dense["workspace"]["nvfp4_expanded"] == 0
