// The configuration of the single pass on the key-block machinery (docs/DESIGN.md, "The single pass on the
// key-block machinery"), one per (dtype, head dimension), recompute mode, rows of up to 128 keys: one CTA holds a
// (batch, key head)'s whole key block, so that a row's statistics are the CTA's own and every dQ row block comes
// from one step (stored, not added). It is the key-block pass's config (kb_config.h: the step's tiles, stage
// pipeline, tile ring, producer, the dQ product) with its own S product, shared storage and roles:
//   warpgroup 0    producer: warp 0 (one thread) issues the TMA loads, as in the key-block pass; its tiles
//                  dealt statically (CTA c takes c, c + grid, …: every tile has the same steps);
//   warpgroups 1-2 consumers, 64 keys each: S = Q K_wᵀ with the rows on the products' M, each row's statistics
//                  computed a step ahead (sp_stats.cuh), dS through shared memory into the dK and dQ products,
//                  the dQ partial of its turn in flight into the next step, then stored by TMA
//                  (sp_mainloop.cuh).
// No statistics pass, no workspace, no atomics: the sums run in a fixed order (deterministic by construction).
// kDqWarpgroup (the step benchmark's second case; not dispatched): a fourth warpgroup owns the dQ product, so
// that the consumers hold no dQ accumulator and have no turns (sp_dq.cuh; docs/DESIGN.md, "A dQ warpgroup").
#pragma once

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda::sm90 {

template <class Element_, int kHeadDim_, bool kDqWarpgroup_>
struct SpConfig : KbConfig<Element_, kHeadDim_, false, true> {
  using Base = KbConfig<Element_, kHeadDim_, false, true>;
  using Element = Element_;
  using typename Base::BM;
  using typename Base::BN;
  using typename Base::HD;
  using typename Base::SmemAtom;
  using typename Base::SmemLayoutQ;
  using typename Base::SmemLayoutP;
  using typename Base::SmemLayoutdS2;
  using typename Base::StagePipeline;
  using typename Base::Loads;
  using typename Base::TileOrder;
  using Base::kBlockM;
  using Base::kBlockN;
  using Base::kConsumerThreads;

  static_assert(kBlockM == kSpBlockM, "dispatch.cu counts the single pass's steps by sm90_instances.h's kSpBlockM");
  static constexpr bool kStaticTiles = true;  // KbTileWriter::claim: CTA c's tiles are c, c + grid, …
  using typename Base::HF;
  // S = Q K_wᵀ: M = the step's 64 rows, N = a consumer's 64 keys, K = D; Q and K_w K-major from shared memory.
  // dP into its accumulator layout by ldmatrix and dS out of it by stmatrix, untransposed.
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, HF, HD>, GMMA::Major::K, GMMA::Major::K>()));
  using CopydP = decltype(make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, MmaS{}));
  using CopydS = decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, MmaS{}));
  // dK += dSᵀ Q with dSᵀ from the dS buffer, whose (keys, rows) view is keys-contiguous (M-major), and Q as
  // (D, rows), MN-major.
  using MmadK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<HF, HD, BM>, GMMA::Major::MN, GMMA::Major::MN>()));
  // Consumer w's (BM, HF) part, its keys, of a (BM, BN) tile's stage or buffer.
  template <class Tile>
  CUTE_HOST_DEVICE static auto consumer_cols(Tile&& tile, int w) {
    return local_tile(static_cast<Tile&&>(tile), Shape<BM, HF>{}, make_coord(0, w));
  }
  static constexpr int kMaxSk = kBlockN;      // the keys one CTA holds
  // The statistics' partials are double-buffered by step parity (written a step ahead, read in the step).
  static constexpr int kStatBuffers = 2;
  // Roles and registers (setmaxnreg within the launch allocation, as KbConfig's): with a dQ warpgroup (warpgroup
  // 3) the consumers hold no dQ accumulator (64 registers of their 240) and take 184, the dQ warpgroup 120 (its
  // code uses 88; at 88 ptxas ignores every setmaxnreg of the kernel, C7507; 192 / 104 spills in the step
  // benchmark's traced form).
  static constexpr bool kDqWarpgroup = kDqWarpgroup_;
  using Base::kWarpgroupThreads;
  using Base::kProducerRegs;
  static constexpr int kDqWarpgroupIndex = 1 + Base::kConsumers;
  static constexpr int kThreads = kWarpgroupThreads * (kDqWarpgroupIndex + (kDqWarpgroup ? 1 : 0));
  static constexpr int kLaunchRegs = 64 * 1024 / kThreads / 8 * 8;
  static constexpr int kConsumerRegs = kDqWarpgroup ? 184 : Base::kConsumerRegs;
  static constexpr int kDqRegs = 120;
  static_assert(kWarpgroupThreads * (kProducerRegs + Base::kConsumers * kConsumerRegs + (kDqWarpgroup ? kDqRegs : 0)) <=
                    kThreads * kLaunchRegs,
                "the launch allocation holds the roles");
  // The tile ring's readers: every consumer thread, and the dQ warpgroup's, which runs up to two steps and a dQ
  // store behind the consumers: twice the key-block pass's slots (kb_config.h; a power of two, so that a slot's
  // index and phase are a mask and a shift) so that the load thread does not wait for it on tiles of one step.
  static constexpr int kTileReaders = kConsumerThreads + (kDqWarpgroup ? kWarpgroupThreads : 0);
  static constexpr int kTileSlots = Base::kTileSlots * (kDqWarpgroup ? 2 : 1);
  using TilePipeline = cutlass::PipelineAsync<kTileSlots>;
  // A K buffer's readers, each arriving once its last product of the tile is done.
  static constexpr int kKReaders = kTileReaders;

  // K of two tiles (a tile is short: 2 steps per query head at Sq = 128), so that the next tile's K loads while
  // this one runs.
  static constexpr int kKBuffers = 2;
  using KB = Int<kKBuffers>;
  using SmemLayoutKB = decltype(tile_to_shape(SmemAtom{}, Shape<BN, HD, KB>{}));
  using SmemLayoutKtB = decltype(composition(
      SmemLayoutKB{}, make_layout(Shape<HD, BN, KB>{}, Stride<BN, _1, Int<kBlockN * kHeadDim_>>{})));


  using typename Base::SmemLayoutdQ;
  // kDqWarpgroup: the dQ partial's staging buffer, and by dS buffer its dQ product done (every dQ warpgroup
  // thread arriving), which the consumers await before they write the buffer two steps later.
  struct DqWarpgroupStorage {
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutdQ>> stage;
    alignas(8) uint64_t ds_empty[Base::kBuffers];
  };
  struct NoDqWarpgroupStorage {};
  using DqStorage = std::conditional_t<kDqWarpgroup, DqWarpgroupStorage, NoDqWarpgroupStorage>;

  struct Storage {
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array<Element, int(cosize_v<SmemLayoutKB>)> k;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutP>> dp;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutdS2>> ds;
    alignas(16) cute::array<Element, 1> p;  // (saved-P's P: the producer's view of it, never loaded here)
    // A consumer's partial of each row over its 64 keys, by step parity: its maximum m of S·scale·log2e (−inf
    // where the row sees none of them), l = Σ 2^(x − m), u = Σ 2^(x − m) · dP, and a word unused.
    alignas(16) float4 partials[kStatBuffers][Base::kConsumers][kBlockM];
    typename StagePipeline::SharedStorage stage_pipe;
    typename TilePipeline::SharedStorage tile_pipe;
    int tile_index[kTileSlots];
    alignas(8) uint64_t k_full[kKBuffers];
    alignas(8) uint64_t k_empty[kKBuffers];
    alignas(8) uint64_t stats_full[kStatBuffers];  // a step's partials written by every consumer thread
    DqStorage dq;
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));
  static_assert(kSmemBytes <= kSm90SmemPerCta, "the single pass's shared memory exceeds a CTA's 227 KB");

  // The dQ partial of a step, rounded, staged by stmatrix in the step's dS buffer (free once the step's dQ
  // product, its only reader, is complete; SmemLayoutdQ is one dS buffer's layout) or in the dQ warpgroup's buffer
  // and stored into dQ by one TMA: (rows, d, head, batch).
  static_assert(cosize_v<SmemLayoutdQ> == cosize_v<SmemLayoutdS2> / Base::kBuffers,
                "a dS buffer holds a dQ partial");
  using TmaStoredQ = decltype(make_tma_copy(
      SM90_TMA_STORE{},
      make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), Shape<int32_t, HD, int32_t, int32_t>{},
                  Stride<int64_t, _1, int64_t, int64_t>{}),
      SmemLayoutdQ{}));
  // Named barrier (after the dS barriers) by consumer: its 128 threads' stmatrix of the dQ partial done. With a dQ
  // warpgroup, which stages every partial, its staging buffer written (+ 0) and free (+ 1).
  static constexpr uint32_t kDqStagedBarrier = 2;  // + consumer
  // The dS barrier's threads: with a dQ warpgroup both consumers arrive and the dQ warpgroup syncs.
  static constexpr int kDsBarrierThreads = kConsumerThreads + (kDqWarpgroup ? kWarpgroupThreads : 0);
  // By consumer, its 128 threads' dS written (its own dK product reads it); and both consumers' products of a
  // tile's last step done (its dQ partial is staged in the dS buffer that both dK products read).
  static constexpr uint32_t kDsOwnBarrier = 4;  // + consumer
  static constexpr uint32_t kTileEndBarrier = 6;
  static_assert(kTileEndBarrier + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <
                    cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers,
                "the named barriers fit the hardware's 16 after CUTLASS's reserved ones");

  struct Params {
    Problem prob;
    Loads tma;
    TmaStoredQ tma_dq;
    TileOrder order;
  };
};

}  // namespace qksoftmax::cuda::sm90
