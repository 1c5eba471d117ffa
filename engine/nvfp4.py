"""NVFP4: NVIDIA's 4-bit float weight format, in numpy (no torch needed to quantize or inspect).

A weight [N, K] is stored as
    codes        e2m1, 4 bits each: code = sign << 3 | magnitude index, magnitudes 0 0.5 1 1.5 2 3 4 6;
                 two per byte along K, the even element in the low nibble -> uint8 [N, K/2]
    block scales one fp8 e4m3 (e4m3fn: no infinities, max 448) per 16 inputs -> uint8 bits [N, K/16]
    global scale one fp32 per tensor.
Two checkpoint conventions carry the global scale (checked against ModelOpt's NVFP4QTensor and
compressed-tensors' NVFP4PackedCompressor / lifecycle.forward):
    ModelOpt            weight_scale_2      = amax / (6 * 448);  value = e2m1 * weight_scale * weight_scale_2
    compressed-tensors  weight_global_scale = 6 * 448 / amax;    value = e2m1 * weight_scale / weight_global_scale
Hearth keeps the multiplier (ModelOpt's weight_scale_2) in `NvFp4Tensor.global_scale`; a
compressed-tensors checkpoint's divisor is inverted once, in fp32, when it is read.

Quantization is weight-only and needs no calibration: the global scale maps the tensor's amax onto
6 * 448, each block scale maps its block's amax onto 6 (rounded to e4m3, all-zero blocks get 1.0 as
ModelOpt does), and each value rounds to the nearest e2m1 magnitude, ties to the even code.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 16                      # inputs per block scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
# Every code's value, sign included: codes 8..15 are the negatives (8 is -0).
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES]).astype(np.float32)


def _e4m3_table() -> np.ndarray:
    """float32 value of each of the 256 e4m3fn bit patterns (0x7F and 0xFF are NaN)."""
    values = np.empty(256, dtype=np.float32)
    for bits in range(256):
        sign = -1.0 if bits & 0x80 else 1.0
        exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
        if exponent == 0xF and mantissa == 0x7:
            values[bits] = np.nan
        elif exponent == 0:
            values[bits] = sign * mantissa / 8.0 * 2.0 ** -6          # subnormal: down to 2^-9
        else:
            values[bits] = sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    return values


E4M3_VALUES = _e4m3_table()
E4M3_MIN_SUBNORMAL = float(E4M3_VALUES[1])        # 2^-9: smaller non-zero block scales flush to 0


def _round_to_grid(magnitudes: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the nearest point of an ascending grid, ties to the even index, saturating at the top.

    For both e2m1 and e4m3 the index is the code, and an even index is an even mantissa: this is
    round-to-nearest-even, as the hardware conversions and torch's casts do.
    """
    midpoints = (grid[1:] + grid[:-1]) / 2
    low = np.searchsorted(midpoints, magnitudes, side="left")
    high = np.searchsorted(midpoints, magnitudes, side="right")
    return np.where((high != low) & (low % 2 == 1), high, low)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float -> e4m3fn bit patterns (uint8), round to nearest even, saturating at +-448."""
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("e4m3_encode: the input holds NaN or infinity")
    codes = _round_to_grid(np.abs(x), E4M3_VALUES[:0x7F]).astype(np.uint8)
    return np.where((x < 0) & (codes != 0), codes | 0x80, codes).astype(np.uint8)


def e4m3_decode(bits: np.ndarray) -> np.ndarray:
    return E4M3_VALUES[np.asarray(bits, dtype=np.uint8)]


def e2m1_encode(x: np.ndarray) -> np.ndarray:
    """Already-scaled float values -> e2m1 codes (uint8, 0..15), nearest even, saturating at +-6.

    A value that rounds to zero gets code 0, whatever its sign.
    """
    x = np.asarray(x, dtype=np.float32)
    magnitude = _round_to_grid(np.abs(x), E2M1_MAGNITUDES).astype(np.uint8)
    return np.where((x < 0) & (magnitude != 0), magnitude | 0x8, magnitude).astype(np.uint8)


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    return E2M1_VALUES[np.asarray(codes, dtype=np.uint8) & 0xF]


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """[N, K] codes -> [N, K/2] bytes: element 2j in the low nibble, 2j+1 in the high one."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.ndim != 2 or codes.shape[1] % 2:
        raise ValueError(f"pack_codes needs [N, K] with K even, not {list(codes.shape)}")
    return (codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4)


def unpack_codes(packed: np.ndarray) -> np.ndarray:
    """[N, K/2] bytes -> [N, K] codes."""
    packed = np.asarray(packed, dtype=np.uint8)
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    return codes


@dataclass(frozen=True)
class NvFp4Tensor:
    """One NVFP4 weight: what a kernel needs resident, whichever checkpoint convention it came from."""
    packed: np.ndarray          # uint8 [N, K/2]
    block_scales: np.ndarray    # uint8 e4m3fn bits [N, K/16]
    global_scale: np.float32    # multiplier: value = e2m1 * block_scale * global_scale

    @property
    def shape(self) -> tuple:
        return (self.packed.shape[0], self.packed.shape[1] * 2)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.block_scales.nbytes + 4

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]. Each product is exact in fp32 up to the final multiply by the global scale."""
        n, k = self.shape
        values = e2m1_decode(unpack_codes(self.packed)).reshape(n, k // BLOCK, BLOCK)
        scales = e4m3_decode(self.block_scales).reshape(n, k // BLOCK, 1)
        return ((values * scales).reshape(n, k) * np.float32(self.global_scale)).astype(np.float32)


def global_scale_for(amax: float) -> np.float32:
    """ModelOpt's weight_scale_2 for a tensor (or fused group) whose largest magnitude is `amax`."""
    amax = np.float32(amax)
    return np.float32(amax / np.float32(E2M1_MAX * E4M3_MAX)) if amax > 0 else np.float32(1.0)


def quantize(weight: np.ndarray, global_scale=None) -> NvFp4Tensor:
    """Weight-only NVFP4 of a float [N, K] weight (K a multiple of 16), amax per block.

    `global_scale` (a weight_scale_2 multiplier) is given when several tensors share one, as fused
    projections must; otherwise it comes from this tensor's own amax.
    """
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"NVFP4 needs a 2-D weight whose inputs are a multiple of {BLOCK}, "
                         f"not {list(w.shape)}")
    if not np.isfinite(w).all():
        raise ValueError("the weight holds NaN or infinity")
    n, k = w.shape
    scale_2 = global_scale_for(np.abs(w).max() if w.size else 0.0) if global_scale is None \
        else np.float32(global_scale)
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    block_amax = np.abs(blocks).max(axis=-1)
    wanted = (block_amax / (np.float32(E2M1_MAX) * scale_2)).astype(np.float32)
    wanted[wanted == 0] = 1.0
    block_bits = e4m3_encode(np.minimum(wanted, E4M3_MAX))
    # A block scale too small for e4m3 flushes to 0; its block then holds zeros, honestly.
    effective = (e4m3_decode(block_bits) * scale_2)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(effective > 0, blocks / effective, 0.0)
    codes = e2m1_encode(scaled.reshape(n, k))
    return NvFp4Tensor(pack_codes(codes), block_bits, scale_2)


def with_global_scale(t: NvFp4Tensor, global_scale) -> NvFp4Tensor:
    """The same weight expressed against another global scale: block scales rescaled, codes kept.

    Exact when the ratio is a power of two that stays in e4m3's range; otherwise each block scale
    rounds once more (relative error below 2^-4, a fraction of the 4-bit error itself).
    """
    global_scale = np.float32(global_scale)
    if global_scale == t.global_scale:
        return t
    ratio = np.float32(t.global_scale) / global_scale
    rescaled = np.minimum(e4m3_decode(t.block_scales) * ratio, E4M3_MAX)
    return NvFp4Tensor(t.packed, e4m3_encode(rescaled), global_scale)


def fuse(parts: list) -> NvFp4Tensor:
    """Stack NVFP4 weights along N (q/k/v, gate/up) under one common global scale.

    The common scale is the largest of the parts', so rescaled block scales only shrink (never past
    448); parts quantized with a shared scale (as `hearth quantize` writes them) are stacked as is.
    """
    if not parts:
        raise ValueError("fuse needs at least one part")
    widths = {p.shape[1] for p in parts}
    if len(widths) != 1:
        raise ValueError(f"fused parts must share their input size, not {sorted(widths)}")
    common = max(np.float32(p.global_scale) for p in parts)
    same = [with_global_scale(p, common) for p in parts]
    return NvFp4Tensor(np.concatenate([p.packed for p in same]), np.concatenate([p.block_scales for p in same]),
                       np.float32(common))


def bits_per_weight(shape: tuple) -> float:
    """Storage per weight of an NVFP4 tensor of logical shape [N, K]: 4 + 8/16 + the global scale."""
    n, k = shape
    return (n * k / 2 + n * k / BLOCK + 4) * 8 / (n * k)
