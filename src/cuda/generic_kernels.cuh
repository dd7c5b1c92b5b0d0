// The generic kernels: correct for every shape the API accepts (any S, tails, strides with a unit last
// dimension, GQA, both masks, both backward modes), on tensor cores for 16-bit types. They favour
// clarity over speed; the fast Hopper kernels are separate. Four kernels, each a loop over tiles:
//
//   row_stats   per row block:    LSE_i (unless given) and D_i = Σ_j P_ij dP_ij    → workspace
//   write_p     per row block:    P = exp(S − LSE), dense (forward)
//   dq          per row block:    dQ = scale · Σ_j dS_ij K_j                     (no atomics)
//   dk          per column block: dK = scale · Σ_h Σ_i dS_ij Q_i                 (no atomics)
//
// All reductions run in a fixed order, so results are bitwise reproducible.
#pragma once

#include <cute/algorithm/cooperative_gemm.hpp>
#include <cute/tensor.hpp>

#include "cuda/generic_config.h"
#include "problem.h"

namespace qksoftmax::cuda::generic {

using namespace cute;

// A per-row float vector (b, h, row), e.g. LSE or D.
struct RowVec {
  float* ptr = nullptr;
  int64_t sb = 0, sh = 0, sr = 0;
  __host__ __device__ int64_t offset(int64_t b, int64_t h, int64_t r) const {
    return b * sb + h * sh + r * sr;
  }
};

struct Params {
  Problem prob;
  RowVec lse;        // read by write_p, dq, dk; written by row_stats unless lse_given
  RowVec delta;      // D; written by row_stats in backward
  bool lse_given;    // lse holds the caller's LSE: row_stats computes only D
};

// Coordinates of a block: (b, h, tile) from a flat block index (tile: an index or a first row).
struct TileCoord {
  int64_t b, h, tile;
};
__device__ inline TileCoord tile_coord(int64_t tiles_per_head, int64_t heads) {
  const int64_t flat = blockIdx.x;
  return {flat / (tiles_per_head * heads), (flat / tiles_per_head) % heads, flat % tiles_per_head};
}

template <class Cfg>
__device__ typename Cfg::SharedStorage& shared_storage() {
  extern __shared__ __align__(16) char smem_raw[];
  return *reinterpret_cast<typename Cfg::SharedStorage*>(smem_raw);
}

// The (b, h, first row) of a block of a row-block grid.
template <class Cfg>
__device__ inline TileCoord row_tile(const Problem& prob) {
  const TileCoord t = tile_coord((prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM, prob.Hq);
  return {t.b, t.h, t.tile * Cfg::kBlockM};
}

__device__ inline float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Running statistics of one softmax row: max, Σ exp(s − max) and Σ exp(s − max)·dP.
struct OnlineRow {
  float max = -INFINITY, sum = 0.0f, dot = 0.0f;

  // Folds a chunk of the row (s = −inf where masked) into the statistics, rescaled to the new maximum.
  // Max and Sum reduce over the lanes that share the row; every one of them must call.
  template <int kCols, class Max, class Sum>
  __device__ void fold(const float (&s)[kCols], const float (&dp)[kCols], Max lanes_max, Sum lanes_sum) {
    float chunk_max = -INFINITY;
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) chunk_max = fmaxf(chunk_max, s[c]);
    const float new_max = fmaxf(max, lanes_max(chunk_max));
    const float base = new_max == -INFINITY ? 0.0f : new_max;  // nothing live yet: the sums stay 0
    float chunk_sum = 0.0f, chunk_dot = 0.0f;
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      const float e = expf(s[c] - base);
      chunk_sum += e;
      chunk_dot += e * dp[c];
    }
    const float rescale = expf(max - base);
    sum = sum * rescale + lanes_sum(chunk_sum);
    dot = dot * rescale + lanes_sum(chunk_dot);
    max = new_max;
  }
  __device__ float lse() const { return sum > 0.0f ? max + logf(sum) : -INFINITY; }
  __device__ float delta() const { return sum > 0.0f ? dot / sum : 0.0f; }
};

template <class Element>
__device__ inline float to_float(Element v) {
  return static_cast<float>(v);
}

// Loads rows [r0, r0 + kRows) of a (row, kHeadDim) operand slice into shared memory; rows past `rows`
// are zero so that tails add nothing to products.
template <class Cfg, int kRows>
__device__ void load_rows(typename Cfg::Element* smem, const Operand& op, int64_t b, int64_t h,
                          int64_t r0, int64_t rows) {
  using Element = typename Cfg::Element;
  const Element* base = static_cast<const Element*>(op.ptr);
  for (int idx = threadIdx.x; idx < kRows * Cfg::kHeadDim; idx += Cfg::kThreads) {
    const int r = idx / Cfg::kHeadDim, c = idx % Cfg::kHeadDim;
    const int64_t row = r0 + r;
    smem[r * Cfg::kRowStride + c] = row < rows ? base[op.offset(b, h, row, c)] : Element(0.0f);
  }
}

// Absent vectors (LSE in saved-P mode) load nothing.
template <class Cfg>
__device__ void load_row_vec(float* smem, const RowVec& v, int64_t b, int64_t h, int64_t r0,
                             int64_t rows) {
  if (v.ptr == nullptr) return;
  for (int r = threadIdx.x; r < Cfg::kBlockM; r += Cfg::kThreads) {
    smem[r] = r0 + r < rows ? v.ptr[v.offset(b, h, r0 + r)] : 0.0f;
  }
}

// Accumulates A · Bᵀ of two shared-memory operands (M, K) and (N, K) into a register fragment, in
// chunks of kGemmK along K.
template <class Cfg, class TA, class LA, class TB, class LB, class Acc>
__device__ void gemm_accumulate(const Tensor<TA, LA>& sA, const Tensor<TB, LB>& sB, Acc& acc) {
  typename Cfg::TiledMma mma;
  constexpr int kM = size<0>(LA{}), kN = size<0>(LB{}), kK = size<1>(LA{});
  static_assert(kK % Cfg::kGemmK == 0);
  CUTE_UNROLL
  for (int kc = 0; kc < kK / Cfg::kGemmK; ++kc) {
    cooperative_gemm(threadIdx.x, mma, local_tile(sA, make_shape(Int<kM>{}, Int<Cfg::kGemmK>{}), make_coord(0, kc)),
                     local_tile(sB, make_shape(Int<kN>{}, Int<Cfg::kGemmK>{}), make_coord(0, kc)), acc);
  }
}

// Shared-memory tensors of a block, with their shapes.
template <class Cfg>
struct SmemTensors {
  using Element = typename Cfg::Element;
  static constexpr int M = Cfg::kBlockM, N = Cfg::kBlockN, Dh = Cfg::kHeadDim;
  typename Cfg::SharedStorage& st;

  CUTE_HOST_DEVICE auto sQ() const {  // (M, Dh)
    return make_tensor(make_smem_ptr(st.q), make_layout(make_shape(Int<M>{}, Int<Dh>{}),
                                                        make_stride(Int<Cfg::kRowStride>{}, _1{})));
  }
  CUTE_HOST_DEVICE auto sQt() const {  // (Dh, M): Qᵀ
    return make_tensor(make_smem_ptr(st.q), make_layout(make_shape(Int<Dh>{}, Int<M>{}),
                                                        make_stride(_1{}, Int<Cfg::kRowStride>{})));
  }
  CUTE_HOST_DEVICE auto sK() const {  // (N, Dh)
    return make_tensor(make_smem_ptr(st.k), make_layout(make_shape(Int<N>{}, Int<Dh>{}),
                                                        make_stride(Int<Cfg::kRowStride>{}, _1{})));
  }
  CUTE_HOST_DEVICE auto sKt() const {  // (Dh, N): Kᵀ
    return make_tensor(make_smem_ptr(st.k), make_layout(make_shape(Int<Dh>{}, Int<N>{}),
                                                        make_stride(_1{}, Int<Cfg::kRowStride>{})));
  }
  CUTE_HOST_DEVICE auto sS() const {  // (M, N) fp32
    return make_tensor(make_smem_ptr(st.s), make_layout(make_shape(Int<M>{}, Int<N>{}),
                                                        make_stride(Int<Cfg::kScoreStride>{}, _1{})));
  }
  CUTE_HOST_DEVICE auto sdS() const {  // (M, N)
    return make_tensor(make_smem_ptr(st.ds), make_layout(make_shape(Int<M>{}, Int<N>{}),
                                                         make_stride(Int<Cfg::kDsStride>{}, _1{})));
  }
  CUTE_HOST_DEVICE auto sdSt() const {  // (N, M): dSᵀ
    return make_tensor(make_smem_ptr(st.ds), make_layout(make_shape(Int<N>{}, Int<M>{}),
                                                         make_stride(_1{}, Int<Cfg::kDsStride>{})));
  }
};

// sS = scale · sQ sKᵀ (fp32). Ends with a barrier.
template <class Cfg>
__device__ void compute_scores(const SmemTensors<Cfg>& sm, float scale) {
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(threadIdx.x);
  Tensor sS = sm.sS();                                  // (M, N)
  Tensor tSsS = thr_mma.partition_C(sS);                // (MMA, MMA_M, MMA_N)
  Tensor tSrS = thr_mma.partition_fragment_C(sS);       // (MMA, MMA_M, MMA_N) fp32
  clear(tSrS);
  gemm_accumulate<Cfg>(sm.sQ(), sm.sK(), tSrS);
  CUTE_UNROLL
  for (int i = 0; i < size(tSrS); ++i) tSsS(i) = tSrS(i) * scale;
  __syncthreads();
}

// Number of column blocks that row block [m0, m0 + kBlockM) sees.
template <class Cfg>
__device__ inline int64_t col_blocks_for_rows(const Problem& prob, int64_t m0) {
  const int64_t last_row = min(m0 + Cfg::kBlockM, prob.Sq) - 1;
  return (prob.col_end(last_row) + Cfg::kBlockN - 1) / Cfg::kBlockN;
}

// sdS = P ∘ (dP − D) for tile (m0, n0) of head (b, h); P from sS and the row LSE (recompute) or read
// from p (saved-P). Positions outside the problem or masked are 0 and their p/dp are never read.
// Ends with a barrier.
template <class Cfg>
__device__ void compute_ds(const SmemTensors<Cfg>& sm, const Problem& prob, int64_t b, int64_t h,
                           int64_t m0, int64_t n0) {
  using Element = typename Cfg::Element;
  const Element* p = static_cast<const Element*>(prob.p.ptr);
  const Element* dp = static_cast<const Element*>(prob.dp.ptr);
  const bool saved_p = prob.mode == BackwardMode::kSavedP;
  for (int idx = threadIdx.x; idx < Cfg::kBlockM * Cfg::kBlockN; idx += Cfg::kThreads) {
    const int r = idx / Cfg::kBlockN, c = idx % Cfg::kBlockN;
    const int64_t i = m0 + r, j = n0 + c;
    float ds = 0.0f;
    if (i < prob.Sq && j < prob.col_end(i)) {
      const float prob_ij = saved_p ? to_float(p[prob.p.offset(b, h, i, j)])
                                    : expf(sm.st.s[r * Cfg::kScoreStride + c] - sm.st.lse[r]);
      ds = prob_ij * (to_float(dp[prob.dp.offset(b, h, i, j)]) - sm.st.delta[r]);
    }
    sm.st.ds[r * Cfg::kDsStride + c] = Element(ds);
  }
  __syncthreads();
}

// Writes scale · acc, a (rows, kHeadDim) register fragment of the tiled MMA, to rows [r0, r0 + rows)
// of an operand slice, skipping rows past `limit`.
template <class Cfg, int kRows, class Acc>
__device__ void store_rows(const Acc& acc, const Operand& out, int64_t b, int64_t h, int64_t r0,
                           int64_t limit, float scale) {
  using Element = typename Cfg::Element;
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(threadIdx.x);
  Tensor cO = make_identity_tensor(make_shape(Int<kRows>{}, Int<Cfg::kHeadDim>{}));  // (rows, Dh) → (r, c)
  Tensor tOcO = thr_mma.partition_C(cO);                                              // (MMA, MMA_M, MMA_N)
  Element* base = static_cast<Element*>(out.ptr);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) {
    const int64_t row = r0 + get<0>(tOcO(i));
    if (row < limit) base[out.offset(b, h, row, get<1>(tOcO(i)))] = Element(acc(i) * scale);
  }
}

// One block per (b, h, row block). Lanes of a warp walk the columns of one row at a time.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) row_stats_kernel(const Params params) {
  auto& st = shared_storage<Cfg>();
  const SmemTensors<Cfg> sm{st};
  using Element = typename Cfg::Element;
  constexpr int kRowsPerWarp = Cfg::kBlockM / Cfg::kWarps;
  constexpr int kColsPerLane = Cfg::kBlockN / 32;

  const Problem& prob = params.prob;
  const auto [b, h, m0] = row_tile<Cfg>(prob);
  const bool backward = prob.pass == Pass::kBackward;
  const bool saved_p = backward && prob.mode == BackwardMode::kSavedP;
  const bool need_scores = !saved_p;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Element* p = static_cast<const Element*>(prob.p.ptr);
  const Element* dp = static_cast<const Element*>(prob.dp.ptr);

  if (need_scores) load_rows<Cfg, Cfg::kBlockM>(st.q, prob.q, b, h, m0, prob.Sq);
  if (params.lse_given) load_row_vec<Cfg>(st.lse, params.lse, b, h, m0, prob.Sq);

  // Running statistics of the rows this warp owns (identical in every lane); dot alone when P is known.
  OnlineRow rows[kRowsPerWarp];

  const int64_t kv_head = h / prob.group();
  const int64_t col_blocks = col_blocks_for_rows<Cfg>(prob, m0);
  for (int64_t nb = 0; nb < col_blocks; ++nb) {
    const int64_t n0 = nb * Cfg::kBlockN;
    if (need_scores) {
      load_rows<Cfg, Cfg::kBlockN>(st.k, prob.k, b, kv_head, n0, prob.Sk);
      __syncthreads();
      compute_scores(sm, prob.scale);
    }
    CUTE_UNROLL
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t i = m0 + r;
      if (i >= prob.Sq) continue;  // uniform across the warp
      const int64_t end = prob.col_end(i);
      float s[kColsPerLane], dpv[kColsPerLane];
      bool live[kColsPerLane];
      CUTE_UNROLL
      for (int cc = 0; cc < kColsPerLane; ++cc) {
        const int c = lane + 32 * cc;
        const int64_t j = n0 + c;
        live[cc] = j < end;
        s[cc] = live[cc] && need_scores ? st.s[r * Cfg::kScoreStride + c] : -INFINITY;
        dpv[cc] = live[cc] && backward ? to_float(dp[prob.dp.offset(b, h, i, j)]) : 0.0f;
      }
      if (saved_p || params.lse_given) {  // P is known: D accumulates directly
        float dot = 0.0f;
        CUTE_UNROLL
        for (int cc = 0; cc < kColsPerLane; ++cc) {
          if (!live[cc]) continue;
          const int64_t j = n0 + lane + 32 * cc;
          const float prob_ij = saved_p ? to_float(p[prob.p.offset(b, h, i, j)]) : expf(s[cc] - st.lse[r]);
          dot += prob_ij * dpv[cc];
        }
        rows[rr].dot += warp_sum(dot);
      } else {
        rows[rr].fold(s, dpv, [](float v) { return warp_max(v); }, [](float v) { return warp_sum(v); });
      }
    }
    __syncthreads();  // sK and sS are overwritten by the next column block
  }

  if (lane != 0) return;
  CUTE_UNROLL
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = m0 + warp * kRowsPerWarp + rr;
    if (i >= prob.Sq) continue;
    const bool computes_lse = !saved_p && !params.lse_given;
    if (computes_lse) params.lse.ptr[params.lse.offset(b, h, i)] = rows[rr].lse();
    if (backward) params.delta.ptr[params.delta.offset(b, h, i)] = computes_lse ? rows[rr].delta() : rows[rr].dot;
  }
}

// Forward: one block per (b, h, row block) writes its dense P stripe.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) write_p_kernel(const Params params) {
  auto& st = shared_storage<Cfg>();
  const SmemTensors<Cfg> sm{st};
  using Element = typename Cfg::Element;

  const Problem& prob = params.prob;
  const auto [b, h, m0] = row_tile<Cfg>(prob);
  const int64_t kv_head = h / prob.group();
  Element* out = static_cast<Element*>(prob.out_p.ptr);

  load_rows<Cfg, Cfg::kBlockM>(st.q, prob.q, b, h, m0, prob.Sq);
  load_row_vec<Cfg>(st.lse, params.lse, b, h, m0, prob.Sq);
  __syncthreads();
  const int64_t live_blocks = col_blocks_for_rows<Cfg>(prob, m0);
  const int64_t all_blocks = (prob.Sk + Cfg::kBlockN - 1) / Cfg::kBlockN;
  for (int64_t nb = 0; nb < all_blocks; ++nb) {
    const int64_t n0 = nb * Cfg::kBlockN;
    const bool live_block = nb < live_blocks;
    if (live_block) {
      load_rows<Cfg, Cfg::kBlockN>(st.k, prob.k, b, kv_head, n0, prob.Sk);
      __syncthreads();
      compute_scores(sm, prob.scale);
    }
    for (int idx = threadIdx.x; idx < Cfg::kBlockM * Cfg::kBlockN; idx += Cfg::kThreads) {
      const int r = idx / Cfg::kBlockN, c = idx % Cfg::kBlockN;
      const int64_t i = m0 + r, j = n0 + c;
      if (i >= prob.Sq || j >= prob.Sk) continue;
      const bool live = live_block && j < prob.col_end(i) && st.lse[r] != -INFINITY;
      out[prob.out_p.offset(b, h, i, j)] = Element(live ? expf(st.s[r * Cfg::kScoreStride + c] - st.lse[r]) : 0.0f);
    }
    __syncthreads();
  }
}

// Backward dQ: one block per (b, h, row block); dQ stays in registers across the column blocks.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dq_kernel(const Params params) {
  auto& st = shared_storage<Cfg>();
  const SmemTensors<Cfg> sm{st};

  const Problem& prob = params.prob;
  const auto [b, h, m0] = row_tile<Cfg>(prob);
  const int64_t kv_head = h / prob.group();
  const bool recompute = prob.mode == BackwardMode::kRecompute;

  typename Cfg::TiledMma mma;
  Tensor tdQrdQ = partition_fragment_C(mma, make_shape(Int<Cfg::kBlockM>{}, Int<Cfg::kHeadDim>{}));  // (MMA, MMA_M, MMA_N) fp32
  clear(tdQrdQ);

  if (recompute) load_rows<Cfg, Cfg::kBlockM>(st.q, prob.q, b, h, m0, prob.Sq);
  load_row_vec<Cfg>(st.lse, params.lse, b, h, m0, prob.Sq);
  load_row_vec<Cfg>(st.delta, params.delta, b, h, m0, prob.Sq);
  const int64_t col_blocks = col_blocks_for_rows<Cfg>(prob, m0);
  for (int64_t nb = 0; nb < col_blocks; ++nb) {
    const int64_t n0 = nb * Cfg::kBlockN;
    load_rows<Cfg, Cfg::kBlockN>(st.k, prob.k, b, kv_head, n0, prob.Sk);
    __syncthreads();
    if (recompute) compute_scores(sm, prob.scale);
    compute_ds(sm, prob, b, h, m0, n0);
    gemm_accumulate<Cfg>(sm.sdS(), sm.sKt(), tdQrdQ);
    __syncthreads();
  }
  store_rows<Cfg, Cfg::kBlockM>(tdQrdQ, prob.dq, b, h, m0, prob.Sq, prob.scale);
}

// Backward dK: one block per (b, key head, column block); dK sums over the group's query heads.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dk_kernel(const Params params) {
  auto& st = shared_storage<Cfg>();
  const SmemTensors<Cfg> sm{st};

  const Problem& prob = params.prob;
  const int64_t col_blocks = (prob.Sk + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const auto [b, kv_head, tile] = tile_coord(col_blocks, prob.Hk);
  const int64_t n0 = tile * Cfg::kBlockN;
  const bool recompute = prob.mode == BackwardMode::kRecompute;
  // Causal: row i sees column n0 only if i ≥ n0.
  const int64_t first_row_block = prob.mask == Mask::kCausal ? n0 / Cfg::kBlockM : 0;
  const int64_t row_blocks = (prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM;

  typename Cfg::TiledMma mma;
  Tensor tdKrdK = partition_fragment_C(mma, make_shape(Int<Cfg::kBlockN>{}, Int<Cfg::kHeadDim>{}));  // (MMA, MMA_N, MMA_D) fp32
  clear(tdKrdK);

  load_rows<Cfg, Cfg::kBlockN>(st.k, prob.k, b, kv_head, n0, prob.Sk);
  for (int64_t h = kv_head * prob.group(); h < (kv_head + 1) * prob.group(); ++h) {
    for (int64_t mb = first_row_block; mb < row_blocks; ++mb) {
      const int64_t m0 = mb * Cfg::kBlockM;
      load_rows<Cfg, Cfg::kBlockM>(st.q, prob.q, b, h, m0, prob.Sq);
      load_row_vec<Cfg>(st.lse, params.lse, b, h, m0, prob.Sq);
      load_row_vec<Cfg>(st.delta, params.delta, b, h, m0, prob.Sq);
      __syncthreads();
      if (recompute) compute_scores(sm, prob.scale);
      compute_ds(sm, prob, b, h, m0, n0);
      gemm_accumulate<Cfg>(sm.sdSt(), sm.sQt(), tdKrdK);
      __syncthreads();
    }
  }
  store_rows<Cfg, Cfg::kBlockN>(tdKrdK, prob.dk, b, kv_head, n0, prob.Sk, prob.scale);
}

}  // namespace qksoftmax::cuda::generic
