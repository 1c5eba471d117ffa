"""NVFP4 format maths (engine/nvfp4.py) against torch's fp8 casts, ModelOpt's published formula and
the compressed-tensors package's own decompressor."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import nvfp4


def _weight(n=48, k=64, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.02, size=(n, k)).astype(np.float32)
    w[3, :16] = 0.0                       # an all-zero block
    w[5, 16:32] *= 40                     # a block far larger than the rest
    return w


def test_e2m1_values_and_codes():
    assert nvfp4.e2m1_decode(np.arange(16)).tolist() == [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]
    # Ties go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)
    assert nvfp4.e2m1_decode(nvfp4.e2m1_encode(ties)).tolist() == [0, 1, 1, 2, 2, 4, 4]
    assert nvfp4.e2m1_encode(np.array([7.0, -100.0, -0.1])).tolist() == [7, 15, 0]


def test_packing_puts_the_even_element_in_the_low_nibble():
    codes = np.array([[1, 2, 15, 0]], dtype=np.uint8)
    packed = nvfp4.pack_codes(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    np.testing.assert_array_equal(nvfp4.unpack_codes(packed), codes)


def test_e4m3_matches_torch_casts():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-448, 448, 5000), rng.uniform(-0.02, 0.02, 5000),
                        nvfp4.E4M3_VALUES[:127], (nvfp4.E4M3_VALUES[1:127] + nvfp4.E4M3_VALUES[:126]) / 2,
                        [0.0, 2.0 ** -10, 3 * 2.0 ** -11]]).astype(np.float32)
    ours = nvfp4.e4m3_encode(x)
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    # torch writes -0 for tiny negatives; both decode to zero, we keep +0.
    same = (ours == theirs) | ((nvfp4.e4m3_decode(ours) == 0) & (nvfp4.e4m3_decode(theirs) == 0))
    assert same.all(), x[~same][:5]
    np.testing.assert_array_equal(nvfp4.e4m3_decode(np.arange(256))[np.arange(256) % 128 != 127],
                                  torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
                                  [np.arange(256) % 128 != 127])


def _modelopt_reference(w: np.ndarray):
    """ModelOpt's NVFP4QTensor arithmetic, in torch, written out from its source."""
    t = torch.from_numpy(w)
    scale_2 = t.abs().max().float() / (6.0 * 448.0)
    block_amax = t.reshape(t.shape[0], -1, 16).abs().amax(-1).float()
    block = block_amax / (6.0 * scale_2)
    block[block == 0] = 1.0
    block = block.to(torch.float8_e4m3fn)
    scaled = t.reshape(t.shape[0], -1, 16) / (block.float() * scale_2).unsqueeze(-1)
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5])
    mag = scaled.abs()
    ordinal = torch.searchsorted(bounds, mag, out_int32=True)
    on_odd_bound = torch.any(mag.unsqueeze(-1) == bounds[[1, 3, 5]], dim=-1)
    ordinal = ordinal + on_odd_bound.int()
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])[ordinal.long()] * torch.where(scaled < 0, -1.0, 1.0)
    return (values * block.float().unsqueeze(-1) * scale_2).reshape(t.shape).numpy(), block.view(torch.uint8).numpy(), scale_2


def test_quantize_follows_modelopts_formula():
    w = _weight()
    q = nvfp4.quantize(w)
    ref, ref_block, ref_scale_2 = _modelopt_reference(w)
    assert np.float32(q.global_scale) == np.float32(ref_scale_2.item())
    np.testing.assert_array_equal(q.block_scales, ref_block)
    np.testing.assert_array_equal(q.dequantize(), ref)
    assert (q.block_scales[3, 0] == nvfp4.e4m3_encode(np.float32(1.0)))   # all-zero block: scale 1.0
    # The widest e2m1 step is 4 -> 6: at most one block-scale unit (block amax / 6) off, plus the
    # e4m3 rounding of the block scale itself (under 1/16).
    err = np.abs(q.dequantize() - w).reshape(48, 4, 16).max(-1)
    assert (err <= np.abs(w).reshape(48, 4, 16).max(-1) / 6 * (1 + 2 ** -4) + 1e-9).all()


def test_fuse_brings_parts_onto_one_global_scale():
    a, b = _weight(32, 64, seed=2), _weight(16, 64, seed=3)
    b = b / np.abs(b).max() * np.abs(a).max() * 8                  # b's global scale is exactly 8x a's
    qa, qb = nvfp4.quantize(a), nvfp4.quantize(b)
    fused = nvfp4.fuse([qa, qb])
    assert fused.global_scale == max(qa.global_scale, qb.global_scale)
    # A power-of-two ratio keeps every block scale exact, so the fused weight is the parts stacked.
    np.testing.assert_array_equal(fused.dequantize(), np.concatenate([qa.dequantize(), qb.dequantize()]))
    odd = nvfp4.fuse([qa, nvfp4.quantize(b * 1.37)])
    ref = np.concatenate([qa.dequantize(), nvfp4.quantize(b * 1.37).dequantize()])
    assert np.abs(odd.dequantize() - ref).max() <= np.abs(ref).max() * 2 ** -4


def test_compressed_tensors_decompresses_our_packing_to_our_values():
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization.quant_scheme import NVFP4A16

    q = nvfp4.quantize(_weight())
    state = {
        "weight_packed": torch.from_numpy(q.packed.copy()),
        "weight_scale": torch.from_numpy(q.block_scales.copy()).view(torch.float8_e4m3fn),
        "weight_global_scale": torch.tensor([1.0 / q.global_scale], dtype=torch.float32),
    }
    scheme = QuantizationScheme(targets=["Linear"], **NVFP4A16)
    ours = q.dequantize()
    # The package decompresses in bf16, rounding twice (scale / global scale, then the product).
    theirs = NVFP4PackedCompressor.decompress(state, scheme)["weight"]
    assert theirs.dtype == torch.bfloat16
    np.testing.assert_allclose(theirs.float().numpy(), ours, rtol=2 ** -7, atol=0)
    # Its own pieces in fp32: unpacking is exact, dequantizing differs from ours only by the one
    # rounding of the inverted global scale.
    codes = unpack_fp4_from_uint8(state["weight_packed"], 48, 64, dtype=torch.float32)
    np.testing.assert_array_equal(codes.numpy(), nvfp4.e2m1_decode(nvfp4.unpack_codes(q.packed)))
    fp32 = dequantize(x_q=codes, scale=state["weight_scale"].float(), args=scheme.weights,
                      global_scale=state["weight_global_scale"], dtype=torch.float32)
    np.testing.assert_allclose(fp32.numpy(), ours, rtol=3e-7, atol=0)
