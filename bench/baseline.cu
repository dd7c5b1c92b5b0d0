#include <cmath>

#include "baseline.h"
#include "cli.h"
#include "cuda_check.h"
#include "device_types.cuh"
#include "gpu.h"

namespace qkbench {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr size_t kVectorBytes = 16;

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ void load(const T* p, float (&out)[V]) {
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int t = 0; t < V; ++t) out[t] = to_float(pack.v[t]);
}

template <typename T, int V>
__device__ __forceinline__ void store(T* p, const float (&in)[V]) {
  Pack<T, V> pack;
#pragma unroll
  for (int t = 0; t < V; ++t) pack.v[t] = from_float<T>(in[t]);
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

struct RowRange {
  int64_t row;  // over all heads
  int64_t end;  // live columns [0, end)
};

__device__ __forceinline__ bool warp_row(int64_t rows, int64_t S, bool causal, RowRange* r) {
  r->row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  if (r->row >= rows) return false;
  const int64_t i = r->row % S;  // query index
  r->end = causal ? min(i + 1, S) : S;
  return true;
}

// Combines two (max, Σ exp(x − max)) pairs; a pair with max −inf holds nothing.
__device__ __forceinline__ void combine(float& m, float& l, float m2, float l2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;
  l = (m == -INFINITY ? 0.f : l * __expf(m - mx)) + (m2 == -INFINITY ? 0.f : l2 * __expf(m2 - mx));
  m = mx;
}

// One warp per row of x (rows × S, dtype T), in place: x ← softmax over the live columns, 0 elsewhere;
// lse[row] = log Σ exp (when lse is not null).
template <typename T, int V>
__global__ void softmax_forward_kernel(T* x, float* lse, int64_t rows, int64_t S, bool causal) {
  RowRange r;
  if (!warp_row(rows, S, causal, &r)) return;
  const int lane = threadIdx.x % kWarpSize;
  T* row = x + r.row * S;
  float m = -INFINITY, l = 0;
  for (int64_t j = int64_t(lane) * V; j < r.end; j += int64_t(kWarpSize) * V) {
    float v[V];
    load<T, V>(row + j, v);
    float cm = -INFINITY;
#pragma unroll
    for (int t = 0; t < V; ++t) cm = j + t < r.end ? fmaxf(cm, v[t]) : cm;
    float cl = 0;
#pragma unroll
    for (int t = 0; t < V; ++t) cl += j + t < r.end ? __expf(v[t] - cm) : 0.f;
    combine(m, l, cm, cl);
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    combine(m, l, __shfl_xor_sync(kFullMask, m, offset), __shfl_xor_sync(kFullMask, l, offset));
  const float inv = 1.f / l;
  for (int64_t j = int64_t(lane) * V; j < S; j += int64_t(kWarpSize) * V) {
    float v[V] = {};
    if (j < r.end) load<T, V>(row + j, v);
#pragma unroll
    for (int t = 0; t < V; ++t) v[t] = j + t < r.end ? __expf(v[t] - m) * inv : 0.f;
    store<T, V>(row + j, v);
  }
  if (lse && lane == 0) lse[r.row] = m + logf(l);
}

// One warp per row: D = Σ_live P ∘ dP; ds ← P ∘ (dP − D) over the live columns, 0 elsewhere. ds may be p.
template <typename T, int V>
__global__ void softmax_backward_kernel(const T* p, const T* dp, T* ds, int64_t rows, int64_t S, bool causal) {
  RowRange r;
  if (!warp_row(rows, S, causal, &r)) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t base = r.row * S;
  float d = 0;
  for (int64_t j = int64_t(lane) * V; j < r.end; j += int64_t(kWarpSize) * V) {
    float pv[V], gv[V];
    load<T, V>(p + base + j, pv);
    load<T, V>(dp + base + j, gv);
#pragma unroll
    for (int t = 0; t < V; ++t) d += j + t < r.end ? pv[t] * gv[t] : 0.f;
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) d += __shfl_xor_sync(kFullMask, d, offset);
  for (int64_t j = int64_t(lane) * V; j < S; j += int64_t(kWarpSize) * V) {
    float pv[V] = {}, gv[V] = {};
    if (j < r.end) {
      load<T, V>(p + base + j, pv);
      load<T, V>(dp + base + j, gv);
    }
#pragma unroll
    for (int t = 0; t < V; ++t) pv[t] = j + t < r.end ? pv[t] * (gv[t] - d) : 0.f;
    store<T, V>(ds + base + j, pv);
  }
}

struct RowGrid {
  int64_t rows;
  dim3 grid, block;
};

RowGrid row_grid(const Shape& s) {
  const int64_t rows = s.heads() * s.S;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return {rows, dim3(unsigned(blocks)), dim3(kWarpsPerBlock * kWarpSize)};
}

// Calls launch(T{}, std::integral_constant<int, V>{}) with the widest vector a row of S elements allows.
template <typename Launch>
Result launch_rows(DType dtype, int64_t S, const char* kernel, Launch&& launch) {
  return launch_for_dtype(dtype, kernel, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVector = int(kVectorBytes / sizeof(T));
    if (S % kVector == 0)
      launch(tag, std::integral_constant<int, kVector>{});
    else
      launch(tag, std::integral_constant<int, 1>{});
  });
}

Result softmax_forward(const CaseSpec& spec, void* x, float* lse, cudaStream_t stream) {
  const RowGrid g = row_grid(spec.shape);
  const bool causal = spec.mask == Mask::kCausal;
  return launch_rows(spec.dtype, spec.shape.S, "softmax_forward_kernel", [&](auto tag, auto vector) {
    using T = decltype(tag);
    softmax_forward_kernel<T, decltype(vector)::value>
        <<<g.grid, g.block, 0, stream>>>(static_cast<T*>(x), lse, g.rows, spec.shape.S, causal);
  });
}

Result softmax_backward(const CaseSpec& spec, const void* p, const void* dp, void* ds, cudaStream_t stream) {
  const RowGrid g = row_grid(spec.shape);
  const bool causal = spec.mask == Mask::kCausal;
  return launch_rows(spec.dtype, spec.shape.S, "softmax_backward_kernel", [&](auto tag, auto vector) {
    using T = decltype(tag);
    softmax_backward_kernel<T, decltype(vector)::value><<<g.grid, g.block, 0, stream>>>(
        static_cast<const T*>(p), static_cast<const T*>(dp), static_cast<T*>(ds), g.rows, spec.shape.S, causal);
  });
}

// One column-major strided-batched GEMM over the heads: C = alpha · op(A) op(B), all of dtype.
struct Gemm {
  cublasOperation_t op_a, op_b;
  int m, n, k;
  const void* a;
  int lda;
  long long stride_a;
  const void* b;
  int ldb;
  long long stride_b;
  void* c;
  int ldc;
  long long stride_c;
};

class CublasUnfused final : public Impl {
 public:
  explicit CublasUnfused(cublasHandle_t cublas) : cublas_(cublas) {}

  const char* name() const override { return kImplCublasUnfused; }
  bool supports(Mode mode) const override { return mode != Mode::kRecomputeLse; }

  size_t planned_workspace_bytes(const CaseSpec& spec) const override {
    if (!is_backward(spec.mode)) return 0;  // the forward works in P's memory
    return role_bytes(Role::kP, spec);  // dS (and S, P in recompute)
  }

  Result workspace_bytes(const CaseSpec& spec, const TensorSet&, size_t* bytes) const override {
    *bytes = planned_workspace_bytes(spec);
    return {};
  }

  Result call(const CaseSpec& spec, const TensorSet& set, Workspace workspace, cudaStream_t stream) override {
    if (!supports(spec.mode)) return Result(std::string(name()) + " has no " + mode_name(spec.mode) + " mode");
    QKB_CUBLAS(cublasSetStream(cublas_, stream));
    const Shape& s = spec.shape;
    const float scale = float(1.0 / std::sqrt(double(s.D)));
    switch (spec.mode) {
      case Mode::kForward:
        QKB_TRY(scores(spec, set, scale, set[Role::kP]));
        return softmax_forward(spec, set[Role::kP], static_cast<float*>(set[Role::kLse]), stream);
      case Mode::kSavedP:
        QKB_TRY(softmax_backward(spec, set[Role::kP], set[Role::kDp], workspace.data, stream));
        return input_gradients(spec, set, scale, workspace.data);
      case Mode::kRecompute:
        QKB_TRY(scores(spec, set, scale, workspace.data));
        QKB_TRY(softmax_forward(spec, workspace.data, nullptr, stream));
        QKB_TRY(softmax_backward(spec, workspace.data, set[Role::kDp], workspace.data, stream));
        return input_gradients(spec, set, scale, workspace.data);
      case Mode::kRecomputeLse: break;
    }
    return Result("unreachable mode");
  }

 private:
  Result gemm(DType dtype, int64_t heads, float alpha, const Gemm& g) {
    const float beta = 0;
    const cudaDataType_t type = cuda_data_type(dtype);
    return cublas_result(
        cublasGemmStridedBatchedEx(cublas_, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, g.a, type, g.lda, g.stride_a, g.b,
                                   type, g.ldb, g.stride_b, &beta, g.c, type, g.ldc, g.stride_c, int(heads),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
  }

  // Row-major (S, S) out = scale · Q Kᵀ, i.e. column-major outᵀ = scale · K Qᵀ.
  Result scores(const CaseSpec& spec, const TensorSet& set, float scale, void* out) {
    const Shape& s = spec.shape;
    const int S = int(s.S), D = int(s.D);
    const long long qk = s.S * s.D, pp = s.S * s.S;
    return gemm(spec.dtype, s.heads(), scale,
                {CUBLAS_OP_T, CUBLAS_OP_N, S, S, D, set[Role::kK], D, qk, set[Role::kQ], D, qk, out, S, pp});
  }

  // Row-major dQ = scale · dS K and dK = scale · dSᵀ Q, i.e. column-major dQᵀ = scale · Kᵀ dSᵀ and
  // dKᵀ = scale · Qᵀ dS.
  Result input_gradients(const CaseSpec& spec, const TensorSet& set, float scale, const void* ds) {
    const Shape& s = spec.shape;
    const int S = int(s.S), D = int(s.D);
    const long long qk = s.S * s.D, pp = s.S * s.S;
    QKB_TRY(gemm(spec.dtype, s.heads(), scale,
                 {CUBLAS_OP_N, CUBLAS_OP_N, D, S, S, set[Role::kK], D, qk, ds, S, pp, set[Role::kDq], D, qk}));
    return gemm(spec.dtype, s.heads(), scale,
                {CUBLAS_OP_N, CUBLAS_OP_T, D, S, S, set[Role::kQ], D, qk, ds, S, pp, set[Role::kDk], D, qk});
  }

  cublasHandle_t cublas_;
};

}  // namespace

std::unique_ptr<Impl> make_cublas_unfused_impl(cublasHandle_t cublas) { return std::make_unique<CublasUnfused>(cublas); }

}  // namespace qkbench
