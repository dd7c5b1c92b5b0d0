// The configuration of the pingpong single pass (docs/DESIGN.md, "The pingpong single pass"), one per (dtype,
// head dimension, cluster, mode), 128 keys per CTA: one CTA holds a (batch, key head)'s key block (a
// cluster of C CTAs holds its C key blocks), and each of its two consumer warpgroups owns every other 64-row block
// of the CTA's steps with all of the block's keys, so that a row's statistics over those keys are one warpgroup's
// own (combined with the cluster's other CTAs', sp_pp_exchange.cuh) and each warpgroup's element-wise work runs
// while the other's products keep the tensor cores busy. Per CTA:
//   warpgroup 0    producer: warp 0 (one thread) takes the tiles (dealt statically), publishes them in the tile
//                  ring and loads K per tile and Q per block (Q ring); warp 1 (one thread) loads dP per block
//                  (dP ring), which is freed earlier than Q (its owner alone reads it), and stores each block's
//                  dQ from its dP slot before it loads the slot again;
//   warpgroups 1-2 consumers: block g is warpgroup g mod 2's. Its owner computes S = Q Kᵀ (64 rows × 128 keys),
//                  the row statistics and dS in registers, writes dS to its dS buffer, and in its turn issues
//                  dK_w += dSᵀ Q for the other's previous block and its own (each warpgroup accumulates dK of
//                  its 64 keys over every block), dQ = dS K and S of its next block; then stages dQ in the
//                  block's dP slot (sp_pp_mainloop.cuh). Saved-P (kSavedP): no S; the dP thread loads the
//                  block's P into its dS buffer, the owner reads it there with dP, reduces D = Σ P dP over its
//                  keys (and the cluster's) and writes dS over P; its turn issues dQ alone;
//   warpgroup 3    with kDkWarpgroup, dK of the tile's 128 keys (sp_pp_dk.cuh), staged at the tile's end in the
//                  tile's K buffer and stored from there by warp 2 of the producer warpgroup (one thread, TMA).
// No statistics pass, no workspace, no atomics: the sums run in a fixed order (deterministic by construction).
#pragma once

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90_instances.h"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

// dK of a tile, with a dK warpgroup: staged in the tile's K buffer once every consumer has read K and stored from
// there by one TMA where dK is in TMA's reach (SpPpConfig::Params::dk_by_tma), from the dK warpgroup's registers
// otherwise. QKSOFTMAX_SM90_SP_DK_DIRECT, an A/B build's knob, stores it from registers always.
#ifdef QKSOFTMAX_SM90_SP_DK_DIRECT
constexpr bool kSm90SpDkByTma = false;
#else
constexpr bool kSm90SpDkByTma = true;
#endif

// QKSOFTMAX_SM90_SP_NO_EXCHANGE, a diagnostic build's knob: in a cluster, each CTA's statistics taken as the rows'
// whole (nothing pushed or awaited; dQ and dK wrong), so that the step benchmark times the clusters without the
// exchange.
#ifdef QKSOFTMAX_SM90_SP_NO_EXCHANGE
constexpr bool kSm90SpNoExchange = true;
#else
constexpr bool kSm90SpNoExchange = false;
#endif

// QKSOFTMAX_SM90_SP_NO_TURNS, an A/B build's knob: saved-P's consumers issue dQ without taking turns (the cluster
// exchange's slots stay safe: each warp pushes its rows' exchange x + 1 after its own reads of slot x − 1).
#ifdef QKSOFTMAX_SM90_SP_NO_TURNS
constexpr bool kSm90SpNoTurns = true;
#else
constexpr bool kSm90SpNoTurns = false;
#endif

// QKSOFTMAX_SM90_SP_DS_AFTER_DQ, an A/B build's knob: saved-P's dS announced to the dK warpgroup after its
// owner's dQ is issued (sp_pp_mainloop.cuh), not before the turn.
#ifdef QKSOFTMAX_SM90_SP_DS_AFTER_DQ
constexpr bool kSm90SpDsAfterDq = true;
#else
constexpr bool kSm90SpDsAfterDq = false;
#endif

// QKSOFTMAX_SM90_SP_DQ_RS: saved-P's dQ = dS K takes dS from its owner's registers (RS), issued before dS is
// written for the dK warpgroup, so that the dS store runs under the dQ product and the product reads no dS from
// shared memory (sp_pp_mainloop.cuh); the default (1); =0, an A/B build's knob, reads dS from shared memory (SS).
#ifdef QKSOFTMAX_SM90_SP_DQ_RS
constexpr bool kSm90SpDqRs = QKSOFTMAX_SM90_SP_DQ_RS != 0;
#else
constexpr bool kSm90SpDqRs = true;
#endif

// QKSOFTMAX_SM90_SP_DQ_IN_Q: saved-P's dQ of a block staged in the block's Q slot and stored from there by the load
// thread (SpPpConfig::kDqInQ), the default (1); =0, an A/B build's knob, stages it in the block's dP slot as
// recompute does; =2 besides trades a dP slot for a fourth dS buffer (SpPpConfig::kDeepP).
#ifdef QKSOFTMAX_SM90_SP_DQ_IN_Q
constexpr int kSm90SpDqInQ = QKSOFTMAX_SM90_SP_DQ_IN_Q;
#else
constexpr int kSm90SpDqInQ = 1;
#endif

// QKSOFTMAX_SM90_SP_DIAG, a diagnostic build's knob: Params::diag, read at launch from the environment variable of
// that name, leaves traffic out so that a bench run times the pass without it (results wrong): bit 0 the shared
// blocks' dQ stored instead of added, bit 1 not written at all, bit 2 Q not loaded, bit 3 dP and P not loaded
// (their barriers' bytes completed by the loading thread instead).
#ifdef QKSOFTMAX_SM90_SP_DIAG
constexpr bool kSm90SpDiag = true;
#else
constexpr bool kSm90SpDiag = false;
#endif
enum SpDiag : int { kDiagDqStored = 1, kDiagDqDropped = 2, kDiagNoQ = 4, kDiagNoP = 8 };
__host__ __device__ constexpr bool sp_diag(int diag, int bit) { return kSm90SpDiag && (diag & bit) != 0; }


// dst = src, register for register, by moves that the compiler keeps as copies: a wgmma's A operand registers are not
// to be read before the product's wait (PTX leaves that undefined), so a copy of them serves other readers meanwhile.
template <class Frag>
__device__ void copy_registers(const Frag& src, Frag& dst) {
  const Tensor src32 = recast<uint32_t>(src);  // (size(src) / 2) packed pairs
  Tensor dst32 = recast<uint32_t>(dst);
  CUTE_UNROLL
  for (int i = 0; i < size(src32); ++i) asm volatile("mov.b32 %0, %1;" : "=r"(dst32(i)) : "r"(src32(i)));
}

// A consumer thread's release of a ring slot (`ring`: a PipelineTmaAsync's shared storage): one arrival on this
// CTA's own empty barrier. CUTLASS's consumer_release, for a pipeline built for a cluster of one, arrives on the
// cluster's CTA 0, which in a cluster launch is another CTA's barrier.
template <class Ring, class State>
__device__ void release_slot(Ring& ring, const State& state) {
  ring.empty_barrier_[state.index()].arrive();
}

template <class Element_, int kHeadDim_, bool kDkWarpgroup_, int kCluster_, bool kSavedP_>
struct SpPpConfig {
  using Element = Element_;
  static constexpr DType kDType = ElementTraits<Element>::kDType;
  static constexpr int kHeadDim = kHeadDim_;
  // Saved-P mode: P read (by TMA, into the block's dS buffer) instead of made from S = Q Kᵀ, so its dS carries the
  // signed scale where dS carries it (kb_epilogue.cuh's KbFinish reads kSavedP).
  static constexpr bool kSavedP = kSavedP_;
  static constexpr int kBlockM = 64;        // rows per block (one wgmma M)
  static constexpr int kBlockN = 128;       // keys per CTA
  // CTAs per cluster: CTA r of a cluster holds keys [128 r, 128 r + 128) of the cluster's (batch, key head) (in a
  // mirrored tile, KbTileOrder::paired, key block C − 1 − r), and the CTAs that hold keys of a row block exchange
  // its rows' partial statistics (SpPpExchange); each adds its dQ partial of a shared block into dQ (cleared
  // before) by TMA, key block 0's CTA stores those it alone sees (shared_block). One CTA: no exchange, dQ stored.
  static constexpr int kCluster = kCluster_;
  static_assert(kCluster == 1 || kCluster == 2 || kCluster == 4 || kCluster == 8,
                "clusters of 1, 2, 4 or 8 CTAs (a portable cluster: rows of up to 1024 keys)");
  static constexpr int kPeers = kCluster - 1;  // the other CTAs of a cluster
  static constexpr int kMaxSk = kBlockN * kCluster;
  static_assert(kBlockM == kSpBlockM, "dispatch.cu counts the single pass's steps by sm90_instances.h's kSpBlockM");
  static_assert(kBlockN == kSpBlockN, "dispatch.cu sizes the single pass's clusters by sm90_instances.h's kSpBlockN");
  static constexpr int kConsumers = 2;
  static constexpr int kHalf = kBlockN / kConsumers;  // keys of a consumer's dK
  static constexpr bool kStaticTiles = true;          // KbTileWriter::claim: KbTileOrder's static walk
  // Causal heads in mirrored pairs (KbTileOrder::pair_heads) where the launch pairs them: in clusters.
  static constexpr bool kPairs = kCluster_ > 1;
  // kDkWarpgroup (dispatched; false gives the step benchmark's and kernel tests' second form, where each consumer
  // holds dK of its 64 keys): a fourth warpgroup holds dK of all 128 keys and adds each block's dSᵀ Q as soon as
  // its owner has written dS (sp_pp_dk.cuh), so that the consumers hold no dK accumulator and their turns carry
  // dQ and S alone (docs/DESIGN.md, the way down, 3).
  static constexpr bool kDkWarpgroup = kDkWarpgroup_;
  static_assert(kDkWarpgroup || !kSavedP, "saved-P: the dispatched form (the dK warpgroup Q's only reader)");

  // Rings. Q of block g is read by S(g) (issued in its owner's turn two blocks before), the owner's dK product and
  // the other consumer's (the first of their turns g and g + 1): four slots, the load of Q(g + 2) starting in the
  // turn of block g − 1. dP of block g is read by its owner's
  // ldmatrix and then holds the block's dQ for its TMA store, which the dP load thread issues and awaits before
  // it loads the slot again: three slots. K of two tiles, so that the next tile's K loads under this one. dS of block g is read by its owner's dQ and dK products and by the other consumer's dK
  // product in its next turn: three buffers in rotation, so that a buffer's next writer (block g + 3's owner,
  // after its S(g + 3), which follows that dK product in its own turn) finds it read. Clusters of more than two
  // give a Q slot (16 KB) to the statistics slots of their peers. Saved-P: a dS buffer's next writer is the dP
  // thread's TMA of block g + kDsBuffers's P, after the buffer's ds_free; Q's only reader is the dK warpgroup.
  // Where a block's dQ is staged for its TMA store: its dP slot (stored by the dP thread before the slot's next
  // load), or in saved-P (QKSOFTMAX_SM90_SP_DQ_IN_Q, the default) its Q slot, once the dK warpgroup's product has read Q
  // (stored by the load thread before the slot's next load); the dP slot then goes back to the dP thread as soon as
  // its owner has read dP and P, so that the next loads wait for the block's products alone, not for dQ's staging
  // and store. A dP slot is then held only while its owner reads it, and P's buffer (the block's dS buffer) until
  // the block's products are done: kDeepP (QKSOFTMAX_SM90_SP_DQ_IN_Q=2) gives a dP slot's 16 KB to a fourth dS
  // buffer, each consumer a dP slot of its own, so that block g's P and dP load once its consumer has read block
  // g − 2 (the slot; block g − 4's products, which the buffer waits for, are done by then) instead of once block
  // g − 3's products, the other consumer's last, are done.
  static constexpr bool kDqInQ = kSavedP && kDkWarpgroup_ && kSm90SpDqInQ > 0;
  static constexpr bool kDeepP = kDqInQ && kSm90SpDqInQ >= 2;
  static constexpr int kQStages = kCluster <= 2 ? 4 : 3;
  static constexpr int kPStages = kDeepP ? 2 : 3;
  static constexpr int kKBuffers = 2;
  static constexpr int kDsBuffers = kDeepP ? 4 : 3;
  static constexpr int kDqSlots = kDqInQ ? kQStages : kPStages;

  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  using HD = Int<kHeadDim>;
  using HF = Int<kHalf>;
  using QS = Int<kQStages>;
  using PS = Int<kPStages>;
  using KB = Int<kKBuffers>;
  using DB = Int<kDsBuffers>;

  // Tiles as TMA writes them, 128-byte swizzled, each slot a whole number of swizzle periods; transposed views of
  // the same buffers give the MN-major wgmma operands.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<BM, HD, QS>{}));  // (rows, d, slot)
  using SmemLayoutQt = decltype(composition(SmemLayoutQ{}, make_layout(Shape<HD, BM, QS>{},
                                                                       Stride<BM, _1, Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<BN, HD>{}));      // (keys, d)
  using SmemLayoutKB = decltype(tile_to_shape(SmemAtom{}, Shape<BN, HD, KB>{}));  // (keys, d, buffer)
  using SmemLayoutKtB = decltype(composition(
      SmemLayoutKB{}, make_layout(Shape<HD, BN, KB>{}, Stride<BN, _1, Int<kBlockN * kHeadDim>>{})));
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<BM, BN, PS>{}));  // dP (rows, keys, slot)
  // dS by block (rotating buffers), (rows, keys, buffer), K-major: the dQ product's A operand; its (keys, rows)
  // view dK's.
  using SmemLayoutdS2 = decltype(tile_to_shape(SmemAtom{}, Shape<BM, BN, DB>{}));
  using SmemLayoutdSt2 = decltype(composition(
      SmemLayoutdS2{}, make_layout(Shape<BN, BM, DB>{}, Stride<BM, _1, Int<kBlockM * kBlockN>>{})));
  // A block's dQ, rounded, staged in the block's dP slot (its dP is in registers by then) for one TMA store: a dP
  // slot's layout.
  using SmemLayoutdQ = decltype(tile_to_shape(SmemAtom{}, Shape<BM, HD>{}));  // (rows, d)
  static_assert(kHeadDim == kBlockN && cosize_v<SmemLayoutdQ> * kPStages == cosize_v<SmemLayoutP>,
                "a dP slot holds a block's dQ");
  static_assert(cosize_v<SmemLayoutdQ> * kQStages == cosize_v<SmemLayoutQ>, "a Q slot holds a block's dQ");

  // What one TMA load fills: a Q slot, the K tile, a dP slot.
  using SmemLayoutPSlot = decltype(SmemLayoutP{}(_, _, 0));  // (rows, keys)
  using TmaQ = TmaLoad<Element, HD, decltype(SmemLayoutQ{}(_, _, 0))>;
  using TmaK = TmaLoad<Element, HD, SmemLayoutK>;
  using TmaP = TmaLoad<Element, int32_t, SmemLayoutPSlot>;
  struct Loads {  // (kb_loads; p read in saved-P only)
    TmaQ q;
    TmaK k;
    TmaP dp;
    TmaP p;
  };
  // A gradient as TMA writes a tile of it from shared memory (Smem): dQ stored where the block is the CTA's alone,
  // added (into dQ cleared first) where other CTAs of its cluster hold keys that the block sees
  // (SpPpConfig::shared_block); dK of a tile stored from the tile's K buffer.
  template <class Op, class Smem>
  using TmaGrad = decltype(make_tma_copy(
      Op{},
      make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), Shape<int32_t, HD, int32_t, int32_t>{},
                  Stride<int64_t, _1, int64_t, int64_t>{}),
      Smem{}));
  using TmaStoredQ = TmaGrad<SM90_TMA_STORE, SmemLayoutdQ>;
  using TmaAddedQ = TmaGrad<SM90_TMA_REDUCE_ADD, SmemLayoutdQ>;
  using TmaStoredK = TmaGrad<SM90_TMA_STORE, SmemLayoutK>;
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kPBytes = kBlockM * kBlockN * sizeof(Element);  // a (BM, BN) tile: a dP slot, a dS buffer
  // What a dP slot's barrier counts: dP, and in saved-P P (loaded into the block's dS buffer) as well.
  static constexpr uint32_t kPSlotBytes = kPBytes * (kSavedP ? 2 : 1);
  static_assert(cosize_v<SmemLayoutdS2> == kDsBuffers * kBlockM * kBlockN, "dS buffers are whole tiles");
  // Block g's dS buffer, and the parity of that buffer's barrier phases that block g's use completes.
  CUTE_HOST_DEVICE static constexpr int ds_buffer(int g) { return g % kDsBuffers; }
  CUTE_HOST_DEVICE static constexpr uint32_t ds_phase(int g) { return uint32_t(g / kDsBuffers) & 1; }

  // S = Q Kᵀ: M = the block's 64 rows, N = the 128 keys, K = D; both K-major. A thread holds 2 rows × 32 keys, a
  // row's keys in one quad. dP into that layout by ldmatrix, dS out of it by stmatrix.
  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, BN, HD>, GMMA::Major::K, GMMA::Major::K>()));
  using CopydP = decltype(make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, MmaS{}));
  using CopydS = decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, MmaS{}));
  // dK_w += dSᵀ Q: M = consumer w's 64 keys, N = D, K = the block's rows; dSᵀ keys-contiguous (MN-major), Q as
  // (D, rows), MN-major. The dK warpgroup's: M = all 128 keys (two m64 tiles).
  using MmadK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<HF, HD, BM>, GMMA::Major::MN, GMMA::Major::MN>()));
  using MmadKAll = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BN, HD, BM>, GMMA::Major::MN, GMMA::Major::MN>()));
  // dQ = dS K: M = rows, N = D, K = keys; dS K-major, K as (D, keys), MN-major.
  using MmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<BM, HD, BN>, GMMA::Major::K, GMMA::Major::MN>()));
  // The same with dS from the owner's registers (QKSOFTMAX_SM90_SP_DQ_RS): its accumulator layout is the A
  // operand's (acc_as_operand_a).
  using MmadQRs = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<BM, HD, BN>, GMMA::Major::K, GMMA::Major::MN>()));
  using CopydQ = decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, MmadQ{}));
  // A 16-bit tile of 128 columns in the 128-byte swizzle (SmemAtom: two atoms of 64 columns, the second kTileRows
  // rows of 128 bytes further) read or written by ldmatrix / stmatrix (x4) in a wgmma accumulator's layout: a
  // thread's partition is (CPY, CPY_M, CPY_N) = ((8, (4, 2)), rows / 64, 1), access a of row half m at
  // matrix_address<kTileRows>(at, a, m), `at` the address of its first (matrix_first, from a 1024-byte aligned
  // tile): 32-bit arithmetic on one register, where CuTe's partition keeps every access's address in 64-bit
  // generic arithmetic (Sm90Layouts.MatrixAddresses checks it against that partition for every such tile: dP, dS,
  // the dQ staging and the dK warpgroup's dK in its K buffer).
  using CopydK = decltype(make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, MmadKAll{}));
  static constexpr uint32_t kSwizzleRowBytes = 128;  // a row of the 128-byte swizzle atom
  static constexpr uint32_t kChunkBytes = 16;        // the swizzle's unit, an access's row of 8 values
  static constexpr int kMatrixAccesses = 8;          // per row half: 128 columns, 16 an access
  CUTE_HOST_DEVICE static uint32_t matrix_first(int tid) {
    const int warp = tid / 32, lane = tid % 32;
    const int row = 16 * warp + lane % 8 + 8 * (lane / 8 % 2);  // (x4: lanes 8-15 address rows 8-15)
    return uint32_t(row) * kSwizzleRowBytes + uint32_t((lane / 16) ^ (lane % 8)) * kChunkBytes;
  }
  // Access a's columns 16a + 8·(lane / 16): chunk (lane / 16) + 2(a mod 4) of atom column a / 4, which the swizzle
  // XORs with the row's low 3 bits; the chunk's bits 1-2 come from a alone, so they XOR into `at` (whose tile is
  // 1024-byte aligned: no carry reaches the XORed bits).
  template <int kTileRows>
  CUTE_HOST_DEVICE static constexpr uint32_t matrix_address(uint32_t at, int a, int m) {
    constexpr int kChunksPerAccess = 2, kChunksPerAtom = 8;
    constexpr int kAccessesPerAtom = kChunksPerAtom / kChunksPerAccess;
    return (at ^ uint32_t(kChunksPerAccess * (a % kAccessesPerAtom)) * kChunkBytes) +
           uint32_t(a / kAccessesPerAtom) * kTileRows * kSwizzleRowBytes + uint32_t(m) * kBlockM * kSwizzleRowBytes;
  }
  static_assert(kPBytes % 1024 == 0 && kKBytes % 1024 == 0,
                "matrix_address: every slot, buffer and staging tile 1024-byte aligned (the XORed bits carry-free)");
  static_assert(sizeof(Element) == 2 && kHeadDim == 2 * kSwizzleRowBytes / sizeof(Element) &&
                    kBlockN == 2 * kSwizzleRowBytes / sizeof(Element),
                "matrix_address: 16-bit rows of two swizzle atoms (dP, dS, dQ and dK alike)");
  // Consumer w's (HF, BM) part, its keys, of a (BN, BM) view.
  template <class Tile>
  CUTE_HOST_DEVICE static auto consumer_keys(Tile&& tile, int w) {
    return local_tile(static_cast<Tile&&>(tile), Shape<HF, BM>{}, make_coord(w, 0));
  }

  using QPipeline = cutlass::PipelineTmaAsync<kQStages>;
  using PPipeline = cutlass::PipelineTmaAsync<kPStages>;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  using TileOrder = KbTileOrder<kBlockM, kBlockN>;
  // The tile ring (KbTileWriter, KbTileReader): the load thread runs at most kQStages blocks ahead.
  static constexpr int kTileSlots = 8;
  using TilePipeline = cutlass::PipelineAsync<kTileSlots>;

  // Roles and registers (setmaxnreg within the launch allocation).
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kConsumerThreads = kWarpgroupThreads * kConsumers;
  static constexpr int kDkWarpgroupIndex = 1 + kConsumers;
  static constexpr int kThreads = kWarpgroupThreads * (kDkWarpgroupIndex + (kDkWarpgroup ? 1 : 0));
  static constexpr int kCtasPerSm = 1;  // (shared memory): a persistent grid of one CTA per SM
  static constexpr int kLoadWarp = 0;   // Q, K and the tiles
  static constexpr int kDpWarp = 1;     // dP, and dQ's stores
  static constexpr int kDkStoreWarp = 2;  // dK's stores (with a dK warpgroup)
  // With a dK warpgroup the consumers give up dK's 64 registers and the dK warpgroup holds all 128 keys' (128).
  // The load thread's static walk of mirrored pairs spills at 24 registers, not at 32: the dK warpgroup gives up
  // the 8. Without it the consumers' 240 leave the producers 24.
  static constexpr int kProducerRegs = kDkWarpgroup ? 32 : 24;
  static constexpr int kConsumerRegs = kDkWarpgroup ? 160 : 240;
  static constexpr int kDkRegs = 160;
  static constexpr int kLaunchRegs = 64 * 1024 / kThreads / 8 * 8;
  static_assert(kWarpgroupThreads * (kProducerRegs + kConsumers * kConsumerRegs + (kDkWarpgroup ? kDkRegs : 0)) <=
                    kThreads * kLaunchRegs,
                "the launch allocation holds the roles");
  // Readers of the tile ring: every consumer thread, the dP load thread, and the dK warpgroup's threads and its
  // store thread.
  static constexpr int kTileReaders = kConsumerThreads + 1 + (kDkWarpgroup ? kWarpgroupThreads + 1 : 0);
  // Q's readers that release its slots: both consumers (each reads every block's Q), or with a dK warpgroup the
  // block's owner (its S) and the dK warpgroup: 256 threads either way; in saved-P the dK warpgroup alone (with
  // kDqInQ the block's owner, once its dQ is staged there).
  static constexpr int kQReleasers = (kSavedP ? 1 : 2) * kWarpgroupThreads;
  // Arrivals that free a dS buffer: its owner's and the other consumer's, or the owner's and the dK warpgroup's.
  static constexpr int kDsReaders = 2 * kWarpgroupThreads;
  using Trace = NoTrace;  // the step micro-benchmark's configs time the phases (trace.h)
  // A consumer's statistics slots, per peer, by the parity of its exchanges with that peer: the peer pushes its
  // x-th exchange of a consumer only after it received all of this CTA's (x − 1)-th, which every warp of this
  // consumer pushes part of (its own rows; lane p mod 4 of each quad to peer p) after its own reads of slot x − 2:
  // in program order, and within the warp past the warp-wide shuffles and ldmatrix of block x − 1's sums (and,
  // with turns, past its turn of exchange x − 2). A pair of CTAs exchanges the same blocks, of the same consumer in
  // each: two slots need no "empty" barrier, with turns or without (QKSOFTMAX_SM90_SP_NO_TURNS).
  static constexpr int kStatsSlots = 2;
  // How a consumer combines its rows' partials (SpPpExchange::combine): every lane all of both its rows' (clusters
  // of 2), or a row's split between two lanes of its quad and merged (clusters of 4 and 8; H200, 2026-12-04,
  // bench/results/h200-v46-ab.log: the step 2.252 µs against 2.318–2.373 in clusters of 8, 2.526–2.533 against
  // 2.582–2.603 causal, but 1.887–1.889 against 1.798–1.810 in clusters of 2).
  static constexpr bool kQuadCombine = kCluster >= 4;
  static constexpr uint32_t kStatsBytes = kBlockM * sizeof(float2);  // a slot: a float2 per row
  // Consumer w's slot of peer `peer` (0 … kPeers − 1: the other CTAs by rank, this one left out) and parity.
  CUTE_HOST_DEVICE static constexpr int stats_slot(int w, int peer, int parity) {
    return (w * kPeers + peer) * kStatsSlots + parity;
  }

  // Named barriers (numbered after CUTLASS's reserved ones): the turns (consumer w syncs kTurnBarrier + w, the
  // other arrives) and the tile's last dS written (its owner arrives, the other syncs).
  static constexpr uint32_t kTurnBarrier = 0;  // + consumer
  static constexpr uint32_t kTileDsBarrier = kTurnBarrier + kConsumers;
  static_assert(kTileDsBarrier + 1 + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount <=
                    cutlass::arch::NamedBarrier::HardwareMaxNumNamedBarriers,
                "the named barriers fit the hardware's 16 after CUTLASS's reserved ones");

  struct Storage {
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutKB>> k;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutP>> dp;
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutdS2>> ds;
    typename QPipeline::SharedStorage q_pipe;
    typename PPipeline::SharedStorage p_pipe;
    typename TilePipeline::SharedStorage tile_pipe;
    int tile_index[kTileSlots];
    int32_t dq_block[kDqSlots][4];  // by staging slot: its block's (batch, head, row block, key block), for dQ's store
    alignas(8) uint64_t k_full[kKBuffers];   // K of a tile loaded (TMA's transaction count)
    // Free for a later tile's K: its tile's last products complete, every consumer thread's; with a dK warpgroup,
    // the tile's dK stored from it (the dK store thread's arrival, after k_read and dk_full).
    alignas(8) uint64_t k_empty[kKBuffers];
    // With a dK warpgroup, by K buffer: its tile's last products complete (every consumer thread arrives) ...
    alignas(8) uint64_t k_read[kDkWarpgroup ? kKBuffers : 1];
    // ... and its tile's dK written: staged in it, or stored from registers (every dK warpgroup thread arrives).
    alignas(8) uint64_t dk_full[kDkWarpgroup ? kKBuffers : 1];
    // By dS buffer: free for the dS of its next block, its block's three products done (every consumer thread
    // arrives once its own are; with a dK warpgroup, the owner's and the dK warpgroup's threads); in saved-P
    // free for the next block's P, which the dP thread loads into it.
    alignas(8) uint64_t ds_free[kDsBuffers];
    // With a dK warpgroup, by dS buffer: its block's dS written (its owner's 128 threads arrive).
    alignas(8) uint64_t ds_full[kDkWarpgroup ? kDsBuffers : 1];
    // In a cluster, by consumer, peer and exchange parity: the peer's (LSE, D) of each row of the consumer's block
    // (SpPpExchange), and the barrier its pushes complete.
    alignas(16) float2 stats[kCluster > 1 ? kConsumers * kPeers * kStatsSlots : 1][kBlockM];
    alignas(8) uint64_t stats_full[kCluster > 1 ? kConsumers * kPeers * kStatsSlots : 1];
  };
  static constexpr int kSmemBytes = int(sizeof(Storage));
  // Block g's dS buffer free for it: block g − kDsBuffers's products done with it (the first blocks find it free).
  // Awaited by its owner before dS (recompute) or by the dP thread before P's load (saved-P).
  __device__ static void await_ds_free(Storage& st, int g) {
    if (g >= kDsBuffers) cutlass::arch::ClusterBarrier::wait(&st.ds_free[ds_buffer(g)], ds_phase(g - kDsBuffers));
  }
  static_assert(kSmemBytes <= kSm90SmemPerCta, "the pingpong single pass's shared memory exceeds a CTA's 227 KB");

  struct Params {
    Problem prob;
    Loads tma;
    TmaStoredQ tma_dq;
    TmaAddedQ tma_dq_add;  // (kCluster > 1; unset otherwise)
    TileOrder order;
    TmaStoredK tma_dk;       // (with a dK warpgroup, where dk_by_tma)
    bool dk_by_tma = false;  // dK in TMA's reach (tma_compatible) and kSm90SpDkByTma
    int diag = 0;            // (kSm90SpDiag: SpDiag bits)
  };

  // Whether row block `mb` of key block `nb`'s CTA is shared with other CTAs of the cluster, its dQ then added into
  // dQ cleared first, or the CTA's alone, its dQ stored. The rows that see key block 1 see key block 0 as well
  // (causal masks cut keys past the row): key block 0's CTA shares the blocks from key block 1's first on, the
  // others share every block of theirs (with key block 0's).
  CUTE_HOST_DEVICE static bool shared_block(const TileOrder& order, int nb, int mb) {
    return kCluster > 1 && (nb > 0 || mb >= order.first_row_block(1));
  }
};

// A ring's slot and phase for the CTA's block g (every role counts the same blocks).
template <int kStages>
__device__ inline cutlass::PipelineState<kStages> block_state(int g) {
  return cutlass::PipelineState<kStages>(g % kStages, uint32_t(g / kStages) & 1, g);
}

// A thread's x4 accesses of a (kTileRows, 128) tile at Cfg::matrix_address from `at` (its tile's address plus
// Cfg::matrix_first): access(address, values) for each, the values the 8 slots of frag (CPY, CPY_M, CPY_N), 16-bit,
// the copy's retile_D (loads) or retile_S (stores).
template <class Cfg, int kTileRows, class Frag, class Access>
__device__ void for_each_tile_access(uint32_t at, Frag&& frag, Access&& access) {
  using Layout = decltype(std::decay_t<Frag>{}.layout());
  static_assert(size<0>(Layout{}) == kMatrixValues * Cfg::kMatrixAccesses, "x4 accesses");
  static_assert(size<1>(Layout{}) * Cfg::kBlockM == kTileRows && size<2>(Layout{}) == 1, "row halves of one tile");
  CUTE_UNROLL
  for (int m = 0; m < size<1>(frag); ++m) {
    CUTE_UNROLL
    for (int a = 0; a < Cfg::kMatrixAccesses; ++a) {
      access(Cfg::template matrix_address<kTileRows>(at, a, m), frag(make_coord(_, a), m, 0));
    }
  }
}
template <class Cfg, int kTileRows, class Frag>
__device__ void load_tile_matrices(uint32_t at, Frag&& frag) {
  for_each_tile_access<Cfg, kTileRows>(at, frag, [](uint32_t addr, auto&& v) { load_matrix(addr, v); });
}
template <class Cfg, int kTileRows, class Frag>
__device__ void store_tile_matrices(uint32_t at, const Frag& frag) {
  for_each_tile_access<Cfg, kTileRows>(at, frag, [](uint32_t addr, const auto& v) { store_matrix(addr, v); });
}

}  // namespace qksoftmax::cuda::sm90
