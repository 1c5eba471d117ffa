// Matrix product for many rows (prefill, scoring, decode buckets past the GEMV): out[m, n] =
// sum_k x[m, k] * w[n, k], fp32 accumulation and output, on tensor cores through cuBLASLt. It is
// loaded with dlopen at first use (libcublasLt.so.13), so the extension imports where the library
// is absent; without it a plain shared-memory tiled kernel computes the same product, slower.
// The two precisions (kernels.h): exact = bf16 weights, fp32 activations split into bf16 hi + lo,
// two products; fast = scaled fp16 weights and activations, one product, the scales undone
// through cuBLASLt's alpha (powers of two: exact).
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "../common.cuh"
#include "kernels.h"

#ifdef HEARTH_WITH_CUBLASLT
#include <cublasLt.h>
#endif

namespace hearth {

// ---- fallback: tiled kernel, 64x64 output tile, 4x4 per thread ----
constexpr int kTile = 64, kTileK = 16;

__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float as_float(f16 v) { return __half2float(v); }

template <typename X, typename W>
__global__ void __launch_bounds__(256) gemm_tiled_kernel(const X* __restrict__ x,
                                                         const W* __restrict__ w,
                                                         float* __restrict__ out, int m, int n,
                                                         int k, float alpha) {
  __shared__ float xs[kTileK][kTile + 1];
  __shared__ float ws[kTileK][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < k; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTile * kTileK; i += blockDim.x) {
      const int r = i / kTileK, kk = i % kTileK;
      const int gr = row0 + r, gc = col0 + r, gk = k0 + kk;
      xs[kk][r] = (gr < m && gk < k) ? as_float(x[(size_t)gr * k + gk]) : 0.f;
      ws[kk][r] = (gc < n && gk < k) ? as_float(w[(size_t)gc * k + gk]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = row0 + ty * 4 + i, c = col0 + tx * 4 + j;
      if (r < m && c < n) out[(size_t)r * n + c] = acc[i][j] * alpha;
    }
}

template <typename X, typename W>
void launch_tiled(const X* x, const W* w, float* out, int rows, int n, int k, float alpha,
                  cudaStream_t stream) {
  dim3 grid((n + kTile - 1) / kTile, (rows + kTile - 1) / kTile);
  gemm_tiled_kernel<X, W><<<grid, 256, 0, stream>>>(x, w, out, rows, n, k, alpha);
  HEARTH_CHECK_LAUNCH("gemm_tiled_kernel");
}

#ifdef HEARTH_WITH_CUBLASLT
namespace {

// The cuBLASLt entry points we use, resolved from the shared library at first use.
struct LtApi {
  void* library = nullptr;
  cublasLtHandle_t handle = nullptr;
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  bool ok = false;
};

LtApi load_lt() {
  LtApi api;
  std::string toolkit = std::getenv("CUDA_HOME") ? std::getenv("CUDA_HOME") : "/usr/local/cuda";
  const std::string names[] = {"libcublasLt.so.13", toolkit + "/lib64/libcublasLt.so.13",
                               "libcublasLt.so"};
  for (const std::string& name : names) {
    api.library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api.library) break;
  }
  if (!api.library) return api;
#define HEARTH_LT_SYM(field, sym)                                               \
  api.field = reinterpret_cast<decltype(api.field)>(dlsym(api.library, #sym)); \
  if (!api.field) return api;
  HEARTH_LT_SYM(create, cublasLtCreate)
  HEARTH_LT_SYM(desc_create, cublasLtMatmulDescCreate)
  HEARTH_LT_SYM(desc_destroy, cublasLtMatmulDescDestroy)
  HEARTH_LT_SYM(desc_set, cublasLtMatmulDescSetAttribute)
  HEARTH_LT_SYM(layout_create, cublasLtMatrixLayoutCreate)
  HEARTH_LT_SYM(layout_destroy, cublasLtMatrixLayoutDestroy)
  HEARTH_LT_SYM(pref_create, cublasLtMatmulPreferenceCreate)
  HEARTH_LT_SYM(pref_destroy, cublasLtMatmulPreferenceDestroy)
  HEARTH_LT_SYM(pref_set, cublasLtMatmulPreferenceSetAttribute)
  HEARTH_LT_SYM(heuristic, cublasLtMatmulAlgoGetHeuristic)
  HEARTH_LT_SYM(matmul, cublasLtMatmul)
#undef HEARTH_LT_SYM
  if (api.create(&api.handle) != CUBLAS_STATUS_SUCCESS) return api;
  api.ok = true;
  return api;
}

LtApi& lt() {
  static LtApi api = load_lt();  // thread-safe one-time initialization
  return api;
}

void check_lt(cublasStatus_t status, const char* op) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string("cuBLASLt error in ") + op + ": status " +
                    std::to_string((int)status));
}

// One product shape's descriptors and chosen algorithm, kept for reuse.
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

std::mutex plan_mutex;
std::map<std::tuple<int, int, int, size_t, int>, LtPlan> plans;

// `operand`: the 16-bit type of both inputs (CUDA_R_16BF for exact, CUDA_R_16F for fast).
const LtPlan& lt_plan(int m, int n, int k, size_t workspace_bytes, cudaDataType_t operand) {
  std::lock_guard<std::mutex> guard(plan_mutex);
  auto key = std::make_tuple(m, n, k, workspace_bytes, (int)operand);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  LtApi& api = lt();
  LtPlan plan;
  // Column-major view: out^T [n, m] = w [k, n]^T * x^T [k, m].
  check_lt(api.desc_create(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check_lt(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "DescSetAttribute");
  check_lt(api.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "DescSetAttribute");
  check_lt(api.layout_create(&plan.a, operand, k, n, k), "MatrixLayoutCreate");
  check_lt(api.layout_create(&plan.b, operand, k, m, k), "MatrixLayoutCreate");
  check_lt(api.layout_create(&plan.c, CUDA_R_32F, n, m, n), "MatrixLayoutCreate");
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(api.pref_create(&pref), "MatmulPreferenceCreate");
  check_lt(api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                        sizeof(workspace_bytes)), "PreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status = api.heuristic(api.handle, plan.desc, plan.a, plan.b, plan.c, plan.c,
                                        pref, 1, &result, &found);
  api.pref_destroy(pref);
  check_lt(status, "MatmulAlgoGetHeuristic");
  if (found == 0) throw CudaError("cuBLASLt found no algorithm for a 16-bit product");
  plan.algo = result.algo;
  plan.workspace = result.workspaceSize;
  return plans.emplace(key, plan).first->second;
}

}  // namespace
#endif

bool cublaslt_available() {
#ifdef HEARTH_WITH_CUBLASLT
  return lt().ok;
#else
  return false;
#endif
}

const char* gemm_backend_name() {
  return cublaslt_available() ? "cublasLt" : "tiled";
}

namespace {

void check_gemm_shape(const WeightView& w, int rows, int n, int k, WeightFormat format) {
  HEARTH_REQUIRE(rows >= 0 && n > 0 && k > 0, "gemm: bad shape");
  HEARTH_REQUIRE(w.data && w.format == format,
                 "gemm: the weight format does not match the product's precision");
}

}  // namespace

void launch_gemm_exact(const float* x, const WeightView& w, float* out, int rows, int n, int k,
                       const GemmWork& work, cudaStream_t stream) {
  check_gemm_shape(w, rows, n, k, WeightFormat::Bf16);
  if (rows == 0) return;
  const bf16* wt = static_cast<const bf16*>(w.data);
#ifdef HEARTH_WITH_CUBLASLT
  if (cublaslt_available() && work.split) {
    const size_t ws_bytes = work.workspace ? work.workspace_bytes : 0;
    bf16* hi = work.split;
    bf16* lo = work.split + (size_t)rows * k;
    launch_split_bf16(x, hi, lo, (int64_t)rows * k, stream);
    const float alpha = w.scale, one = 1.f, zero = 0.f;
    const LtPlan& plan = lt_plan(rows, n, k, ws_bytes, CUDA_R_16BF);
    check_lt(lt().matmul(lt().handle, plan.desc, &alpha, wt, plan.a, hi, plan.b, &zero, out, plan.c,
                         out, plan.c, &plan.algo, work.workspace, ws_bytes, stream),
             "Matmul");
    check_lt(lt().matmul(lt().handle, plan.desc, &alpha, wt, plan.a, lo, plan.b, &one, out, plan.c,
                         out, plan.c, &plan.algo, work.workspace, ws_bytes, stream),
             "Matmul");
    return;
  }
#endif
  launch_tiled(x, wt, out, rows, n, k, w.scale, stream);
}

void launch_gemm_fast(const Fp16Operand& x, const WeightView& w, float* out, int rows, int n, int k,
                      const GemmWork& work, cudaStream_t stream) {
  check_gemm_shape(w, rows, n, k, WeightFormat::Fp16);
  HEARTH_REQUIRE(x.data, "gemm: the fast product needs its fp16 operand");
  if (rows == 0) return;
  const f16* wt = static_cast<const f16*>(w.data);
  const float alpha = x.scale * w.scale;  // powers of two: undone exactly
#ifdef HEARTH_WITH_CUBLASLT
  if (cublaslt_available()) {
    const size_t ws_bytes = work.workspace ? work.workspace_bytes : 0;
    const float zero = 0.f;
    const LtPlan& plan = lt_plan(rows, n, k, ws_bytes, CUDA_R_16F);
    check_lt(lt().matmul(lt().handle, plan.desc, &alpha, wt, plan.a, x.data, plan.b, &zero, out,
                         plan.c, out, plan.c, &plan.algo, work.workspace, ws_bytes, stream),
             "Matmul");
    return;
  }
#endif
  launch_tiled(x.data, wt, out, rows, n, k, alpha, stream);
}

}  // namespace hearth
