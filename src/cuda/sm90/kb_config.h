// The configuration of the key-block pass (docs/DESIGN.md, "Shared memory, the step's own bound"), one per
// (dtype, head dimension, mode, where dQ is added), read by the host (descriptors, shared-memory size) and the
// kernel. It runs after the row statistics (sm90_rowstats.cuh), which give each row's LSE and D.
//
// A tile is a block of 128 keys of a (batch, key head); the row blocks of 64 rows of every query head of the
// group stream through. The CTAs are persistent, one per SM, each taking its next tile from a counter in the
// workspace as it comes free (kb_scheduler.h: the order longest first in sections of heads). The load thread
// claims the tiles and hands each index to the other roles through the tile ring in shared memory, so that every
// role walks the same tiles; the pipelines, the barriers' phases and the steps' turns run on across tiles, so
// that a tile's loads stream in under the previous tile's last steps and its dQ reduce-adds under the next
// tile's first. Per CTA:
//   warpgroup 0    producer: warp 0 (one thread) claims the tiles and issues the TMA loads (K once per tile into
//                  one of kKBuffers buffers; Q, dP[, P] per step into the stage pipeline); warp 1 copies the
//                  step's rows' LSE·log2e and D into the rows pipeline; warp 2 (one thread) reduce-adds each
//                  step's dQ partial by TMA (16-bit into dQ, or fp32 into the accumulator);
//   warpgroups 1-2 consumers, 64 keys each: Sᵀ = K_w Qᵀ with K_w from registers (RS, keys on the wgmma's M),
//                  dSᵀ = Pᵀ ∘ (dPᵀ − D), scaled in bf16 (kb_mainloop.cuh), in registers, dK += dSᵀ Q from those
//                  registers (RS), dS into shared memory; the dQ partial = dS K over the CTA's 128 keys (SS,
//                  N = D) by one consumer per step, the two taking turns, rounded into its staging buffer; dK
//                  stored at the tile's end. Per step they move ~208 KB through shared memory where the column
//                  pass it replaced moved 304 KB.
#pragma once

#include <cute/tensor.hpp>

#include <type_traits>
// (after cute/tensor.hpp, which they need)
#include <cute/arch/copy_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/generic_config.h"
#include "cuda/sm90/kb_scheduler.h"
#include "cuda/sm90/trace.h"
#include "cuda/sm90_config.h"
#include "problem.h"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

// The steps of a tile's key block in order, (query head of the group, row block), advanced without divisions:
// the row blocks from `first` (causal: the first that sees a key of the block) of each query head in turn.
struct StepCursor {
  int64_t head;
  int block;
  __device__ void advance(int first, int end) {
    if (++block == end) {
      block = first;
      ++head;
    }
  }
  // The row blocks from the last down (KbTile::descending), each query head's in turn.
  __device__ void retreat(int first, int end) {
    if (block-- == first) {
      block = end - 1;
      ++head;
    }
  }
};

// kDirectDq: each step's dQ partial, finished (KbFinish), is rounded to 16 bits and added into dQ itself (rows of
// up to kSm90DirectDqMaxSk keys); otherwise added in fp32 into the accumulator that convert_dq_kernel converts.
template <class Element_, int kHeadDim_, bool kSavedP_, bool kDirectDq_>
struct KbConfig {
  using Element = Element_;
  static constexpr DType kDType = ElementTraits<Element>::kDType;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kSavedP = kSavedP_;
  static constexpr bool kDirectDq = kDirectDq_;
  using DqElement = std::conditional_t<kDirectDq, Element, float>;  // what a dQ partial is added as
  static constexpr int kBlockM = 64;   // query rows per step (one wgmma M)
  static constexpr int kBlockN = 128;  // keys per CTA, 64 per consumer
  // (Q, dP[, P]) stages: three of 32 KB in recompute, two of 48 KB in saved-P.
  static constexpr int kStages = kSavedP ? 2 : 3;

  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  using HD = Int<kHeadDim>;
  using ST = Int<kStages>;

  // The step's tiles as TMA writes them, 128-byte swizzled; transposed views of the same buffers give the
  // MN-major wgmma operands.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<BM, HD, ST>{}));   // (rows, d, stage)
  using SmemLayoutQt = decltype(composition(SmemLayoutQ{}, make_layout(Shape<HD, BM, ST>{},
                                                                       Stride<BM, _1, Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<BN, HD>{}));       // (keys, d)
  using SmemLayoutKt = decltype(composition(SmemLayoutK{}, make_layout(Shape<HD, BN>{}, Stride<BN, _1>{})));
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<BM, BN, ST>{}));   // (rows, keys, stage)

  using TmaQ = TmaLoad<Element, HD, decltype(SmemLayoutQ{}(_, _, 0))>;
  using TmaK = TmaLoad<Element, HD, SmemLayoutK>;
  using TmaP = TmaLoad<Element, int32_t, decltype(SmemLayoutP{}(_, _, 0))>;

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kPBytes = kBlockM * kBlockN * sizeof(Element);
  static constexpr uint32_t kStageBytes = kQBytes + kPBytes * (kSavedP ? 2 : 1);

  // The TMA descriptors of a step's inputs (p in saved-P mode only: a copy of dp otherwise, never used).
  struct Loads {
    TmaQ q;
    TmaK k;
    TmaP dp;
    TmaP p;
  };

  static constexpr int kConsumers = 2;
  static constexpr int kHalf = kBlockN / kConsumers;  // keys (Sᵀ, dK) of a consumer
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);
  static constexpr int kConsumerThreads = kWarpgroupThreads * kConsumers;
  static constexpr int kCtasPerSm = 1;  // (shared memory): a persistent grid of one CTA per SM
  // The producer warpgroup's warps.
  static constexpr int kLoadWarp = 0;
  static constexpr int kRowsWarp = 1;
  static constexpr int kDqWarp = 2;
  using Trace = NoTrace;  // the step micro-benchmark's configs time the phases (trace.h)
  // Registers per thread by role (setmaxnreg): a consumer holds dK (64), K_w as Sᵀ's A operand (32), Sᵀ (32), the
  // dQ partial of its turn (64, in flight into the next step), dS as the dK product's operand (16) and dP (16).
  // setmaxnreg moves registers between
  // the warpgroups of the launch allocation (the 64 K register file over kThreads, rounded down to a multiple
  // of 8): asking for more than it holds would leave the consumers waiting.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static constexpr int kLaunchRegs = 64 * 1024 / kThreads / 8 * 8;
  static_assert(kWarpgroupThreads * (kProducerRegs + kConsumers * kConsumerRegs) <= kThreads * kLaunchRegs,
                "the launch allocation holds the roles");
  // Named barriers (CUTLASS numbers them after its reserved ones), by step parity p: the other consumer's dS of
  // a step written (the consumer whose turn it is syncs, the other arrives); a dQ staging buffer written by the
  // consumer of its turn (full) and read by the reduce-add (empty).
  static constexpr uint32_t kDsBarrier = 0;       // + parity
  static constexpr uint32_t kDqFullBarrier = 2;   // + buffer
  static constexpr uint32_t kDqEmptyBarrier = 4;  // + buffer
  static constexpr int kDqBarrierThreads = kWarpgroupThreads + 32;  // one consumer and the dQ warp
  // dS and the dQ staging are double-buffered by step parity; the dQ product of step t is consumer t mod 2's, and
  // so is staging buffer t mod 2. A consumer writes dS buffer t mod 2 in step t once the dQ product of step
  // t − 2 (its last reader, consumer t mod 2's) is complete: consumer t mod 2 waited for it itself in step
  // t − 1; the other passed the dS barrier of step t − 1, which consumer t mod 2 arrives at after that wait.
  // t counts the CTA's steps over all its tiles, so that parities and turns alternate across a tile's end as
  // within a tile.
  static constexpr int kBuffers = 2;

  using HF = Int<kHalf>;
  using DB = Int<kBuffers>;
  using TileOrder = KbTileOrder<kBlockM, kBlockN>;

  // dP and P as (keys, rows, stage): the transposed view of the (rows, keys) tiles that TMA writes, read by
  // ldmatrix.trans into Sᵀ's accumulator layout.
  using SmemLayoutPt = decltype(composition(
      SmemLayoutP{}, make_layout(Shape<BN, BM, ST>{}, Stride<BM, _1, Int<kBlockM * kBlockN>>{})));
  // dS, (rows, keys, buffer), K-major: the dQ product's A operand; written through its transposed view
  // (keys, rows, buffer) by stmatrix.trans from dSᵀ's accumulator layout.
  using SmemLayoutdS2 = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<BM, BN, DB>{}));
  using SmemLayoutdSt2 = decltype(composition(
      SmemLayoutdS2{}, make_layout(Shape<BN, BM, DB>{}, Stride<BM, _1, Int<kBlockM * kBlockN>>{})));
  // dQ partials, 128-byte swizzled (rows 8 apart in different banks) as TMA reads them.
  using SmemLayoutdQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<DqElement>{}, Shape<BM, HD>{}));  // (rows, d)

  // Sᵀ = K_w Qᵀ: M = a consumer's 64 keys, N = 64 rows, K = D; A = K_w from registers (loaded once by
  // ldmatrix, CopyKA), B = Q K-major.
  using MmaSt = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<HF, BM, HD>, GMMA::Major::K, GMMA::Major::K>()));
  using CopyKA = decltype(make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, MmaSt{}));
  // dK += dSᵀ Q: A = dSᵀ from registers (Sᵀ's accumulator layout), B = Q as (D, rows), MN-major.
  using MmadK = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<HF, HD, BM>, GMMA::Major::K, GMMA::Major::MN>()));
  // dQ = dS K over the CTA's 128 keys and all of D, by one consumer: dS K-major, K as (D, keys) MN-major.
  using MmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, HD, BN>, GMMA::Major::K, GMMA::Major::MN>()));
  // The dQ partial, rounded, into its staging buffer by stmatrix (kDirectDq).
  using CopydQ = decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, MmadQ{}));

  // dPᵀ, Pᵀ into Sᵀ's accumulator layout (ldmatrix.trans) and dSᵀ out of it (stmatrix.trans), through the
  // transposed views above (kb_mainloop.cuh; tests/cpp/test_sm90_layouts.cu checks them by value).
  using CopyS2R = decltype(make_tiled_copy_C(Copy_Atom<SM75_U16x8_LDSM_T, Element>{}, MmaSt{}));
  using CopyR2S = decltype(make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, MmaSt{}));
  // Consumer w's (HF, BM) part, its keys, of a (BN, BM) transposed view's stage or buffer.
  template <class Tile>
  CUTE_HOST_DEVICE static auto consumer_keys(Tile&& tile, int w) {
    return local_tile(static_cast<Tile&&>(tile), Shape<HF, BM>{}, make_coord(w, 0));
  }

  // What the partials are reduce-added into, (rows, d, head, batch): dQ or the fp32 accumulator.
  using TmadQ = decltype(make_tma_copy(
      SM90_TMA_REDUCE_ADD{},
      make_tensor(make_gmem_ptr(static_cast<DqElement*>(nullptr)), Shape<int32_t, HD, int32_t, int32_t>{},
                  Stride<int64_t, _1, int64_t, int64_t>{}),
      SmemLayoutdQ{}));

  using StagePipeline = cutlass::PipelineTmaAsync<kStages>;
  using RowsPipeline = cutlass::PipelineAsync<kStages>;  // a step's LSE·log2e and D, beside its stage
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  // The tile ring: the index of each tile the CTA takes, published by the load thread when it starts the tile's
  // loads and read by every other role when it starts the tile (KbTileWriter, KbTileReader). The load thread
  // runs up to kStages steps ahead of the consumers and the dQ warp a step behind them, so with tiles of a step
  // or more the indices in use span at most kStages + 2 tiles' starts: four slots keep the load thread from
  // waiting on the ring but where it runs through tiles without steps, which load nothing.
  static constexpr int kTileSlots = 4;
  using TilePipeline = cutlass::PipelineAsync<kTileSlots>;
  // The ring's readers, each of which releases a slot once it has read it: every lane of the rows and dQ warps
  // and every consumer thread.
  static constexpr int kTileReaders = 2 * cutlass::NumThreadsPerWarp + kConsumerThreads;

  // Each tile starts on a 1024-byte boundary, the period of the 128-byte swizzle.
  template <int kKBuffers_>
  struct StorageOf {
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array<Element, int(cosize_v<SmemLayoutK>) * kKBuffers_> k;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutP>> dp;
    alignas(1024) cute::array<Element, kSavedP ? cosize_v<SmemLayoutP> : 1> p;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutdS2>> ds;
    alignas(1024) cute::array<DqElement, cosize_v<SmemLayoutdQ>> dq[kBuffers];
    // (LSE·log2e, D) of each row of a step (LSE 0 in saved-P, both 0 past Sq), by stage.
    alignas(16) float2 rows[kStages][kBlockM];
    typename StagePipeline::SharedStorage stage_pipe;
    typename RowsPipeline::SharedStorage rows_pipe;
    typename TilePipeline::SharedStorage tile_pipe;
    int tile_index[kTileSlots];  // by slot of the tile ring: an index of the order, or the order's tiles at the end
    alignas(8) uint64_t k_full[kKBuffers_];   // K of a tile loaded (TMA's transaction count)
    alignas(8) uint64_t k_empty[kKBuffers_];  // its last reader, the tile's last dQ product, complete
  };
  // K of a tile: two buffers where shared memory holds them (16-bit dQ staging: 195 → 227 KB in recompute),
  // so that the next tile's K loads while this one runs; otherwise one, reloaded once the tile's last dQ
  // product has read it, while its dQ and dK epilogue runs and the next tile's first stages are already in.
  static constexpr int kKBuffers = sizeof(StorageOf<2>) <= size_t(kSm90SmemPerCta) ? 2 : 1;
  // Tiles claimed from the tile counter as CTAs come free (kb_scheduler.h), not dealt statically.
  static constexpr bool kStaticTiles = false;
  static constexpr bool kPairs = false;  // (KbTileOrder::pair_heads: never)
  using KB = Int<kKBuffers>;
  using Storage = StorageOf<kKBuffers>;
  static constexpr int kSmemBytes = int(sizeof(Storage));
  static_assert(kSmemBytes <= kSm90SmemPerCta, "the key-block pass's shared memory exceeds a CTA's 227 KB");
  // K by buffer, (keys, d, K buffer) as TMA writes each buffer, and its transposed view (d, keys, K buffer),
  // the dQ product's B operand.
  using SmemLayoutKB = decltype(tile_to_shape(SmemAtom{}, Shape<BN, HD, KB>{}));
  using SmemLayoutKtB = decltype(composition(
      SmemLayoutKB{}, make_layout(Shape<HD, BN, KB>{}, Stride<BN, _1, Int<kBlockN * kHeadDim>>{})));

  // Element offset of (row, d) in an fp32 dQ buffer, the swizzle in element units (SmemLayoutdQ's own swizzle
  // acts on byte addresses: applied to an element index it would move the wrong bits).
  CUTE_HOST_DEVICE static int dq_offset(int row, int d) {
    return as_position_independent_swizzle_layout(SmemLayoutdQ{})(row, d);
  }

  // The key-block pass's parameters.
  struct Params {
    Problem prob;
    Loads tma;
    TmadQ tma_dq;
    generic::RowVec lse;    // recompute: log-sum-exp of each row
    generic::RowVec delta;  // D of each row
    TileOrder order;
    int* tile_counter;  // in the workspace, set to 0 by the row statistics: the claims so far (kb_scheduler.h)
  };
};

// A tile, the key block nb of (b, kv_head), and its steps.
template <class Cfg>
struct KbWork {
  int64_t b, kv_head, n0, group;
  int nb, first_row_block, row_blocks, steps;
  bool mirrored, descending;  // (KbTile::mirrored; the first head of a pair walks down; read where Cfg::kPairs)

  __device__ KbWork(const typename Cfg::TileOrder& order, const KbTile& tile)
      : b(tile.b),
        kv_head(tile.kv_head),
        n0(int64_t(tile.nb) * Cfg::kBlockN),
        group(order.group),
        nb(tile.nb),
        first_row_block(order.first_row_block(tile.nb)),
        row_blocks(order.row_blocks),
        steps(order.steps(tile.nb)),
        mirrored(tile.mirrored),
        descending(order.paired && !tile.mirrored) {}
  __device__ StepCursor first() const {
    return {kv_head * group, Cfg::kPairs && descending ? row_blocks - 1 : first_row_block};
  }
  __device__ void advance(StepCursor& at) const {
    if (Cfg::kPairs && descending) {
      at.retreat(first_row_block, row_blocks);
    } else {
      at.advance(first_row_block, row_blocks);
    }
  }
};

// The load thread's side of the tile ring: it takes the CTA's first tile (KbTileOrder::first_tile: its own index,
// unless heads go in pairs) without the counter,
// publishes every index it takes (the end of work, the order's tiles, included, so that every reader stops),
// and claims the next one (one atomicAdd) at the start of its current tile's last step: late, so that a CTA
// holds a claim on a tile it has not begun for as little as the claim's latency needs (a claim made a whole
// tile early, as at a tile's start, widens the tiles in flight and leaves a CTA with a tile that an idle one
// could have taken at the end), and early enough that the atomic's round trip (~1 µs at most) passes under the
// wait for that step's stage and the consumers' remaining steps.
template <class Cfg>
class KbTileWriter {
 public:
  using TilePipeline = typename Cfg::TilePipeline;
  __device__ KbTileWriter(const typename Cfg::Params& params, typename Cfg::Storage& st) : params_(params), st_(st) {}

  __device__ int first() const { return params_.order.template first_tile<Cfg::kPairs>(int(blockIdx.x)); }

  // Publishes `index` to the readers; whether it is a tile (not the end of work).
  __device__ bool publish(int index) {
    typename TilePipeline::Params role;
    role.role = TilePipeline::ThreadCategory::Producer;
    TilePipeline pipe(st_.tile_pipe, role, cute::false_type{});  // (initialised by the kernel)
    // The producer's k-th slot: it starts on the opposite phase of the empty barriers, which are free.
    const typename TilePipeline::PipelineState state(published_ % Cfg::kTileSlots,
                                                     ((published_ / Cfg::kTileSlots) & 1) ^ 1, published_);
    ++published_;
    pipe.producer_acquire(state);
    store_shared_s32(smem_addr(&st_.tile_index[state.index()]), index);
    pipe.producer_commit(state);  // its arrival releases the store
    return index < params_.order.tiles();
  }

  // The index of the CTA's next tile after `current` (kb_claimed_tile; dealt statically: KbTileOrder::next_tile).
  __device__ int claim(int current) const {
    if constexpr (Cfg::kStaticTiles) {
      return params_.order.template next_tile<Cfg::kPairs>(current, int(gridDim.x));
    } else {
      return kb_claimed_tile(atomicAdd(params_.tile_counter, 1), int(gridDim.x), params_.order.tiles());
    }
  }

 private:
  const typename Cfg::Params& params_;
  typename Cfg::Storage& st_;
  int published_ = 0;  // indices published so far (the view and state are rebuilt from it, as the readers')
};

// A reader's side of the tile ring (the rows warp, the dQ warp, the consumers): the CTA's tiles in the order the
// load thread took them, each slot released as soon as it is read. It keeps only the count of indices read: the
// pipeline's view and state are rebuilt from it at each tile, so that nothing of it stays in registers through
// the consumers' steps (which use every register ptxas gives them).
template <class Cfg>
class KbTileReader {
 public:
  using TilePipeline = typename Cfg::TilePipeline;
  __device__ KbTileReader(const typename Cfg::Params& params, typename Cfg::Storage& st) : params_(params), st_(st) {}

  // The next tile into `tile`; false at the end of work.
  __device__ bool next(KbTile& tile) {
    typename TilePipeline::Params role;
    role.role = TilePipeline::ThreadCategory::Consumer;
    TilePipeline pipe(st_.tile_pipe, role, cute::false_type{});  // (initialised by the kernel)
    const typename TilePipeline::PipelineState state(read_ % Cfg::kTileSlots, (read_ / Cfg::kTileSlots) & 1, read_);
    ++read_;
    pipe.consumer_wait(state);
    const int index = load_shared_s32(smem_addr(&st_.tile_index[state.index()]));
    pipe.consumer_release(state);
    if (index >= params_.order.tiles()) return false;
    tile = params_.order.template tile<Cfg::kPairs>(index);
    return true;
  }

 private:
  const typename Cfg::Params& params_;
  typename Cfg::Storage& st_;
  int read_ = 0;  // indices read so far
};

// Which of the kKBuffers K buffers the CTA's k-th K load (k counts tiles with steps) goes into, and the
// phase of that buffer's barriers in that use.
template <class Cfg>
struct KBufferUse {
  int buffer;
  uint32_t phase;
  CUTE_HOST_DEVICE explicit KBufferUse(int k) : buffer(k % Cfg::kKBuffers), phase(uint32_t(k / Cfg::kKBuffers) & 1) {}
};

// A wgmma accumulator of 16-bit values ((2, 2, N/8), M, N') viewed as the A operand of an RS wgmma over K = N:
// ((2, 2, 2), M, N/16) (FlashAttention-3's convert_layout_acc_Aregs).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_as_operand_a(const Layout& acc) {
  static_assert(decltype(rank<0>(acc))::value == 3, "an SM90 accumulator");
  const auto l = logical_divide(get<0, 2>(acc), Tile<_2>{});  // ((2, N/16))
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0, 0>(l)), get<1>(acc),
                     coalesce(make_layout(get<0, 1>(l), get<2>(acc))));
}

}  // namespace qksoftmax::cuda::sm90
