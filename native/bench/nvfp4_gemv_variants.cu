// Exploration bench (built by nvcc alone, not part of the extension): the NVFP4 decode GEMV of
// gemv.cu against a tensor-core candidate, on the 8B's projection shapes, weights rotated through
// more memory than L2 holds, checked against a float64 reference on the same codes.
//   nvcc -O3 -std=c++17 -arch=sm_90 -Inative/src native/bench/nvfp4_gemv_variants.cu \
//        native/src/kernels/gemv.cu native/src/device_info.cu native/src/cuda_check.cpp -o /tmp/nvb
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common.cuh"
#include "kernels/kernels.h"
#include "kernels/nvfp4.cuh"

using namespace hearth;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)

namespace cand {

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Codes i and i + 4 of a word (nibble j at bits 4j) as bf16 pair = e2m1 * 2^-126 each.
template <int I>
__device__ __forceinline__ uint32_t decode_pair(uint32_t q) {
  const uint32_t s = q << (12 - 4 * I);
  return (s & 0x80008000u) | ((s & 0x70007000u) >> 6);
}

// Two e4m3 block scales (bytes of u) as fp32 times 2^119 (via fp16 bits: subnormals exact).
__device__ __forceinline__ float2 scales_pair(uint32_t u) {
  const uint32_t bits = ((u & 0x7Fu) << 7) | ((u & 0x80u) << 8) | ((u & 0x7F00u) << 15) | ((u & 0x8000u) << 16);
  float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));  // = s * 2^-8
  f.x *= 0x1p127f;
  f.y *= 0x1p127f;
  return f;
}

__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}
__device__ __forceinline__ uint32_t bpack(float lo, float hi) {
  __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                    uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// out[r, n] = gscale * sum_k x[r, k] w[n, k]; FT tiles of 16 features per warp, WARPS split k in
// super-steps of 128 inputs (thread t of a quad owns inputs 32t .. 32t + 31 of a step).
template <int FT, int WARPS, int U, bool SPLIT>
__global__ void __launch_bounds__(WARPS * 32) gemv_mma(const float* __restrict__ x, const uint8_t* __restrict__ codes,
                                                       const uint8_t* __restrict__ scales, float gscale,
                                                       float* __restrict__ out, int rows, int n, int k) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int f0 = blockIdx.x * 16 * FT;
  const int steps = (k + 127) / 128;
  const uint4* wrow[FT][2];
  const uint16_t* srow[FT][2];
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const size_t row = (size_t)min(f0 + 16 * i + g + 8 * h, n - 1);
      wrow[i][h] = reinterpret_cast<const uint4*>(codes + row * (k / 2));
      srow[i][h] = reinterpret_cast<const uint16_t*>(scales + row * (k / 16));
    }
  const bool has_x = g < rows;
  const float* xr = x + (size_t)min(g, rows - 1) * k;
  float acc[FT][4];
#pragma unroll
  for (int i = 0; i < FT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;

  for (int s0 = warp; s0 < steps; s0 += WARPS * U) {
    uint4 w[U][FT][2];
    uint32_t sc[U][FT][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * WARPS;
      const bool ok = s < steps && s * 128 + 32 * t < k;
#pragma unroll
      for (int i = 0; i < FT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          w[u][i][h] = ok ? ld_stream(wrow[i][h] + s * 4 + t) : make_uint4(0, 0, 0, 0);
          sc[u][i][h] = ok ? (uint32_t)__ldg(srow[i][h] + s * 4 + t) : 0u;
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int s = s0 + u * WARPS;
      const bool ok = s < steps && s * 128 + 32 * t < k;
      const float4* xp = reinterpret_cast<const float4*>(xr + (size_t)s * 128 + 32 * t);
#pragma unroll
      for (int wd = 0; wd < 4; ++wd) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (ok && has_x) { a = __ldg(xp + 2 * wd); b = __ldg(xp + 2 * wd + 1); }
        const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
        uint32_t hi[4], lo[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          hi[p] = bpack(av[p], bv[p]);
          if constexpr (SPLIT) {
            const float hx = __uint_as_float(hi[p] << 16), hy = __uint_as_float(hi[p] & 0xFFFF0000u);
            lo[p] = bpack(av[p] - hx, bv[p] - hy);
          }
        }
#pragma unroll
        for (int i = 0; i < FT; ++i) {
          uint32_t P[2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float2 sf = scales_pair(sc[u][i][h]);
            const float sv = wd < 2 ? sf.x : sf.y;
            const uint32_t S = bpack(sv, sv);
            const uint32_t q = (&w[u][i][h].x)[wd];
            P[h][0] = bmul2(decode_pair<0>(q), S);
            P[h][1] = bmul2(decode_pair<1>(q), S);
            P[h][2] = bmul2(decode_pair<2>(q), S);
            P[h][3] = bmul2(decode_pair<3>(q), S);
          }
          mma(acc[i], P[0][0], P[1][0], P[0][1], P[1][1], hi[0], hi[1]);
          mma(acc[i], P[0][2], P[1][2], P[0][3], P[1][3], hi[2], hi[3]);
          if constexpr (SPLIT) {
            mma(acc[i], P[0][0], P[1][0], P[0][1], P[1][1], lo[0], lo[1]);
            mma(acc[i], P[0][2], P[1][2], P[0][3], P[1][3], lo[2], lo[3]);
          }
        }
      }
    }
  }
  // acc[i]: (feature g, batch 2t, 2t+1), (feature g + 8, batch 2t, 2t+1)
  __shared__ float part[WARPS][FT * 16][8];
#pragma unroll
  for (int i = 0; i < FT; ++i) {
    part[warp][16 * i + g][2 * t] = acc[i][0];
    part[warp][16 * i + g][2 * t + 1] = acc[i][1];
    part[warp][16 * i + g + 8][2 * t] = acc[i][2];
    part[warp][16 * i + g + 8][2 * t + 1] = acc[i][3];
  }
  __syncthreads();
  const float fs = gscale * 128.f;
  for (int q = threadIdx.x; q < FT * 16 * rows; q += WARPS * 32) {
    const int f = q / rows, r = q % rows;
    if (f0 + f >= n) continue;
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < WARPS; ++p) v += part[p][f][r];
    out[(size_t)r * n + f0 + f] = v * fs;
  }
}

}  // namespace cand

__global__ void reference(const float* x, const uint8_t* codes, const uint8_t* scales, float gscale, double* out,
                          int rows, int n, int k) {
  const int f = blockIdx.x * blockDim.x + threadIdx.x;
  if (f >= n) return;
  const float lut[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int r = 0; r < rows; ++r) {
    double acc = 0;
    for (int i = 0; i < k; ++i) {
      const uint8_t b = codes[(size_t)f * (k / 2) + i / 2];
      const uint32_t c = (i & 1) ? (b >> 4) : (b & 15);
      const double v = (c & 8 ? -1.0 : 1.0) * lut[c & 7];
      acc += (double)x[(size_t)r * k + i] * v * (double)e4m3_value(scales[(size_t)f * (k / 16) + i / 16]);
    }
    out[(size_t)r * n + f] = acc * gscale;
  }
}

struct Shape { const char* name; int n, k; };

template <typename F>
float time_us(F&& launch, int copies, int iters) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < copies; ++i) launch(i);
  CK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) launch(i % copies);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms; CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  return ms * 1000.f / iters;
}

int main() {
  const Shape shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336},
                          {"135m-qkv", 960, 576}};
  std::mt19937 rng(1);
  for (const Shape& sh : shapes) {
    const size_t code_bytes = (size_t)sh.n * sh.k / 2, scale_bytes = (size_t)sh.n * sh.k / 16;
    const int copies = (int)std::max<size_t>(2, (size_t)(1u << 30) / (code_bytes + scale_bytes));
    std::vector<uint8_t> hc(code_bytes), hs(scale_bytes);
    for (auto& c : hc) c = rng() & 0xFF;
    for (size_t i = 0; i < hs.size(); ++i) hs[i] = (i % 97 == 0) ? (rng() % 8) : (0x28 + rng() % 0x30);  // some subnormal
    uint8_t *dc, *ds; float *dx, *dout, *dout2; double* dref;
    CK(cudaMalloc(&dc, code_bytes * copies)); CK(cudaMalloc(&ds, scale_bytes * copies));
    for (int c = 0; c < copies; ++c) {
      CK(cudaMemcpy(dc + c * code_bytes, hc.data(), code_bytes, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ds + c * scale_bytes, hs.data(), scale_bytes, cudaMemcpyHostToDevice));
    }
    std::vector<float> hx((size_t)8 * sh.k);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : hx) v = nd(rng);
    CK(cudaMalloc(&dx, hx.size() * 4)); CK(cudaMemcpy(dx, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dout, (size_t)8 * sh.n * 4)); CK(cudaMalloc(&dout2, (size_t)8 * sh.n * 4));
    CK(cudaMalloc(&dref, (size_t)8 * sh.n * 8));
    const float gs = 0.0007f;
    for (int rows : {1, 2, 4, 8}) {
      reference<<<(sh.n + 127) / 128, 128>>>(dx, dc, ds, gs, dref, rows, sh.n, sh.k);
      CK(cudaDeviceSynchronize());
      std::vector<double> ref((size_t)rows * sh.n);
      CK(cudaMemcpy(ref.data(), dref, ref.size() * 8, cudaMemcpyDeviceToHost));
      auto rel_of = [&](float* d) {
        std::vector<float> got((size_t)rows * sh.n);
        CK(cudaMemcpy(got.data(), d, got.size() * 4, cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        for (size_t i = 0; i < got.size(); ++i) { num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i]; }
        return std::sqrt(num / den);
      };
      const double gb = (double)(code_bytes + scale_bytes) / 1e9;
      auto base = [&](int c) {
        WeightView w{dc + c * code_bytes, WeightFormat::NvFp4, gs, ds + c * scale_bytes};
        launch_gemv(dx, w, dout, rows, sh.n, sh.k, 0);
      };
      base(0); CK(cudaDeviceSynchronize());
      const double rb = rel_of(dout);
      const float tb = time_us(base, copies, 200);
      printf("[%s %dx%d rows %d] current   %7.1f us %5.2f TB/s rel %.2e\n", sh.name, sh.n, sh.k, rows, tb, gb / tb * 1e6 / 1e3, rb);
      auto run_variant = [&](const char* label, auto kernel, int ft, int warps) {
        auto go = [&](int c) {
          kernel<<<(sh.n + 16 * ft - 1) / (16 * ft), warps * 32>>>(dx, dc + c * code_bytes, ds + c * scale_bytes, gs, dout2,
                                                                   rows, sh.n, sh.k);
        };
        go(0); CK(cudaDeviceSynchronize());
        const double rv = rel_of(dout2);
        const float tv = time_us(go, copies, 200);
        printf("[%s %dx%d rows %d] %-9s %7.1f us %5.2f TB/s rel %.2e\n", sh.name, sh.n, sh.k, rows, label, tv, gb / tv * 1e6 / 1e3, rv);
      };
      run_variant("mma1w8u1s", cand::gemv_mma<1, 8, 1, true>, 1, 8);
      run_variant("mma1w8u2s", cand::gemv_mma<1, 8, 2, true>, 1, 8);
      run_variant("mma2w8u1s", cand::gemv_mma<2, 8, 1, true>, 2, 8);
      run_variant("mma2w4u2s", cand::gemv_mma<2, 4, 2, true>, 2, 4);
      run_variant("mma1w4u2s", cand::gemv_mma<1, 4, 2, true>, 1, 4);
      run_variant("mma4w8u1s", cand::gemv_mma<4, 8, 1, true>, 4, 8);
      run_variant("mma1w8u2h", cand::gemv_mma<1, 8, 2, false>, 1, 8);
      run_variant("mma2w8u1h", cand::gemv_mma<2, 8, 1, false>, 2, 8);
    }
    cudaFree(dc); cudaFree(ds); cudaFree(dx); cudaFree(dout); cudaFree(dout2); cudaFree(dref);
  }
  return 0;
}
