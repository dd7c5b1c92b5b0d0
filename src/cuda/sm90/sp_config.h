// The configuration of the single pass on the key-block machinery (docs/DESIGN.md, "The single pass with its
// statistics a step ahead"), one per (dtype, head dimension), recompute mode, rows of up to 128 keys: one CTA
// holds a (batch, key head)'s whole key block, so that a row's statistics are the CTA's own and every dQ row
// block comes from one step (stored, not added). It is the key-block pass's config (kb_config.h: the step's
// tiles, products, stage pipeline, tile ring, producer) with its own shared storage and roles:
//   warpgroup 0    producer: warp 0 (one thread) issues the TMA loads, as in the key-block pass; its tiles
//                  dealt statically (CTA c takes c, c + grid, …: every tile has the same steps);
//   warpgroups 1-2 consumers, 64 keys each: the key-block step, with each row's LSE and D computed by the
//                  consumers a step ahead instead of read from a statistics pass (sp_mainloop.cuh), and the
//                  dQ partial of its turn stored from registers.
// No statistics pass, no workspace, no atomics: the sums run in a fixed order (deterministic by construction).
#pragma once

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda::sm90 {

// kStep (sm90_instances.h, docs/DESIGN.md, the single pass's way down):
//   kResident  Sᵀ = K_w Qᵀ with K_w in registers (RS, as the key-block pass), every product of a step awaited in it;
//   kShared    K_w from shared memory (SS), whose 32 registers let the dQ product stay in flight under the next
//              step's statistics and be staged at the next step's start;
//   kEarlyS    kShared with Sᵀ(t + 1) issued at step t's top, so that it runs under the combine and dS instead of
//              standing between the products and the statistics, and dK's dSᵀ read from the dS buffer (SS), so
//              that no register of dS lives while dK runs under the statistics;
//   kRows      kEarlyS's schedule with S = Q K_wᵀ instead of Sᵀ (sp_rows.cuh): a row's 64 keys of a consumer lie in
//              one quad, so that its statistics take 2 shuffles a reduction and one partial per consumer instead
//              of 8 lanes' butterflies and 8 warps' partials.
template <class Element_, int kHeadDim_, SpStep kStep_>
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
  using typename Base::TilePipeline;
  using typename Base::Loads;
  using typename Base::TileOrder;
  using Base::kBlockM;
  using Base::kBlockN;
  using Base::kTileSlots;
  using Base::kConsumerThreads;

  static_assert(kBlockM == kSpBlockM, "dispatch.cu counts the single pass's steps by sm90_instances.h's kSpBlockM");
  static constexpr bool kStaticTiles = true;  // KbTileWriter::claim: CTA c's tiles are c, c + grid, …
  static constexpr SpStep kStep = kStep_;
  static constexpr bool kKResident = kStep == SpStep::kResident;
  static constexpr bool kRowsOnM = kStep == SpStep::kRows;
  static constexpr bool kEarlyS = kStep == SpStep::kEarlyS || kRowsOnM;  // the schedule
  using typename Base::HF;
  // Sᵀ = K_w Qᵀ with both operands from shared memory (K-major), where K_w is not resident.
  using MmaStShared = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<HF, BM, HD>, GMMA::Major::K, GMMA::Major::K>()));
  // dK += dSᵀ Q with dSᵀ from the dS buffer (kEarlyS): the buffer's (keys, rows) view is keys-contiguous, M-major.
  using MmadKShared = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<HF, HD, BM>, GMMA::Major::MN, GMMA::Major::MN>()));
  // S = Q K_wᵀ (kRowsOnM): M = the step's 64 rows, N = a consumer's 64 keys, K = D; Q and K_w K-major from
  // shared memory. dP into its accumulator layout by ldmatrix and dS out of it by stmatrix, untransposed.
  using MmaSRows = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, HF, HD>, GMMA::Major::K, GMMA::Major::K>()));
  using CopydPRows = decltype(make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, MmaSRows{}));
  using CopydSRows = decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, MmaSRows{}));
  // Consumer w's (BM, HF) part, its keys, of a (BM, BN) tile's stage or buffer.
  template <class Tile>
  CUTE_HOST_DEVICE static auto consumer_cols(Tile&& tile, int w) {
    return local_tile(static_cast<Tile&&>(tile), Shape<BM, HF>{}, make_coord(0, w));
  }
  static constexpr int kMaxSk = kBlockN;      // the keys one CTA holds
  // Consumer warps; each reduces its own 16 keys of a row and writes one partial per row.
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // The statistics' partials are double-buffered by step parity (written a step ahead, read in the step).
  static constexpr int kStatBuffers = 2;
  // The tile ring's readers: every consumer thread (no rows or dQ warp).
  static constexpr int kTileReaders = kConsumerThreads;

  // K of two tiles (a tile is short: 2 steps per query head at Sq = 128), so that the next tile's K loads while
  // this one runs.
  static constexpr int kKBuffers = 2;
  using KB = Int<kKBuffers>;
  using SmemLayoutKB = decltype(tile_to_shape(SmemAtom{}, Shape<BN, HD, KB>{}));
  using SmemLayoutKtB = decltype(composition(
      SmemLayoutKB{}, make_layout(Shape<HD, BN, KB>{}, Stride<BN, _1, Int<kBlockN * kHeadDim_>>{})));

  // A warp's partial of a row: its maximum m (of S·scale·log2e over its 16 keys; −inf where it sees none),
  // l = Σ 2^(x − m) and u = Σ 2^(x − m) · dP over those keys.
  enum Stat { kStatM, kStatL, kStatU, kStats };

  struct Storage {
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array<Element, int(cosize_v<SmemLayoutKB>)> k;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutP>> dp;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutdS2>> ds;
    alignas(16) cute::array<Element, 1> p;  // (saved-P's P: the producer's view of it, never loaded here)
    // Partials by step parity, statistic, consumer warp and row.
    alignas(16) float partials[kStatBuffers][kStats][kConsumerWarps][kBlockM];
    // Each warp's (factor, factor · D) of the step's rows, read back by its own lanes.
    alignas(16) float2 factors[kConsumerWarps][kBlockM];
    // kRowsOnM: a consumer's partial (m, l, u, unused) of each row over its 64 keys, by step parity.
    alignas(16) float4 row_partials[kStatBuffers][Base::kConsumers][kBlockM];
    typename StagePipeline::SharedStorage stage_pipe;
    typename TilePipeline::SharedStorage tile_pipe;
    int tile_index[kTileSlots];
    alignas(8) uint64_t k_full[kKBuffers];
    alignas(8) uint64_t k_empty[kKBuffers];
    alignas(8) uint64_t stats_full[kStatBuffers];  // a step's partials written by every consumer thread
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));
  static_assert(kSmemBytes <= kSm90SmemPerCta, "the single pass's shared memory exceeds a CTA's 227 KB");

  // The dQ partial of a step, rounded, staged by stmatrix in the step's dS buffer (free once the step's dQ
  // product, its only reader, is complete; SmemLayoutdQ is one dS buffer's layout) and stored into dQ by one TMA:
  // (rows, d, head, batch).
  using typename Base::SmemLayoutdQ;
  static_assert(cosize_v<SmemLayoutdQ> == cosize_v<SmemLayoutdS2> / Base::kBuffers,
                "a dS buffer holds a dQ partial");
  using TmaStoredQ = decltype(make_tma_copy(
      SM90_TMA_STORE{},
      make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), Shape<int32_t, HD, int32_t, int32_t>{},
                  Stride<int64_t, _1, int64_t, int64_t>{}),
      SmemLayoutdQ{}));
  // Named barrier (after the dS barriers) by consumer: its 128 threads' stmatrix of the dQ partial done.
  static constexpr uint32_t kDqStagedBarrier = 2;  // + consumer
  // kEarlyS: by consumer, its 128 threads' dS written (its own dK product reads it); and both consumers' products
  // of a tile's last step done (its dQ partial is staged in the dS buffer that both dK products read).
  static constexpr uint32_t kDsOwnBarrier = 4;  // + consumer
  static constexpr uint32_t kTileEndBarrier = 6;

  struct Params {
    Problem prob;
    Loads tma;
    TmaStoredQ tma_dq;
    TileOrder order;
  };
};

}  // namespace qksoftmax::cuda::sm90
