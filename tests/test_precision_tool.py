"""engine.tools.precision on a tiny checkpoint (CPU), and engine.tools.profile_decode's parts that need no GPU."""
import math
import subprocess
import sys

import pytest
import torch

from engine.tools import precision, profile_decode


@pytest.fixture(scope="module")
def figures(synth):
    return precision.measure(str(synth("tiny")), tokens=32, device="cpu")


def test_modes_rank_as_their_mantissas(figures):
    modes = figures["modes"]
    assert set(modes) == set(precision.MODES)
    for row in list(modes.values()) + [figures["kv_bf16_vs_fp32"]]:
        assert row["finite"] and math.isfinite(row["rel_error"]) and 0.0 <= row["top1"] <= 1.0
    # hi + lo carries ~16 mantissa bits: nearly exact, or the tool is wrong. Judged on the fp32 cache:
    # against the bf16 cache a 3e-6 move now and then flips a K/V rounding, which is the cache's doing.
    assert modes["bf16_split"]["rel_error_fp32_kv"] < 1e-5
    assert modes["bf16_split"]["rel_error"] < modes["bf16"]["rel_error"]
    for suffix in ("", "_fp32_kv"):
        assert modes["bf16"]["rel_error" + suffix] > modes["fp16"]["rel_error" + suffix] > 0
        assert modes["fp16_scaled"]["rel_error" + suffix] > 0
    assert figures["kv_bf16_vs_fp32"]["rel_error"] > 0


def test_rounding_is_undone_after_the_block():
    from engine.backends import torch_ref

    real = torch_ref.F
    with pytest.raises(RuntimeError):
        with precision.rounding("fp16"):
            assert torch_ref.F is not real and torch_ref.F.silu is real.silu
            raise RuntimeError
    assert torch_ref.F is real


def test_fp16_scaled_keeps_the_row_max_in_the_top_binade():
    x = torch.tensor([[3.0e-7, -1.0e-9, 0.0], [7.0e4, 1.0, -2.0], [0.0, 0.0, 0.0]])
    s = precision._pow2_exponent(x.abs().amax(-1, keepdim=True))
    scaled = torch.ldexp(x.abs().amax(-1), s[:, 0].float())
    assert ((scaled[:2] >= 2 ** 14) & (scaled[:2] < 2 ** 15)).all()
    y = precision.round_fp16_scaled(x, dim=-1)
    assert torch.isfinite(y).all()  # 7e4 overflows plain fp16, not the scaled one
    assert torch.isinf(x.half()).any()
    assert (y - x).abs().div(x.abs().clamp_min(1e-30))[x != 0].max() < 2 ** -11
    assert (y[2] == 0).all()


def test_kernel_names_lose_template_arguments():
    assert profile_decode.short_name("void hearth::gemv<4, __nv_bfloat16>(hearth::Args)") == "hearth::gemv"
    assert profile_decode.short_name("std::enable_if<!(T7), void>::type internal::gemvx::kernel<int, "
                                     "float>(cublasGemvParamsEx<int, float>)") == "internal::gemvx::kernel"
    assert profile_decode.short_name("void (anonymous namespace)::norm<1>(float*)") == "(anonymous namespace)::norm"
    assert profile_decode.short_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_cublas") == \
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_cublas"


def test_aggregate_charges_overlaps_to_the_earlier_kernel():
    # k<2> starts while k<1> runs (programmatic dependent launch): it adds only 5 µs to the busy time.
    ev = [
        {"ph": "X", "cat": "kernel", "name": "void k<1>(int)", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "void k<2>(int)", "ts": 5, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "void m(int)", "ts": 20, "dur": 2},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "ts": 40, "dur": 4},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 6},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "ts": 18, "dur": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 0, "dur": 100},
    ]
    out = profile_decode.aggregate(ev, steps=2)
    k = out["kernels"][0]
    assert (k["kernel"], k["calls_per_step"], k["us_per_step"], k["exclusive_us_per_step"], k["variants"]) == \
        ("k", 1.0, 10.0, 7.5, 2)
    assert out["device_us_per_step"] == 13.0 and out["busy_us_per_step"] == 10.5
    assert abs(sum(r["percent"] for r in out["kernels"]) - 100) < 1e-9
    assert out["kernels_per_step"] == 1.5 and out["graph_kernels_per_step"] == 1.0
    assert out["runtime_api"]["cudaGraphLaunch"]["calls_per_step"] == 0.5


def test_profile_decode_without_a_gpu_exits_2_with_one_clear_line(tmp_path):
    from engine.backends import cuda_native

    if cuda_native.available()[0]:
        pytest.skip("a GPU and the compiled engine are here")
    proc = subprocess.run([sys.executable, "-m", "engine.tools.profile_decode", "--model", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot run here" in lines[0] and "Traceback" not in proc.stderr
