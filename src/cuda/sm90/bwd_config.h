// The configuration of the Hopper single-pass backward (docs/DESIGN.md, "The single-pass backward"), one
// per (dtype, head dimension, mode), read by the host (launch, shared-memory size, TMA boxes) and the kernel.
//
// A thread-block cluster of C CTAs holds every key of a (batch, key head) for Sk ≤ kBlockN · kMaxCluster.
// Keys are dealt to the CTAs in 32-key chunks, round robin: chunk u of CTA r holds keys
// [32 (u C + r), 32 (u C + r) + 32), so that the causal work of every row block is spread evenly. In shared
// memory the chunks sit at positions pos(u) = 2 (u mod 2) + ⌊u / 2⌋, so that consumer warpgroup w owns the
// contiguous positions 2w, 2w + 1 (chunks w and w + 2). Per CTA:
//   warpgroup 0   producer: one thread issues TMA (K per head; Q, dP[, P] per 64-row step); warps 1-3 sum
//                 the dQ pieces this CTA owns over the cluster and store them;
//   warpgroups 1-2 consumers, both on every step: S = Q Kᵀ over the warpgroup's chunks (one step ahead),
//                 row statistics exchanged across the cluster, dS = P ∘ (dP − D) into shared memory,
//                 dK += dSᵀ Q over its 64 keys (accumulator resident for the head), the dQ partial = dS K
//                 over the CTA's keys for its 64 head dimensions, pushed to the pieces' owners.
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
#include "cuda/sm90/mask.h"
#include "cuda/sm90/trace.h"
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
  static constexpr int kConsumers = 2;              // consumer warpgroups
  static constexpr int kHalf = kBlockN / kConsumers;  // keys (for S, dK) and head dimensions (for dQ) of one
  static_assert(kHalf == 2 * kChunk && kHeadDim == 2 * kHalf, "a consumer owns two chunks and half of D");
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr int kConsumerThreads = kWarpgroupThreads * kConsumers;
  static constexpr int kWarpsPerWarpgroup = kWarpgroupThreads / 32;
  static constexpr int kReducerWarps = kWarpsPerWarpgroup - 1;  // the producer warpgroup's warps 1-3
  static constexpr int kReducerThreads = 32 * kReducerWarps;
  static constexpr int kQuad = 4;  // lanes that share the rows of a wgmma accumulator
  // Registers per thread by role (setmaxnreg): a consumer holds its dK accumulator (64), S of the next step
  // (32), the probabilities and dP of the current one (32 + 16) and the dQ partial (32). setmaxnreg moves
  // registers between the warpgroups of the CTA's launch allocation (the 64 K register file over kThreads,
  // rounded down to a multiple of 8): asking for more than it holds would leave the consumers waiting.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kLaunchRegs = 64 * 1024 / kThreads / 8 * 8;
  static_assert(kWarpgroupThreads * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * kLaunchRegs,
                "the launch allocation holds the roles");
  // Named barriers (CUTLASS numbers them after its reserved ones): both consumers' dS written; both
  // consumers' statistics written (a CTA alone exchanges them through its own shared memory).
  static constexpr uint32_t kDsBarrier = 0;
  static constexpr uint32_t kStatsBarrier = 1;
  // dQ is exchanged in pieces of kPieceCols head dimensions: piece p of every row block is summed and stored
  // by CTA p mod C; consumer w computes pieces [w kPieces / 2, (w + 1) kPieces / 2). A piece is kPieceValues
  // accumulator values per thread, kPieceVectors 16-byte pushes.
  static constexpr int kLog2Pieces = 3;
  static constexpr int kPieces = 1 << kLog2Pieces;
  static constexpr int kPiecesPerConsumer = kPieces / kConsumers;
  static constexpr int kPieceCols = kHeadDim / kPieces;
  static constexpr int kPieceValues = kBlockM * kPieceCols / kWarpgroupThreads;
  static constexpr int kPieceVectors = kPieceValues / 4;
  static_assert(kPieceValues % 4 == 0, "a piece is whole float4 pushes");
  static constexpr int kBuffers = 2;  // exchange buffers, by step parity

  // Where sender s keeps row r of its statistics: rows permuted within aligned blocks of 8 by 2 (s mod 4), so
  // that a sender's push of eight consecutive rows stays one contiguous 128-byte block in the receiver, and the
  // eight lanes of a quarter-warp in the combine (rows r and r + 1, r even; lane q reading sender q + 4k) read
  // eight distinct 16-byte bank groups.
  static CUTE_HOST_DEVICE constexpr int stats_row(int s, int row) { return row ^ (2 * (s & 3)); }

  // Shared-memory position of chunk u (an involution: the chunk at position p is pos(p)).
  static CUTE_HOST_DEVICE constexpr int pos(int u) { return 2 * (u % 2) + u / 2; }

  using Mask = ChunkMask<kChunk, kChunks, kBlockM>;  // the keys each row block sees, by chunk

  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  using CK = Int<kChunk>;
  using HD = Int<kHeadDim>;
  using HF = Int<kHalf>;
  using ST = Int<kStages>;

  // Q, K: 128-byte swizzled, K-major. dP, P, dS: a 32-key chunk is 64 bytes wide, so 64-byte swizzled; the
  // chunk positions of a stage are consecutive 4 KB blocks (tile_to_shape fills the rows of an atom column
  // first).
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

  // S = Q Kᵀ of one chunk (N = 32); a consumer's S is two of them, its (BM, HF) accumulator in MmaSHalf's
  // layout (the first chunk's values first).
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, CK, HD>, GMMA::Major::K, GMMA::Major::K>()));
  using MmaSHalf = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, HF, HD>, GMMA::Major::K, GMMA::Major::K>()));
  // dQ = dS K for a consumer's half of D: dS (K-major) and K (D-contiguous: MN-major) from shared memory.
  using MmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, HF, CK>, GMMA::Major::K, GMMA::Major::MN>()));
  // dK += dSᵀ Q over a consumer's 64 keys: both operands MN-major views of shared memory.
  using MmadK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<HF, HD, BM>, GMMA::Major::MN, GMMA::Major::MN>()));

  using TmaQ = TmaLoad<Element, HD, decltype(SmemLayoutQ{}(_, _, 0))>;
  using TmaK = TmaLoad<Element, HD, SmemLayoutKChunk>;
  using TmaP = TmaLoad<Element, int32_t, SmemLayoutPChunk>;

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kPChunkBytes = kBlockM * kChunk * sizeof(Element);

  using StagePipeline = cutlass::PipelineTmaAsync<kStages>;
  using KPipeline = cutlass::PipelineTmaAsync<1>;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  using Trace = NoTrace;  // the step micro-benchmark's configs time the phases (trace.h)
  using Barrier = cutlass::arch::ClusterBarrier;

  struct Storage {
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutP>> dp;  // dS overwrites dP once it is read
    alignas(1024) cute::array<Element, kSavedP ? cosize_v<SmemLayoutP> : 1> p;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutK>> k;
    // Row statistics pushed by every consumer of the cluster, (max·log2e, Σ 2^(S' − max), Σ 2^(S' − max)·dP, 0)
    // per row: sender s = 2 · rank + w, row r at [s][stats_row(s, r)].
    alignas(16) float4 stats[kBuffers][kConsumers * kMaxCluster][kBlockM];
    // dQ pieces pushed to this CTA: slot (sender, owned piece) in the sender's fragment order.
    alignas(16) float4 dq[kBuffers][kPieces][kPieceVectors][kWarpgroupThreads];
    typename StagePipeline::SharedStorage stage_pipe;
    typename KPipeline::SharedStorage k_pipe;
    alignas(8) uint64_t stats_full[kBuffers];
    alignas(8) uint64_t dq_full[kBuffers];
    alignas(8) uint64_t dq_empty[kBuffers];
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));
  static_assert(kSmemBytes <= kSm90SmemPerCta, "one CTA per SM");

  struct Loads {
    TmaQ q;
    TmaK k;
    TmaP dp;
    TmaP p;  // saved-P only (a copy of dp otherwise, never used)
  };

  // Statistics bytes each CTA receives per step: a row block's partials from every consumer of the cluster.
  static constexpr uint32_t kStatsPushBytes = kConsumers * kBlockM * sizeof(float4);  // times C
  // dQ bytes each CTA receives per step: every piece it owns from every CTA (its own included).
  static constexpr uint32_t kDqPushBytes = kPieces * kPieceVectors * kWarpgroupThreads * sizeof(float4);

  struct Params {
    Problem prob;
    Loads tma;
    bool dq_pairs;    // dQ's rows take 4-byte stores of two values (aligned pointer and strides)
    bool dk_pairs;    // dK's likewise
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

// Where a thread's wgmma accumulator values sit in a 64 × N tile: value e of thread t at row
// 16 ⌊t / 32⌋ + ⌊(t mod 32) / 4⌋ + 8 ⌊e / 2⌋ mod 2, column 8 ⌊e / 4⌋ + 2 (t mod 4) + e mod 2 (the layout of
// every SM90 wgmma accumulator). A float4 of values e … e + 3 (e a multiple of 4) is two rows 8 apart, the
// same two adjacent columns.
struct AccCoord {
  static CUTE_HOST_DEVICE int row(int t) { return 16 * (t / 32) + (t % 32) / 4; }
  static CUTE_HOST_DEVICE int col(int t, int e) { return 8 * (e / 4) + 2 * (t % 4); }
};

// Rows of dQ of one step (query head h, rows from m0, head dimensions from d0): the float4 of accumulator
// values e … e + 3 of thread t of a dQ product, scaled, rounded and stored; rows past Sq are not.
template <class Cfg>
struct DqRows {
  using Element = typename Cfg::Element;
  Element* rows;
  int64_t stride;  // between rows
  int64_t m_end;   // rows of the step below Sq
  float scale;
  bool vector;

  CUTE_DEVICE DqRows(const typename Cfg::Params& params, int64_t b, int64_t h, int64_t m0, int d0)
      : rows(static_cast<Element*>(params.prob.dq.ptr) + params.prob.dq.offset(b, h, m0, d0)),
        stride(params.prob.dq.sr),
        m_end(params.prob.Sq - m0),
        scale(params.prob.scale),
        vector(params.dq_pairs) {}

  CUTE_DEVICE void store(int t, int e, float4 v) const {
    const int r = AccCoord::row(t), d = AccCoord::col(t, e);
    if (r < m_end) store_scaled(rows + r * stride + d, v.x, v.y, scale, vector);
    if (r + 8 < m_end) store_scaled(rows + (r + 8) * stride + d, v.z, v.w, scale, vector);
  }
};

}  // namespace qksoftmax::cuda::sm90
