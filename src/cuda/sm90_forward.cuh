// Hopper fused forward: P = softmax(mask(scale · Q Kᵀ)) written dense, and LSE.
//
// One CTA per (batch, query head, 128-row block), two per SM; two warpgroups, each owning 64 of the rows.
// The live key blocks of those rows (64 columns each) stream through shared memory twice by TMA:
//   pass 1: S = Q Kᵀ (wgmma) → online row max and sum → LSE;
//   pass 2: S again → P = 2^(S·scale·log2e − LSE·log2e) (masked: 0) → bf16/fp16 tile in shared memory →
//           TMA store (two staging buffers, so a store drains while the next tile is computed).
// Key blocks beyond the mask are stored by TMA from a tile of zeros at the start, where they overlap the
// products. Only tiles that the mask cuts pay for per-element compares. The bound is writing P (every
// element, zeros included): the second product costs tensor time that the stores and the other CTA hide
// (docs/DESIGN.md, "The fused forward").
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90_config.h"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

template <class Element_, int kHeadDim_>
struct ForwardConfig {
  using Element = Element_;
  static constexpr DType kDType = ElementTraits<Element>::kDType;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpgroups = 2;
  static constexpr int kBlockM = 64 * kWarpgroups;  // query rows per CTA, 64 per warpgroup
  static constexpr int kBlockN = 64;                // key columns per step
  static constexpr int kCtasPerSm = 2;              // two CTAs overlap each other's products and stores
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kStages = 2;                 // K tiles in flight
  static constexpr int kOutBuffers = 2;             // P tiles being stored
  static constexpr int kQuad = 4;

  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  using HD = Int<kHeadDim>;

  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<BM, HD>{}));                       // (rows, d)
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<BN, HD, Int<kStages>>{}));         // (cols, d, stage)
  // P staging: kOutBuffers tiles being stored, then one tile of zeros that the masked key blocks are stored from.
  static constexpr int kZeroBuffer = kOutBuffers;
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<BM, BN, Int<kOutBuffers + 1>>{}));  // (rows, cols, buffer)

  // Each warpgroup: its 64 rows × the step's 128 columns.
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BN, HD>, GMMA::Major::K, GMMA::Major::K>(),
      Layout<Shape<Int<kWarpgroups>, _1, _1>>{}));

  using TmaQ = TmaLoad<Element, HD, SmemLayoutQ>;
  using TmaK = TmaLoad<Element, HD, decltype(SmemLayoutK{}(_, _, 0))>;
  using TmaP = decltype(make_tma_copy(
      SM90_TMA_STORE{},
      make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), Shape<int32_t, int32_t, int32_t, int32_t>{},
                  Stride<int64_t, _1, int64_t, int64_t>{}),
      SmemLayoutP{}(_, _, 0)));

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);

  struct Storage {
    alignas(128) cute::array<Element, cosize_v<SmemLayoutQ>> q;
    alignas(128) cute::array<Element, cosize_v<SmemLayoutK>> k;
    alignas(128) cute::array<Element, cosize_v<SmemLayoutP>> p;
    alignas(8) uint64_t k_full[kStages];
    alignas(8) uint64_t q_full;
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));
  // An SM has 228 KB of shared memory, of which each resident CTA takes 1 KB for the system.
  static_assert(kSmemBytes + 1024 <= kSm90SmemPerSm / kCtasPerSm, "the forward's CTAs per SM do not fit");

  struct Params {
    Problem prob;
    TmaQ tma_q;
    TmaK tma_k;
    TmaP tma_p;
  };
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    forward_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using Element = typename Cfg::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages, kQuad = Cfg::kQuad;
  constexpr float kLn2 = 0.6931471805599453f;
  extern __shared__ __align__(128) char smem_raw[];
  auto& st = *reinterpret_cast<typename Cfg::Storage*>(smem_raw);

  const Problem& prob = params.prob;
  const int64_t Sq = prob.Sq, Sk = prob.Sk;
  const float scale_log2 = prob.scale * kLog2e;
  const Operand lse_op = prob.out_lse;
  const KeyRange keys = prob.keys();

  const int64_t row_blocks = (Sq + kBlockM - 1) / kBlockM;
  const int64_t mb = blockIdx.x % row_blocks;
  const int64_t h = (blockIdx.x / row_blocks) % prob.Hq, b = blockIdx.x / row_blocks / prob.Hq;
  const int64_t kv_head = h / prob.group();
  const int64_t m0 = mb * kBlockM;
  const int col_blocks = int((Sk + kBlockN - 1) / kBlockN);
  const int live_blocks = int(generic::col_blocks_for_rows<Cfg>(prob, m0));
  const int tid = threadIdx.x;

  Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});  // (BM, D)
  Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutK{});  // (BN, D, stage)
  Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});  // (BM, BN, buffer)

  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(int32_t(Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
  Tensor mK = params.tma_k.get_tma_tensor(make_shape(int32_t(Sk), HD{}, int32_t(prob.Hk), int32_t(prob.B)));
  Tensor mP = params.tma_p.get_tma_tensor(make_shape(int32_t(Sq), int32_t(Sk), int32_t(prob.Hq), int32_t(prob.B)));

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) Barrier::init(&st.k_full[s], 1);
    Barrier::init(&st.q_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  {  // the zero tile
    constexpr int kVectors = cosize_v<typename Cfg::SmemLayoutP> / (Cfg::kOutBuffers + 1) * sizeof(Element) / sizeof(uint4);
    uint4* zeros = reinterpret_cast<uint4*>(&sP(0, 0, Int<Cfg::kZeroBuffer>{}));
    for (int i = tid; i < kVectors; i += Cfg::kThreads) zeros[i] = make_uint4(0, 0, 0, 0);
    tma_store_fence();  // seen by the TMA stores
  }
  __syncthreads();

  // Thread 0 loads K tile k of the sequence (pass 1 then pass 2 over the live key blocks) into stage k % kStages.
  const int loads = 2 * live_blocks;
  int issued = 0;
  const auto produce = [&](int released) {
    for (; issued < loads && issued - released < kStages; ++issued) {
      const int stage = issued % kStages;
      Barrier::arrive_and_expect_tx(&st.k_full[stage], Cfg::kKBytes);
      Tensor gK = local_tile(mK(_, _, kv_head, b), Shape<BN, HD>{}, make_coord(issued % live_blocks, 0));  // (BN, D)
      tma_load_tile(params.tma_k, st.k_full[stage], gK, sK(_, _, stage));
    }
  };
  if (tid == 0) {
    Barrier::arrive_and_expect_tx(&st.q_full, Cfg::kQBytes);
    Tensor gQ = local_tile(mQ(_, _, h, b), Shape<BM, HD>{}, make_coord(mb, 0));  // (BM, D)
    tma_load_tile(params.tma_q, st.q_full, gQ, sQ);
    produce(0);
  }

  // The masked key blocks of these rows are zeros, stored by TMA from a zero tile at the start, where they
  // drain under the products (the TMA clips the last block at Sk). The live blocks' masked elements are
  // zeroed in pass 2.
  if (tid == 0 && live_blocks < col_blocks) {
    for (int j = live_blocks; j < col_blocks; ++j) {
      Tensor gP = local_tile(mP(_, _, h, b), Shape<BM, BN>{}, make_coord(mb, int64_t(j)));  // (BM, BN)
      tma_store_tile(params.tma_p, sP(_, _, Int<Cfg::kZeroBuffer>{}), gP);
    }
    tma_store_arrive();
  }

  typename Cfg::MmaS mma_s;
  auto thr_s = mma_s.get_thread_slice(tid);
  Tensor tSrS = partition_fragment_C(mma_s, Shape<BM, BN>{});                 // (MMA, MMA_M, MMA_N) fp32
  Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));           // (rows, cols)
  Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<BM, BN>{}));     // (r, c) per element
  Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));           // (rows, cols) → (r, c)
  constexpr int kRows = size<0>(decltype(tScS_rc.layout()){});
  constexpr int kCols = size<1>(decltype(tScS_rc.layout()){});
  static_assert(kCols % 2 == 0, "accumulator columns come in adjacent pairs");

  // Columns of key block j that row m0 + r may see: [0, limit), in [0, kBlockN].
  const auto col_limit = [&](int j, int r) { return keys.cols_in(m0 + r, int64_t(j) * kBlockN, kBlockN); };
  // Only the key blocks that the mask or the last row cuts pay for per-element compares.
  const auto masked = [&](int j) { return keys.cuts(m0, kBlockM, int64_t(j) * kBlockN, kBlockN); };

  // P tiles from the accumulator's layout into shared memory by stmatrix (one instruction per 8 × 8 block).
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_s);
  auto thr_r2s = r2s.get_thread_slice(tid);

  Barrier::wait(&st.q_full, 0);
  int consumed = 0;
  const auto product = [&](int j) {  // S of key block j (the next tile of the sequence) into tSrS
    const int stage = consumed % kStages;
    Barrier::wait(&st.k_full[stage], uint32_t((consumed / kStages) & 1));
    warpgroup_gemm<true>(mma_s, sQ, sK(_, _, stage), tSrS);
  };
  const auto release = [&] {  // the stage of the tile just multiplied is free
    __syncthreads();
    ++consumed;
    if (tid == 0) produce(consumed);
  };

  // Pass 1: online max (log2 domain) and sum per row.
  float row_max[kRows], row_sum[kRows];
  CUTE_UNROLL
  for (int ri = 0; ri < kRows; ++ri) {
    row_max[ri] = -INFINITY;
    row_sum[ri] = 0.0f;
  }
  for (int j = 0; j < live_blocks; ++j) {
    product(j);
    with_mask(masked(j), [&](auto mask) {
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        const int limit = mask ? col_limit(j, get<0>(tScS_rc(ri, 0))) : kBlockN;
        float v[kCols];  // this thread's values of the row, reduced as trees
        CUTE_UNROLL
        for (int ci = 0; ci < kCols; ++ci) {
          v[ci] = !mask || get<1>(tScS_rc(ri, ci)) < limit ? tSrS_rc(ri, ci) * scale_log2 : -INFINITY;
        }
        const float mx = quad_max<kQuad>(fmaxf(tree_reduce(v, MaxOp{}), row_max[ri]));
        float sum = 0.0f;
        if (mx != -INFINITY) {
          CUTE_UNROLL
          for (int ci = 0; ci < kCols; ++ci) {
            v[ci] = !mask || get<1>(tScS_rc(ri, ci)) < limit ? exp2_fast(tSrS_rc(ri, ci) * scale_log2 - mx) : 0.0f;
          }
          sum = tree_reduce(v, SumOp{});
        }
        sum = quad_sum<kQuad>(sum);
        row_sum[ri] = (row_max[ri] == -INFINITY ? 0.0f : row_sum[ri] * exp2_fast(row_max[ri] - mx)) + sum;
        row_max[ri] = mx;
      }
    });
    release();
  }
  float lse2[kRows];
  CUTE_UNROLL
  for (int ri = 0; ri < kRows; ++ri) {
    const bool any = row_max[ri] != -INFINITY;
    lse2[ri] = any ? row_max[ri] + log2f(row_sum[ri]) : INFINITY;
    const int64_t row = m0 + get<0>(tScS_rc(ri, 0));
    if (lse_op.present() && tid % kQuad == 0 && row < Sq) {
      static_cast<float*>(lse_op.ptr)[lse_op.offset(b, h, row)] = any ? lse2[ri] * kLn2 : -INFINITY;
    }
  }

  // Pass 2: P tiles, stored by TMA from two staging buffers.
  for (int j = 0; j < live_blocks; ++j) {
    const int buffer = j % Cfg::kOutBuffers;
    product(j);
    Tensor tSrP = make_fragment_like<Element>(tSrS);                    // (MMA, MMA_M, MMA_N)
    Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));  // (rows, cols)
    with_mask(masked(j), [&](auto mask) {
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        const int limit = mask ? col_limit(j, get<0>(tScS_rc(ri, 0))) : kBlockN;
        CUTE_UNROLL
        for (int ci = 0; ci < kCols; ++ci) {
          const bool keep = !mask || get<1>(tScS_rc(ri, ci)) < limit;
          tSrP_rc(ri, ci) = Element(keep ? exp2_fast(tSrS_rc(ri, ci) * scale_log2 - lse2[ri]) : 0.0f);
        }
      }
    });
    // The tile goes to its staging buffer once the store that last read that buffer is done.
    if (tid == 0) tma_store_wait<Cfg::kOutBuffers - 1>();
    __syncthreads();
    copy(r2s, thr_r2s.retile_S(tSrP), thr_r2s.partition_D(sP(_, _, buffer)));
    tma_store_fence();  // the threads' writes of the tile, seen by the TMA store
    release();
    if (tid == 0) {
      Tensor gP = local_tile(mP(_, _, h, b), Shape<BM, BN>{}, make_coord(mb, int64_t(j)));  // (BM, BN)
      tma_store_tile(params.tma_p, sP(_, _, buffer), gP);
      tma_store_arrive();
    }
  }
  if (tid == 0) tma_store_wait<0>();
}

}  // namespace qksoftmax::cuda::sm90
