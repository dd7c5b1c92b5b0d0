// Hopper fused backward for rows that fit one thread-block cluster (Sk ≤ kMaxCluster · kBlockN): the
// schedule of docs/DESIGN.md ("one cluster per head, row resident across the cluster").
//
// One cluster per (batch, key head); CTA r of the cluster owns key columns [128 r, 128 r + 128) — its K tile
// and its dK accumulator stay on chip for the whole head (group). The row blocks of every query head of the
// group stream through (Q, dP and, in saved-P mode, P tiles by TMA). Per row block t, every CTA:
//   S = Q Kᵀ over its columns (recompute) → per-row partial statistics (max, Σe, Σe·dP; saved-P: Σ P·dP)
//   → exchanged across the cluster (each CTA reads every CTA's partials through distributed shared memory)
//   → LSE and D of the whole row → P, dS = P ∘ (dP − D) → dK += dSᵀ Q, dQ partial = dS K
//   → the dQ partial stays in the CTA's shared memory; one step later the CTA owning each slice of head
//     dimensions reads the partials of every CTA with live columns, sums, scales and stores its slice.
// So dP (and P) cross HBM once and there are three GEMMs per live element in recompute mode (two in saved-P):
// the ceilings of the SOL model. The exchange of row block t + 1's statistics is in flight while row block
// t's products run: the cluster barrier is split (arrive after writing, wait one step later). Float atomics
// on (distributed) shared memory would be compare-and-swap loops, hence the reads.
//
// Cluster barrier protocol, phase t (all threads of all CTAs arrive once and wait once per phase):
//   arrive(t) follows the writes of statistics(t) and of the dQ partials of step t − 1;
//   wait(t)   precedes the reads of statistics(t) and of the dQ partials of step t − 1.
// A CTA rewrites a slot only after a later phase completed, so 2 statistics and 2 dQ slots suffice, and every
// remote access of a CTA's shared memory is finished once phase steps + 1 completes.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90_config.h"
#include "cuda/sm90_instances.h"
#include "cuda/sm90_step.cuh"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

// (Q, dP[, P]) stages: P doubles a stage, and the statistics and dQ slots take the rest of shared memory.
template <class Element_, int kHeadDim_, bool kSavedP_>
struct FusedConfig : StepTiles<Element_, kHeadDim_, kSavedP_, kSavedP_ ? 2 : 3> {
  using Base = StepTiles<Element_, kHeadDim_, kSavedP_, kSavedP_ ? 2 : 3>;
  using Element = Element_;
  static constexpr DType kDType = ElementTraits<Element>::kDType;
  static constexpr int kMinCluster = 2;     // a one-column-block row still runs as a pair (the dQ slots fit)
  static constexpr int kMaxCluster = 8;     // the portable cluster size
  static constexpr int64_t kMaxSk = int64_t(kMaxCluster) * Base::kBlockN;
  static_assert(kMaxSk == kSm90FusedMaxSk, "dispatch and kernel agree on the rows a cluster holds");
  static constexpr int kStatSlots = 2;
  static constexpr int kDqSlots = 2;
  static constexpr int kDqRow = Base::kHeadDim + 8;  // floats per row of a dQ partial: rows 8 banks apart (no conflicts)
  static constexpr int kQuad = 4;

  struct Storage : Base::Tiles {
    alignas(16) float4 stats[kStatSlots][Base::kWarpgroups][Base::kBlockM];  // (max·log2e, Σe, Σe·dP, unused) per row
    alignas(16) float dq[kDqSlots][Base::kBlockM * kDqRow];  // this CTA's dQ partial (rows, d), per step
    alignas(8) uint64_t stage_full[Base::kStages];
    alignas(8) uint64_t k_full;
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));

  struct Params {
    Problem prob;
    typename Base::Loads tma;
    int cluster;   // CTAs per cluster: a power of two in [kMinCluster, kMaxCluster]
    int dq_slice;  // head dimensions of dQ reduced and stored by each CTA: kHeadDim / cluster
  };

  // CTAs per cluster for a key length: enough 128-column blocks, rounded up to a power of two.
  static constexpr int cluster_for(int64_t sk) {
    int c = kMinCluster;
    while (int64_t(c) * Base::kBlockN < sk) c *= 2;
    return c;
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fused_backward_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using Element = typename Cfg::Element;
  using Barrier = cutlass::arch::ClusterTransactionBarrier;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  constexpr bool kSavedP = Cfg::kSavedP;
  constexpr int kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages, kQuad = Cfg::kQuad;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(128) char smem_raw[];
  auto& st = *reinterpret_cast<typename Cfg::Storage*>(smem_raw);

  const Problem& prob = params.prob;
  const int cluster = params.cluster, dq_slice = params.dq_slice;
  // The fields read in the loops, in registers (prob lives in parameter memory).
  const int64_t Sq = prob.Sq, Sk = prob.Sk, group = prob.group();
  const float scale = prob.scale;
  const Operand dq_op = prob.dq;
  const KeyRange keys = prob.keys();
  const uint32_t rank = blockIdx.x % cluster;  // the cluster spans consecutive blocks along x
  const int64_t head_block = blockIdx.x / cluster;  // (batch, key head)
  const int64_t b = head_block / prob.Hk, kv_head = head_block % prob.Hk;
  const int64_t n0 = int64_t(rank) * kBlockN;
  // Step indices fit 32 bits (the launch checks): their divisions stay cheap.
  const int row_blocks = int((Sq + kBlockM - 1) / kBlockM);
  const int steps = row_blocks * int(group);  // (query head of the group, row block)
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const float scale_log2 = scale * kLog2e;

  const auto head_of = [&](int t) { return kv_head * group + t / row_blocks; };
  const auto row0_of = [&](int t) { return int64_t(t % row_blocks) * kBlockM; };
  // One past the last key column that some row of step t may see.
  const auto step_end = [&](int t) { return keys.col_end(min(row0_of(t) + kBlockM, Sq) - 1); };
  // A step is live for this CTA when some element of its tile is unmasked.
  const auto live = [&](int t) { return n0 < step_end(t); };

  Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});       // (BM, D, ST)
  Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});     // (D, BM, ST)
  Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutK{});       // (BN, D)
  Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKt{});     // (D, BN)
  Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});     // (BM, BN, ST)
  Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});       // (BM, BN, ST), saved-P
  Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS{});    // (BM, BN)
  Tensor sdSt = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdSt{});  // (BN, BM)

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) Barrier::init(&st.stage_full[s], 1);
    Barrier::init(&st.k_full, 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // Thread 0 issues the loads of live steps, at most kStages ahead of the consumers.
  int load_step = 0;
  int loaded = 0;
  const auto produce = [&](int released) {
    for (; load_step < steps && loaded - released < kStages; ++load_step) {
      if (!live(load_step)) continue;
      const int stage = int(loaded % kStages);
      load_step_tiles<Cfg>(params.tma, prob, st, st.stage_full[stage], stage, b, head_of(load_step),
                           load_step % row_blocks, int64_t(rank));
      ++loaded;
    }
  };
  const bool has_columns = n0 < Sk;
  if (tid == 0 && has_columns) {
    load_k_tile<Cfg>(params.tma, prob, st, st.k_full, b, kv_head, int64_t(rank));
    produce(0);
  }

  typename Cfg::MmaS mma_s;
  typename Cfg::MmadQ mma_dq;
  typename Cfg::MmadK mma_dk;
  auto thr_s = mma_s.get_thread_slice(tid);
  Tensor tSrS = partition_fragment_C(mma_s, Shape<BM, BN>{});      // (MMA, MMA_M, MMA_N) fp32, step t
  Tensor tSrSn = partition_fragment_C(mma_s, Shape<BM, BN>{});     // (MMA, MMA_M, MMA_N) fp32, step t + 1
  Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<BN, HD>{});   // (MMA, MMA_N, MMA_D) fp32
  clear(tdKrdK);
  Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<BM, BN>{}));  // (r, c) per element
  Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));         // (rows, cols) → (r, c)
  Tensor tdQcdQ = mma_dq.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<BM, HD>{}));  // (r, d)
  constexpr int kRows = size<0>(decltype(tScS_rc.layout()){});
  constexpr int kCols = size<1>(decltype(tScS_rc.layout()){});
  static_assert(kCols % 2 == 0, "accumulator columns come in adjacent pairs");
  // Columns of this CTA's block that row m0 + r may see: [0, limit), in [0, kBlockN].
  const auto col_limit = [&](int64_t m0, int r) { return keys.cols_in(m0 + r, n0, kBlockN); };
  // Only the tiles that the mask or the last row cuts pay for per-element compares.
  const auto masked = [&](int64_t m0) { return keys.cuts(m0, kBlockM, n0, kBlockN); };

  // 16-bit tiles between shared memory and the accumulator's layout by ldmatrix / stmatrix: one instruction
  // per 8 × 8 block of a warp instead of a 32-bit access (and its swizzled address) per column pair.
  auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_s);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_s);
  auto thr_s2r = s2r.get_thread_slice(tid);
  auto thr_r2s = r2s.get_thread_slice(tid);
  // This thread's share of a (rows, cols) tile of stage `stage`, loaded into `frag` (MMA, MMA_M, MMA_N),
  // which its caller views as (rows, cols) with rowcol.
  const auto load_share = [&](auto& tile, int stage, auto& frag) {
    copy(s2r, thr_s2r.partition_S(tile(_, _, stage)), thr_s2r.retile_D(frag));
  };

  // This warpgroup's partial statistics of step t over its 64 columns, written to slot t % kStatSlots.
  // Recompute: (max of S·scale·log2e, Σ 2^(S' − max), Σ 2^(S' − max)·dP); saved-P: (0, 0, Σ P·dP).
  const auto write_partials = [&](auto& acc, int t, int stage) {
    Tensor acc_rc = make_tensor(acc.data(), rowcol(acc.layout()));  // (rows, cols)
    Tensor tSrdP = make_fragment_like<Element>(tSrS);                   // (MMA, MMA_M, MMA_N)
    load_share(sdP, stage, tSrdP);
    Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));  // (rows, cols)
    Tensor tSrP = make_fragment_like<Element>(tSrS);                    // (MMA, MMA_M, MMA_N), saved-P
    if constexpr (kSavedP) load_share(sP, stage, tSrP);
    Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));  // (rows, cols), saved-P
    const int64_t m0 = row0_of(t);
    with_mask(masked(m0), [&](auto mask) {
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        const int r = get<0>(tScS_rc(ri, 0));
        const int limit = mask ? col_limit(m0, r) : kBlockN;
        float mx = -INFINITY, sum = 0.0f, dot = 0.0f;
        float v[kCols];  // this thread's terms of the row, reduced as trees
        if constexpr (kSavedP) {
          CUTE_UNROLL
          for (int ci = 0; ci < kCols; ++ci) {
            const bool keep = !mask || get<1>(tScS_rc(ri, ci)) < limit;
            v[ci] = keep ? float(tSrP_rc(ri, ci)) * float(tSrdP_rc(ri, ci)) : 0.0f;
          }
          dot = quad_sum<kQuad>(tree_reduce(v, SumOp{}));
          mx = 0.0f;
        } else {
          CUTE_UNROLL
          for (int ci = 0; ci < kCols; ++ci) {
            v[ci] = !mask || get<1>(tScS_rc(ri, ci)) < limit ? acc_rc(ri, ci) * scale_log2 : -INFINITY;
          }
          mx = quad_max<kQuad>(tree_reduce(v, MaxOp{}));
          if (mx != -INFINITY) {
            float w[kCols];
            CUTE_UNROLL
            for (int ci = 0; ci < kCols; ++ci) {
              const bool keep = !mask || get<1>(tScS_rc(ri, ci)) < limit;
              v[ci] = keep ? exp2_fast(acc_rc(ri, ci) * scale_log2 - mx) : 0.0f;
              w[ci] = keep ? v[ci] * float(tSrdP_rc(ri, ci)) : 0.0f;  // masked dP: never used
            }
            sum = tree_reduce(v, SumOp{});
            dot = tree_reduce(w, SumOp{});
          }
          sum = quad_sum<kQuad>(sum);
          dot = quad_sum<kQuad>(dot);
        }
        if (tid % kQuad == 0) st.stats[t % Cfg::kStatSlots][wg][r] = make_float4(mx, sum, dot, 0.0f);
      }
    });
  };

  // A step without live elements here contributes nothing: (−inf, 0, 0).
  const auto write_empty_partials = [&](int t) {
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const int r = get<0>(tScS_rc(ri, 0));
      if (tid % kQuad == 0) st.stats[t % Cfg::kStatSlots][wg][r] = make_float4(kSavedP ? 0.0f : -INFINITY, 0.0f, 0.0f, 0.0f);
    }
  };

  // The cluster's statistics of step t for this thread's rows: log2-domain LSE and D.
  float lse2[kRows], delta[kRows];
  const auto combine = [&](int t) {
    const int slot = int(t % Cfg::kStatSlots);
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) {
      const int r = get<0>(tScS_rc(ri, 0));
      // Lane q of the quad folds the partials of CTAs q, q + 4, …; the quad then merges its four results.
      constexpr int kPerLane = (Cfg::kMaxCluster + kQuad - 1) / kQuad;
      const int lane_q = tid % kQuad;
      float4 part[kPerLane][Cfg::kWarpgroups];
      CUTE_UNROLL
      for (int j = 0; j < kPerLane; ++j) {
        const int c = lane_q + kQuad * j;
        CUTE_UNROLL
        for (int w = 0; w < Cfg::kWarpgroups; ++w) {
          part[j][w] = c < cluster ? load_cluster_f4(cluster_addr(smem_addr(&st.stats[slot][w][r]), uint32_t(c)))
                                   : make_float4(kSavedP ? 0.0f : -INFINITY, 0.0f, 0.0f, 0.0f);
        }
      }
      float mx = -INFINITY, sum = 0.0f, dot = 0.0f;
      if constexpr (kSavedP) {
        CUTE_UNROLL
        for (int j = 0; j < kPerLane; ++j) {
          CUTE_UNROLL
          for (int w = 0; w < Cfg::kWarpgroups; ++w) dot += part[j][w].z;
        }
        dot = quad_sum<kQuad>(dot);
      } else {
        CUTE_UNROLL
        for (int j = 0; j < kPerLane; ++j) {
          CUTE_UNROLL
          for (int w = 0; w < Cfg::kWarpgroups; ++w) mx = fmaxf(mx, part[j][w].x);
        }
        mx = quad_max<kQuad>(mx);
        if (mx != -INFINITY) {
          CUTE_UNROLL
          for (int j = 0; j < kPerLane; ++j) {
            CUTE_UNROLL
            for (int w = 0; w < Cfg::kWarpgroups; ++w) {
              const float e = exp2_fast(part[j][w].x - mx);  // an empty partial (−inf) weighs 0
              sum += part[j][w].y * e;
              dot += part[j][w].z * e;
            }
          }
        }
        sum = quad_sum<kQuad>(sum);
        dot = quad_sum<kQuad>(dot);
      }
      if constexpr (kSavedP) {
        lse2[ri] = 0.0f;
        delta[ri] = dot;
      } else {
        const bool any = mx != -INFINITY;
        lse2[ri] = any ? mx + log2f(sum) : INFINITY;
        delta[ri] = any ? dot / sum : 0.0f;
      }
    }
  };

  // dQ rows and dK rows that are contiguous and aligned take 8- and 4-byte stores.
  const bool dq_vector = dq_op.sc == 1 && aligned_rows<Element>(dq_op, 4);

  // dQ of step t, this CTA's slice of head dimensions: the sum of the partials of the CTAs that had live
  // columns, read from their shared memory, scaled and stored.
  const auto reduce_dq = [&](int t) {
    const int slot = int(t % Cfg::kDqSlots);
    const int64_t m0 = row0_of(t), h = head_of(t), end = step_end(t);
    const int quads = dq_slice / 4, quads_log2 = __ffs(quads) - 1;  // a power of two
    Element* dq_rows = static_cast<Element*>(dq_op.ptr) + dq_op.offset(b, h, m0, 0);  // row m0 of the step
    for (int i = tid; i < kBlockM * quads; i += Cfg::kThreads) {
      const int r = i >> quads_log2, d = int(rank) * dq_slice + 4 * (i & (quads - 1));
      const uint32_t local = smem_addr(&st.dq[slot][r * Cfg::kDqRow + d]);
      float4 part[Cfg::kMaxCluster];
      CUTE_UNROLL
      for (int c = 0; c < Cfg::kMaxCluster; ++c) {
        part[c] = c < cluster && int64_t(c) * kBlockN < end ? load_cluster_f4(cluster_addr(local, uint32_t(c)))
                                                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float4 sum = part[0];
      CUTE_UNROLL
      for (int c = 1; c < Cfg::kMaxCluster; ++c) {
        sum.x += part[c].x;
        sum.y += part[c].y;
        sum.z += part[c].z;
        sum.w += part[c].w;
      }
      if (m0 + r < Sq) store_scaled(dq_rows + r * dq_op.sr + d * dq_op.sc, sum, scale, dq_vector);
    }
  };

  if (has_columns) Barrier::wait(&st.k_full, 0);

  // Step 0's statistics.
  int consumed = 0;  // live steps finished: the stage of the next live step is consumed % kStages
  bool live_n = steps > 0 && live(0);  // step 0's here; then, in the loop, the next step's
  {
    if (live_n) {
      Barrier::wait(&st.stage_full[0], 0);
      if constexpr (!kSavedP) warpgroup_gemm<true>(mma_s, sQ(_, _, 0), sK, tSrS);
      write_partials(tSrS, 0, 0);
    } else {
      write_empty_partials(0);
    }
  }
  cluster_arrive_ordered();

  for (int t = 0; t < steps; ++t) {
    const bool live_t = live_n;
    live_n = t + 1 < steps && live(t + 1);
    const int stage = int(consumed % kStages);
    const int next_index = consumed + (live_t ? 1 : 0);
    const int stage_n = int(next_index % kStages);
    // S of step t + 1 is issued unconditionally (straight-line wgmma keeps ptxas from serialising them);
    // without a live step t + 1 it multiplies stale tiles and its result is never read.
    if (live_n) Barrier::wait(&st.stage_full[stage_n], uint32_t((next_index / kStages) & 1));
    if constexpr (!kSavedP) warpgroup_gemm<true, false>(mma_s, sQ(_, _, stage_n), sK, tSrSn);
    // Step t's dP (and P) tiles into registers before the wait, whose latency then covers theirs.
    Tensor tSrdP = make_fragment_like<Element>(tSrS);  // (MMA, MMA_M, MMA_N)
    Tensor tSrP = make_fragment_like<Element>(tSrS);   // (MMA, MMA_M, MMA_N), saved-P
    if (live_t) {
      load_share(sdP, stage, tSrdP);
      if constexpr (kSavedP) load_share(sP, stage, tSrP);
    }
    cluster_wait_ordered();  // phase t: statistics of step t and the dQ partials of step t − 1, everywhere
    if (t >= 1) reduce_dq(t - 1);

    // Statistics of step t + 1 (its S product done), then phase t + 1.
    const auto next_partials = [&] {
      if (live_n) {
        write_partials(tSrSn, t + 1, stage_n);
      } else if (t + 1 < steps) {
        write_empty_partials(t + 1);
      }
      cluster_arrive_ordered();  // phase t + 1
    };
    if (live_t) {
      combine(t);
      Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));  // (rows, cols)
      Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));  // (rows, cols)
      Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));  // (rows, cols)
      Tensor tSrdS = make_fragment_like<Element>(tSrS);                    // (MMA, MMA_M, MMA_N)
      Tensor tSrdS_rc = make_tensor(tSrdS.data(), rowcol(tSrdS.layout()));  // (rows, cols)
      const int64_t m0 = row0_of(t);
      softmax_backward<Cfg>(tSrdS_rc, tSrS_rc, tSrP_rc, tSrdP_rc, tScS_rc, lse2, delta, scale_log2, keys, m0, n0);
      copy(r2s, thr_r2s.retile_S(tSrdS), thr_r2s.partition_D(sdS));
      cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
      __syncthreads();
      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<BM, HD>{});  // (MMA, MMA_M, MMA_D) fp32
      warpgroup_gemm<true, false>(mma_dq, sdS, sKt, tdQrdQ);
      warpgroup_gemm<false, false>(mma_dk, sdSt, sQt(_, _, stage), tdKrdK);
      warpgroup_wait<1>();  // S of step t + 1 and dQ of step t are done, dK of step t runs on
      warpgroup_fence_operand(tSrSn);
      warpgroup_fence_operand(tdQrdQ);
      // This CTA's dQ partial, (rows, d) in its own shared memory; the owners of the head dimensions read it.
      const uint32_t slot_addr = smem_addr(st.dq[t % Cfg::kDqSlots]);
      CUTE_UNROLL
      for (int i = 0; i < size(tdQrdQ); i += 2) {  // a wgmma accumulator holds pairs of adjacent columns
        const int r = get<0>(tdQcdQ(i)), d = get<1>(tdQcdQ(i));
        store_shared_f2(slot_addr + uint32_t(r * Cfg::kDqRow + d) * uint32_t(sizeof(float)), tdQrdQ(i), tdQrdQ(i + 1));
      }
      next_partials();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdKrdK);
      __syncthreads();  // the stage and sdS are free
      ++consumed;
      if (tid == 0) produce(consumed);
    } else {
      if constexpr (!kSavedP) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrSn);
      }
      next_partials();
    }
    if constexpr (!kSavedP) {
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) tSrS(i) = tSrSn(i);
    }
  }

  cluster_wait_ordered();  // phase steps
  if (steps >= 1) reduce_dq(steps - 1);
  cluster_arrive_ordered();
  cluster_wait_ordered();  // phase steps + 1: every remote access of this CTA's shared memory is done

  store_dk<Cfg>(mma_dk, tdKrdK, prob, b, kv_head, n0);
}

}  // namespace qksoftmax::cuda::sm90
