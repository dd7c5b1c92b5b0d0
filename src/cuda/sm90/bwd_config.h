// The configuration of the Hopper single-pass backward (docs/DESIGN.md, "The single-pass backward"), one
// per (dtype, head dimension, mode), read by the host (launch, shared-memory size, TMA boxes) and the kernel.
//
// A thread-block cluster of C CTAs holds every key of a (batch, key head) for Sk ≤ kBlockN · kMaxCluster.
// Keys are dealt to the CTAs in 32-key chunks, round robin: chunk u of CTA r holds keys
// [32 (u C + r), 32 (u C + r) + 32), so that the causal work of every row block is spread evenly. Per CTA:
//   warpgroup 0   producer: one thread issues TMA (K per head; Q, dP[, P] per 64-row step);
//   warpgroups 1-2 softmax: alternate steps; S = Q Kᵀ, row statistics exchanged across the cluster,
//                 dS = P ∘ (dP − D) into shared memory, dQ partial = dS K (registers), pushed to its owners;
//   warpgroup 3   dK: dK += dSᵀ Q, the CTA's 128 keys × D accumulator resident for the whole head.
#pragma once

#include <cute/tensor.hpp>
// (after cute/tensor.hpp, which they need)
#include <cute/arch/copy_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/generic_config.h"
#include "cuda/sm90_config.h"
#include "cuda/sm90_instances.h"
#include "problem.h"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

template <class Element_, int kHeadDim_, bool kSavedP_>
struct BwdConfig {
  using Element = Element_;
  static constexpr DType kDType = ElementTraits<Element>::kDType;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kSavedP = kSavedP_;

  static constexpr int kBlockM = 64;    // query rows per step: one wgmma M
  static constexpr int kChunk = 32;     // keys per chunk, the unit of key ownership
  static constexpr int kChunks = 4;     // chunks per CTA
  static constexpr int kBlockN = kChunk * kChunks;  // keys per CTA
  static constexpr int kMaxCluster = 8;             // the portable cluster size
  static constexpr int64_t kMaxSk = int64_t(kBlockN) * kMaxCluster;
  static_assert(kMaxSk == kSm90SinglePassMaxSk, "dispatch and kernel agree on the rows a cluster holds");
  static constexpr int kStages = kSavedP ? 2 : 3;   // (Q, dP[, P]) stages by TMA
  static constexpr int kSoftmaxWarpgroups = 2;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = kWarpgroupThreads * (2 + kSoftmaxWarpgroups);
  static constexpr int kWarpsPerWarpgroup = kWarpgroupThreads / 32;
  static constexpr int kQuad = 4;  // lanes that share the rows of a wgmma accumulator
  // Registers per thread by role (setmaxnreg): the dK accumulator is 128 of the dK warpgroup's; S, dP and
  // the dQ partial are the softmax warpgroups'. 4 warpgroups × 128 threads × these ≤ 64 K registers.
  static constexpr int kProducerRegs = 24;
  static constexpr int kSoftmaxRegs = 160;
  static constexpr int kDkRegs = 168;
  static_assert(kWarpgroupThreads * (kProducerRegs + kSoftmaxWarpgroups * kSoftmaxRegs + kDkRegs) <= 64 * 1024,
                "the register file holds the roles");
  // dQ is exchanged in pieces of kPieceCols head dimensions: piece p of every row block is summed and stored
  // by CTA p % C. A piece is kPieceValues accumulator values per thread, two 16-byte pushes.
  static constexpr int kLog2Pieces = 3;
  static constexpr int kPieces = 1 << kLog2Pieces;
  static constexpr int kPieceCols = kHeadDim / kPieces;
  static constexpr int kPieceValues = kBlockM * kPieceCols / kWarpgroupThreads;
  static constexpr int kPieceVectors = kPieceValues / 4;
  static_assert(kPieceValues % 4 == 0, "a piece is whole float4 pushes");

  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  using CK = Int<kChunk>;
  using HD = Int<kHeadDim>;
  using ST = Int<kStages>;

  // Q, K: 128-byte swizzled, K-major. dP, P, dS: a 32-key chunk is 64 bytes wide, so 64-byte swizzled; the
  // chunks of a stage are consecutive 4 KB blocks (tile_to_shape fills the rows of an atom column first).
  using SmemLayoutQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<BM, HD, ST>{}));  // (m, d, stage)
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<HD, BM, ST>{}, Stride<BM, _1, Int<kBlockM * kHeadDim>>{})));        // (d, m, stage)
  using SmemLayoutK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<BN, HD>{}));      // (n, d)
  using SmemLayoutKt = decltype(composition(SmemLayoutK{}, make_layout(Shape<HD, BN>{}, Stride<BN, _1>{})));  // (d, n)
  using SmemLayoutKChunk = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<CK, HD>{}));  // TMA box
  using SmemLayoutP = decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<Element>{}, Shape<BM, BN, ST>{}));   // (m, n, stage)
  using SmemLayoutPt = decltype(composition(
      SmemLayoutP{}, make_layout(Shape<BN, BM, ST>{}, Stride<BM, _1, Int<kBlockM * kBlockN>>{})));         // (n, m, stage)
  using SmemLayoutPChunk = decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<Element>{}, Shape<BM, CK>{}));  // TMA box

  // S = Q Kᵀ over the first kLive chunks (one warpgroup, N = 32 kLive).
  template <int kLive>
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, Int<kChunk * kLive>, HD>, GMMA::Major::K,
                           GMMA::Major::K>()));
  using MmaSPair = MmaS<2>;
  // dQ = dS K: dS from registers, K from shared memory (D-contiguous: MN-major B).
  using MmadQ = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<BM, HD, CK>, GMMA::Major::K, GMMA::Major::MN>()));
  // dK += dSᵀ Q: M = the CTA's keys (two wgmma of 64), both operands MN-major views of shared memory.
  using MmadK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, HD, BM>, GMMA::Major::MN, GMMA::Major::MN>()));

  using TmaQ = TmaLoad<Element, HD, decltype(SmemLayoutQ{}(_, _, 0))>;
  using TmaK = TmaLoad<Element, HD, SmemLayoutKChunk>;
  using TmaP = TmaLoad<Element, int32_t, SmemLayoutPChunk>;

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kPChunkBytes = kBlockM * kChunk * sizeof(Element);

  using StagePipeline = cutlass::PipelineTmaAsync<kStages>;
  using KPipeline = cutlass::PipelineTmaAsync<1>;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  using Barrier = cutlass::arch::ClusterBarrier;

  struct Storage {
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutP>> dp;  // dS overwrites dP once it is read
    alignas(1024) cute::array<Element, kSavedP ? cosize_v<SmemLayoutP> : 1> p;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutK>> k;
    // Row statistics pushed by every CTA of the cluster: (max·log2e, Σ 2^(S' − max), Σ 2^(S' − max)·dP, 0)
    // per row, per softmax warpgroup, per sender.
    alignas(16) float4 stats[kSoftmaxWarpgroups][kMaxCluster][kBlockM];
    // dQ pieces pushed to this CTA, per softmax warpgroup: slot (sender, owned piece) in fragment order.
    alignas(16) float4 dq[kSoftmaxWarpgroups][kPieces][kPieceVectors][kWarpgroupThreads];
    typename StagePipeline::SharedStorage stage_pipe;
    typename KPipeline::SharedStorage k_pipe;
    alignas(8) uint64_t ds_full[kStages];  // dS of the stage written (softmax → dK warpgroup)
    alignas(8) uint64_t stats_full[kSoftmaxWarpgroups];
    alignas(8) uint64_t stats_empty[kSoftmaxWarpgroups];
    alignas(8) uint64_t dq_full[kSoftmaxWarpgroups];
    alignas(8) uint64_t dq_empty[kSoftmaxWarpgroups];
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));
  static_assert(kSmemBytes <= 227 * 1024, "one CTA per SM");

  struct Loads {
    TmaQ q;
    TmaK k;
    TmaP dp;
    TmaP p;  // saved-P only (a copy of dp otherwise, never used)
  };

  // dQ bytes each CTA receives per step: every piece it owns from every CTA (its own included).
  static constexpr uint32_t kDqPushBytes = kPieces * kPieceVectors * kWarpgroupThreads * sizeof(float4);

  struct Params {
    Problem prob;
    Loads tma;
    int cluster;      // C, CTAs per cluster: 1, 2, 4 or 8
    int64_t work;     // work items: (batch, key head) pairs × repeat
    int64_t heads;    // (batch, key head) pairs
  };

  // CTAs per cluster for a key length: enough 128-key CTAs, rounded up to a power of two.
  static constexpr int cluster_for(int64_t sk) {
    int c = 1;
    while (int64_t(c) * kBlockN < sk) c *= 2;
    return c;
  }
};

// The pipeline state of global step g: stage g mod S, phase ⌊g / S⌋ mod 2.
template <class Pipeline>
CUTE_DEVICE typename Pipeline::PipelineState state_of(int64_t g) {
  constexpr int64_t kStages = Pipeline::Stages;
  return {int(g % kStages), uint32_t((g / kStages) & 1), 0};
}

// Rows of dQ of one step (query head h, rows from m0): four accumulator values e … e + 3 of a thread, the
// coordinates from the dQ product's partition `coord` ((m, d) per value): e, e + 1 one row's adjacent columns,
// e + 2, e + 3 the row 8 below's. Scaled, rounded, stored; rows past Sq are not.
template <class Cfg>
struct DqRows {
  using Element = typename Cfg::Element;
  const Problem& prob;
  Element* rows;
  int64_t m_end;  // rows of the step below Sq
  bool vector;

  CUTE_DEVICE DqRows(const Problem& p, int64_t b, int64_t h, int64_t m0)
      : prob(p),
        rows(static_cast<Element*>(p.dq.ptr) + p.dq.offset(b, h, m0, 0)),
        m_end(p.Sq - m0),
        vector(aligned_rows<Element>(p.dq, 2)) {}

  template <class Coord>
  CUTE_DEVICE void store(const Coord& coord, int e, float4 v) const {
    const int r0 = get<0>(coord(e)), r1 = get<0>(coord(e + 2)), d = get<1>(coord(e));
    if (r0 < m_end) store_scaled(rows + r0 * prob.dq.sr + d, v.x, v.y, prob.scale, vector);
    if (r1 < m_end) store_scaled(rows + r1 * prob.dq.sr + d, v.z, v.w, prob.scale, vector);
  }
};

}  // namespace qksoftmax::cuda::sm90
