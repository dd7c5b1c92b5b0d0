// The consumer warpgroups of the pingpong single pass (sp_pp_config.h). The CTA's blocks g = 0, 1, … (counted
// over its tiles) alternate between them: block g is consumer g mod 2's. Consumer w, per block j of its own:
//   S(j) awaited (issued in its previous turn, or at the tile's start); dP(j) read; the row statistics and dS(j)
//   (sp_pp_softmax.cuh), written to dS buffer j mod kDsBuffers once block j − kDsBuffers's products are done;
//   its turn (kTurnBarrier + w, which the other consumer's end of turn opens): dK_w += dS(j − 1)ᵀ Q(j − 1) (the
//   other's block before, where the tile has it) + dS(j)ᵀ Q(j), then dQ(j) = dS(j) K, then S(j + 2) (where the
//   tile has it), each a batch; then the other's turn opened;
//   as they complete: the Q slots handed back and both dS buffers announced read; dQ(j) staged in dP(j)'s slot
//   and the slot handed back: the dP load thread stores dQ(j) from it by TMA before it loads the slot again.
// In a cluster, the statistics of a block whose rows see keys of other CTAs are combined with theirs
// (sp_pp_exchange.cuh) before dS. Saved-P (Cfg::kSavedP): no S; P(j) is read from dS(j)'s buffer, where the dP
// thread loaded it on dP(j)'s slot barrier, with dP(j); the statistics are D alone, and dS(j) is written over P(j);
// the turn issues dQ(j) alone, from dS(j)'s registers, and writes dS(j) for the dK warpgroup under it
// (QKSOFTMAX_SM90_SP_DQ_RS; =0: dS(j) written before the turn and read by the product); dP(j)'s slot is handed back
// once dP(j) and P(j) are read, and dQ(j) is staged in Q(j)'s slot once the dK warpgroup has read it (Cfg::kDqInQ; in
// dP(j)'s slot, as above, with QKSOFTMAX_SM90_SP_DQ_IN_Q=0).
// S(j + 2) runs during the other consumer's element-wise work and turn, and each warpgroup's exponentials and
// reductions under the other's products. At a tile's end the consumer that does not own the last block adds that
// block's dK (its dS announced by kTileDsBarrier); each stores dK of its 64 keys.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90/sp_pp_epilogue.cuh"
#include "cuda/sm90/sp_pp_exchange.cuh"
#include "cuda/sm90/sp_pp_softmax.cuh"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct SpPpMainloop {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  using HF = typename Cfg::HF;
  using QPipeline = typename Cfg::QPipeline;
  using PPipeline = typename Cfg::PPipeline;
  static constexpr int kBlockM = Cfg::kBlockM;
  static constexpr int kQStages = Cfg::kQStages, kPStages = Cfg::kPStages;
  static constexpr uint32_t kTileBytes = Cfg::kPBytes;  // a dP slot or a dS buffer further

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;
  int w;  // this consumer, 0 or 1

  __device__ __forceinline__ void run(QPipeline& q_pipe, PPipeline& p_pipe) {
    constexpr bool kDkWarpgroup = Cfg::kDkWarpgroup;  // dK is the dK warpgroup's, not the consumers'
    constexpr bool kSavedP = Cfg::kSavedP;
    const Problem& prob = params.prob;
    const int tid = threadIdx.x % Cfg::kWarpgroupThreads;
    const int other = 1 - w;
    // The turns order the consumers' products; in saved-P with QKSOFTMAX_SM90_SP_NO_TURNS (an A/B build's knob)
    // each issues its dQ as soon as its dS is written.
    constexpr bool kTurns = !(kSavedP && kSm90SpNoTurns);
    // Saved-P with QKSOFTMAX_SM90_SP_DS_AFTER_DQ (an A/B build's knob): a block's dS announced to the dK warpgroup
    // once its owner has issued dQ, so that dQ runs ahead of the block's dK on the tensor pipe.
    // Saved-P (QKSOFTMAX_SM90_SP_DQ_RS, the default): dQ(j) from dS(j)'s registers, issued before dS(j)
    // is written for the dK warpgroup, which then writes it under the product (so announced after dQ's issue, as with
    // kDsAfterDq); the owner's part of the buffer's release follows its own store instead of its product. With
    // Cfg::kDqInQ (or kDsAfterDq) dQ(j)'s staging in Q(j)'s slot then waits for the block's dK, which runs behind dQ.
    constexpr bool kDqRs = kSavedP && kDkWarpgroup && kSm90SpDqRs;
    constexpr bool kDsAfterDq = kSavedP && kDkWarpgroup && kSm90SpDsAfterDq && !kDqRs;
    typename Cfg::Trace trace(w == 0 ? KbTraceRole::kConsumer0 : KbTraceRole::kConsumer1, tid < 32);
    // (fold: in saved-P dS carries the signed scale where it carries the scale, KbFinish)
    const SpPpSoftmax<Cfg> softmax{prob.keys(), prob.scale * kLog2e,
                                   kScaleInDs<Element> ? (kSavedP ? prob.scale : fabsf(prob.scale)) : 1.0f, tid};
    using FragS = typename SpPpSoftmax<Cfg>::FragS;      // (MMA, 1, 1) fp32
    using FragS16 = typename SpPpSoftmax<Cfg>::FragS16;  // (MMA, 1, 1)
    constexpr int kRows = SpPpSoftmax<Cfg>::kRows;
    // In a cluster: the row statistics shared with the other CTAs (their keys), and this thread's rows in a block.
    SpPpExchange<Cfg> exchange{st, params.order, w, int(cute::block_rank_in_cluster())};
    int rows[kRows];
    CUTE_UNROLL
    for (int ri = 0; ri < kRows; ++ri) rows[ri] = get<0>(softmax.coords()(ri, 0));

    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});      // (BM, D, QS)
    Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});    // (D, BM, QS)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKB{});     // (BN, D, KB)
    Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKtB{});   // (D, BN, KB)
    Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS2{});   // (BM, BN, DB)
    Tensor sdSt = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdSt2{});  // (BN, BM, DB)

    typename Cfg::MmaS mma_s;
    auto thr_s = mma_s.get_thread_slice(tid);
    const Tensor tSsQ = thr_s.partition_fragment_A(sQ);  // (MMA, 1, D/16, QS) descriptors
    const Tensor tSsK = thr_s.partition_fragment_B(sK);  // (MMA, 1, D/16, KB) descriptors
    typename Cfg::MmadK mma_dk;
    auto thr_dk = mma_dk.get_thread_slice(tid);
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<HF, HD>{});  // (MMA, 1, 1) fp32 (unused with a dK warpgroup)
    const Tensor tdKsdS = thr_dk.partition_fragment_A(Cfg::consumer_keys(sdSt, w));  // (MMA, 1, BM/16, DB)
    const Tensor tdKsQ = thr_dk.partition_fragment_B(sQt);                           // (MMA, 1, BM/16, QS)
    typename Cfg::MmadQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(tid);
    const Tensor tdQsdS = thr_dq.partition_fragment_A(sdS);  // (MMA, 1, BN/16, DB) descriptors
    const Tensor tdQsK = thr_dq.partition_fragment_B(sKt);   // (MMA, 1, BN/16, KB) descriptors
    typename Cfg::MmadQRs mma_dq_rs;                          // (kDqRs)
    using FragdQ = decltype(partition_fragment_C(mma_dq, Shape<BM, HD>{}));  // (MMA, 1, 1) fp32

    // The 32-bit shared-memory address of this thread's first ldmatrix access of dP in slot 0 and of its first
    // stmatrix access of dS in buffer 0 (Cfg::matrix_address: the others one XOR or add away, a slot or buffer one
    // whole tile further).
    const uint32_t first = Cfg::matrix_first(tid);
    const uint32_t dp_at = smem_addr(st.dp.data()) + first, ds_at = smem_addr(st.ds.data()) + first;
    // dQ staged in its block's dP slot (SpDqStore), from where the dP load thread stores it; with Cfg::kDqInQ in its
    // Q slot, from where the load thread stores it.
    Element* const dq_tiles = Cfg::kDqInQ ? st.q.data() : st.dp.data();
    const SpDqStore<Cfg> dq_out{params, dq_tiles};
    const uint32_t dq_at = smem_addr(dq_tiles) + first;

    // dK_w over a block's rows: its A operand from the block's dS buffer, Q from the block's slot.
    const auto add_dk = [&](int ds_buf, int q_slot) {
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tdKsdS); ++kb) {
        gemm(mma_dk, tdKsdS(_, _, kb, ds_buf), tdKsQ(_, _, kb, q_slot), tdKrdK);
      }
    };

    int g = 0;        // the CTA's blocks so far (both consumers')
    int k_loads = 0;  // tiles with blocks so far
    FragS tSrS;       // (MMA, 1, 1) fp32: S of this consumer's next block
    // S(j) from the tile's K (buffer k_use), Q(j) awaited.
    const auto issue_s = [&](int j, const KBufferUse<Cfg>& k_use) {
      const auto q_state = block_state<kQStages>(j);
      q_pipe.consumer_wait(q_state);
      warpgroup_mma<size<2>(decltype(tSsQ.layout()){}), true, false>(mma_s, tSsQ(_, _, _, q_state.index()),
                                                                    tSsK(_, _, _, k_use.buffer), tSrS);
    };
    // This consumer's block j, row block `block`, of the tile's keys (from key n0), its S issued ahead; j_next: its
    // next block of the tile, whose S its turn issues, −1 where none; prev, last: the other consumer's block j − 1 is
    // of the tile, block j is the tile's last.
    const auto block_step = [&](int j, int j_next, int block, int64_t n0, const KBufferUse<Cfg>& k_use, bool prev,
                                bool last) __attribute__((always_inline)) {
      const int64_t m0 = int64_t(block) * kBlockM;
      const auto q_state = block_state<kQStages>(j);
      const auto p_state = block_state<kPStages>(j);
      [[maybe_unused]] const bool next = j_next >= 0;  // this consumer's next block, in this tile (S ahead)

      // S(j) done (issued ahead: at the tile's start, or in an earlier turn); dP(j) read (and in saved-P P(j));
      // the statistics.
      p_pipe.consumer_wait(p_state);
      if constexpr (!kSavedP) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        if constexpr (kDkWarpgroup) release_slot(st.q_pipe, q_state);  // its S done (dK reads it in its warpgroup)
      }
      const auto copy_dp = typename Cfg::CopydP{}.get_thread_slice(tid);
      FragS16 tSrdP;  // (MMA, 1, 1)
      load_tile_matrices<Cfg, kBlockM>(dp_at + uint32_t(p_state.index()) * kTileBytes, copy_dp.retile_D(tSrdP));
      [[maybe_unused]] FragS16 tSrP;  // (MMA, 1, 1) saved-P
      if constexpr (kSavedP) {
        load_tile_matrices<Cfg, kBlockM>(ds_at + uint32_t(Cfg::ds_buffer(j)) * kTileBytes, copy_dp.retile_D(tSrP));
      }
      if constexpr (Cfg::kDqInQ) release_slot(st.p_pipe, p_state);  // (P's buffer: ds_free, after the products)
      trace.mark(PpTracePhase::kWaitS);
      const bool cut = softmax.cut(m0, n0);
      float m[kRows], f[kRows], fd[kRows];  // (f, fd: l and u until the factors; saved-P: fd u)
      if constexpr (kSavedP) {
        softmax.saved_sums(tSrP, tSrdP, m0, n0, cut, fd);
      } else {
        softmax.sums(tSrS, tSrdP, m0, n0, cut, m, f, fd);
      }
      trace.mark(PpTracePhase::kSums);
      uint32_t peers = 0;  // (a lone CTA holds every key of its rows)
      if constexpr (Cfg::kCluster > 1 && !kSm90SpNoExchange) peers = exchange.peers_of(block);
      if (peers != 0) {
        float2 mine[kRows];
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          // (saved-P: every CTA's partial weighs 1, so that the combination's d is Σ_r u_r = D)
          mine[ri] = kSavedP ? make_float2(0.0f, fd[ri]) : SpPpSoftmax<Cfg>::partial(m[ri], f[ri], fd[ri]);
        }
        float top[kRows], sum[kRows], d[kRows];
        exchange.combine(peers, mine, rows, tid, top, sum, d, [&](PpTracePhase phase) { trace.mark(phase); });
        trace.mark(PpTracePhase::kCombine);
        if constexpr (kSavedP) {
          softmax.saved_factors(d, f, fd);
        } else {
          softmax.factors_of(m, top, sum, d, f, fd);
        }
      } else if constexpr (kSavedP) {
        softmax.saved_factors(fd, f, fd);
      } else {
        softmax.factors(f, fd);
      }
      FragS16 tSrdS;  // (MMA, 1, 1)
      if constexpr (kSavedP) {
        softmax.ds(tSrP, tSrdP, cut, f, fd, tSrdS);
      } else {
        softmax.ds(tSrS, tSrdP, cut, f, fd, tSrdS);
      }
      trace.mark(PpTracePhase::kSoftmax);
      // dS(j)'s buffer: block j − kDsBuffers's products done (in saved-P awaited by the dP thread before P(j)'s
      // load).
      if constexpr (!kSavedP) Cfg::await_ds_free(st, j);
      trace.mark(PpTracePhase::kDsFree);
      // dS(j) into its buffer (in saved-P over P(j)), for the dQ product (SS) and dK's.
      const auto store_ds = [&](const FragS16& frag) __attribute__((always_inline)) {
        store_tile_matrices<Cfg, kBlockM>(ds_at + uint32_t(Cfg::ds_buffer(j)) * kTileBytes,
                                          typename Cfg::CopydS{}.get_thread_slice(tid).retile_S(frag));
        cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
      };
      // kDqRs: dS written in the turn, under the dQ product, from a copy of its registers (the product's A operand,
      // which PTX leaves undefined to read before the product's wait).
      [[maybe_unused]] FragS16 tSrdS_copy;  // (MMA, 1, 1)
      if constexpr (kDqRs) {
        copy_registers(tSrdS, tSrdS_copy);
      } else {
        store_ds(tSrdS);
        if constexpr (kDkWarpgroup) {
          // (for the dK warpgroup; with kDsAfterDq once this block's dQ is issued)
          if constexpr (!kDsAfterDq) cutlass::arch::ClusterBarrier::arrive(&st.ds_full[Cfg::ds_buffer(j)]);
        } else if (last) {
          cutlass::arch::NamedBarrier::arrive(Cfg::kConsumerThreads, Cfg::kTileDsBarrier);
        }
        trace.mark(PpTracePhase::kStoreDs);
      }

      // The turn (its own named barrier, opened by the other consumer's end of turn, after which its dS of block
      // j − 1 is visible here), three batches back to back: dK over this consumer's keys of block j − 1 (the
      // other's, where the tile has it) and of block j, dQ(j), S(j + 2) (where the tile has it); then the other
      // consumer's turn opened. Then, as they complete: the Q slots handed back and dS(j − 1) announced read by
      // this consumer; dS(j) announced read (its dK and dQ products done); dQ(j) staged in dP(j)'s slot (its dP
      // in registers since the statistics, each warp its own rows) and the slot handed back to the dP load
      // thread, which stores dQ(j) from it. S(j + 2) runs on into the other consumer's turn.
      if constexpr (kTurns) cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, Cfg::kTurnBarrier + w);
      trace.mark(PpTracePhase::kTurnWait);
      const auto q_prev = block_state<kQStages>(j - 1);
      // (Compiled once per case, each with its own constant waits; inlined: a call would pass the fragments
      // through the stack.)
      const auto turn = [&](auto has_prev, auto has_next) __attribute__((always_inline)) {
        [[maybe_unused]] constexpr bool kPrev = decltype(has_prev)::value;  // (read without a dK warpgroup)
        constexpr bool kNext = decltype(has_next)::value;
        constexpr int kDqBlocks = size<2>(decltype(tdQsdS.layout()){});
        if constexpr (!kDkWarpgroup) {  // (with a dK warpgroup, dK is its own)
          if constexpr (kPrev) q_pipe.consumer_wait(q_prev);  // (its owner awaited it; this consumer reads it too)
          warpgroup_fence_operand(tdKrdK);
          warpgroup_arrive();
          if constexpr (kPrev) add_dk(Cfg::ds_buffer(j - 1), q_prev.index());
          add_dk(Cfg::ds_buffer(j), q_state.index());
          warpgroup_commit_batch();
        }
        FragdQ tdQrdQ;  // (MMA, 1, 1) fp32
        if constexpr (kDqRs) {
          Tensor tSrdS32 = recast<uint32_t>(tSrdS);  // (32) packed pairs
          warpgroup_fence_operand(tSrdS32);          // (packed before the product's fence, not between its HGMMAs)
          const Tensor tdQrdS = make_tensor(tSrdS.data(), acc_as_operand_a(tSrdS.layout()));  // ((2, 2, 2), 1, BN/16)
          warpgroup_mma<kDqBlocks, true, false>(mma_dq_rs, tdQrdS, tdQsK(_, _, _, k_use.buffer), tdQrdQ);
        } else {
          warpgroup_mma<kDqBlocks, true, false>(mma_dq, tdQsdS(_, _, _, Cfg::ds_buffer(j)),
                                                tdQsK(_, _, _, k_use.buffer), tdQrdQ);
        }
        if constexpr (kDsAfterDq) cutlass::arch::ClusterBarrier::arrive(&st.ds_full[Cfg::ds_buffer(j)]);
        if constexpr (kNext) issue_s(j_next, k_use);
        if constexpr (kTurns) cutlass::arch::NamedBarrier::arrive(Cfg::kConsumerThreads, Cfg::kTurnBarrier + other);
        trace.mark(PpTracePhase::kIssue);
        if constexpr (kDqRs) {
          // dS(j) for the dK warpgroup, under the dQ product (which reads dS's registers, not the buffer): the owner
          // is done with the buffer once it is written.
          store_ds(tSrdS_copy);
          cutlass::arch::ClusterBarrier::arrive(&st.ds_full[Cfg::ds_buffer(j)]);
          cutlass::arch::ClusterBarrier::arrive(&st.ds_free[Cfg::ds_buffer(j)]);
          trace.mark(PpTracePhase::kStoreDs);
        }
        constexpr int kAfterDq = kNext ? 1 : 0;  // batches issued after dQ's
        if constexpr (!kDkWarpgroup) {
          warpgroup_wait<kAfterDq + 1>();
          warpgroup_fence_operand(tdKrdK);
          if constexpr (kPrev) {
            cutlass::arch::ClusterBarrier::arrive(&st.ds_free[Cfg::ds_buffer(j - 1)]);
            release_slot(st.q_pipe, q_prev);
          }
          release_slot(st.q_pipe, q_state);
        }
        warpgroup_wait<kAfterDq>();
        warpgroup_fence_operand(tdQrdQ);
        if constexpr (!kDqRs) cutlass::arch::ClusterBarrier::arrive(&st.ds_free[Cfg::ds_buffer(j)]);
        if constexpr (Cfg::kDqInQ) {
          // Q(j) read by the dK warpgroup's product (block j's buffer free: that product done too).
          cutlass::arch::ClusterBarrier::wait(&st.ds_free[Cfg::ds_buffer(j)], Cfg::ds_phase(j));
          trace.mark(PpTracePhase::kWaitProducts);
          dq_out.stage(tdQrdQ, dq_at, q_state.index(), tid);
          release_slot(st.q_pipe, q_state);  // (the load thread stores dQ from the slot before loading it again)
        } else {
          trace.mark(PpTracePhase::kWaitProducts);
          dq_out.stage(tdQrdQ, dq_at, p_state.index(), tid);
          release_slot(st.p_pipe, p_state);  // (the dP load thread stores dQ from the slot before loading it again)
        }
        trace.mark(PpTracePhase::kStoreDq);
      };
      if constexpr (kSavedP) {  // (no S to issue; kPrev unread: dK is the dK warpgroup's)
        turn(std::false_type{}, std::false_type{});
      } else if constexpr (kDkWarpgroup) {  // (kPrev unread: dK is the dK warpgroup's)
        if (next) {
          turn(std::false_type{}, std::true_type{});
        } else {
          turn(std::false_type{}, std::false_type{});
        }
      } else if (prev) {
        if (next) {
          turn(std::true_type{}, std::true_type{});
        } else {
          turn(std::true_type{}, std::false_type{});
        }
      } else if (next) {
        turn(std::false_type{}, std::true_type{});
      } else {
        turn(std::false_type{}, std::false_type{});
      }
    };
    // The turns run on across tiles: consumer 0 takes the CTA's first.
    if (kTurns && w == 1) cutlass::arch::NamedBarrier::arrive(Cfg::kConsumerThreads, Cfg::kTurnBarrier + 0);
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      trace.mark(PpTracePhase::kTileRead);
      const KbWork<Cfg> work(params.order, tile);
      const KBufferUse<Cfg> k_use(k_loads);
      exchange.mirrored = work.mirrored;
      const int g0 = g, g_end = g + work.steps;
      if constexpr (!kDkWarpgroup) {
        mma_dk.accumulate_ = GMMA::ScaleOut::One;
        clear(tdKrdK);
      }
      // This consumer's first block of the tile and its row block (the cursor walks every block of the tile).
      StepCursor at = work.first();
      int j = g0 + ((g0 ^ w) & 1);
      if (j > g0) work.advance(at);
      if (work.steps > 0) {
        ++k_loads;
        Cfg::TxBarrier::wait(&st.k_full[k_use.buffer], k_use.phase);
        trace.mark(PpTracePhase::kTileK);
        if constexpr (!kSavedP) {
          if (j < g_end) issue_s(j, k_use);
        }
      }
      trace.mark(PpTracePhase::kTileStart);
      for (; j < g_end; j += 2) {
        const int block = at.block;
        work.advance(at);
        work.advance(at);  // (at: this consumer's next block)
        block_step(j, j + 2 < g_end ? j + 2 : -1, block, work.n0, k_use, j > g0, j + 1 == g_end);
      }
      g = g_end;
      if (work.steps > 0) {
        // K is read no more by this consumer (its last S and dQ products are done): with a dK warpgroup, which
        // stages the tile's dK in K's buffer, k_read; otherwise the buffer is free for a later tile's K.
        if constexpr (kDkWarpgroup) {
          cutlass::arch::ClusterBarrier::arrive(&st.k_read[k_use.buffer]);
        } else {
          cutlass::arch::ClusterBarrier::arrive(&st.k_empty[k_use.buffer]);
        }
        // The tile's last block is the other consumer's: its dS into dK_w.
        if (!kDkWarpgroup && ((g_end - 1) & 1) != w) {
          cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, Cfg::kTileDsBarrier);
          const auto q_last = block_state<kQStages>(g_end - 1);
          q_pipe.consumer_wait(q_last);
          warpgroup_fence_operand(tdKrdK);
          warpgroup_arrive();
          add_dk(Cfg::ds_buffer(g_end - 1), q_last.index());
          warpgroup_commit_batch();
          warpgroup_wait<0>();
          warpgroup_fence_operand(tdKrdK);
          cutlass::arch::ClusterBarrier::arrive(&st.ds_free[Cfg::ds_buffer(g_end - 1)]);
          release_slot(st.q_pipe, q_last);
        }
      }
      if constexpr (!kDkWarpgroup) {
        kb_store_dk<Cfg>(params, w, tdKrdK, thr_dk.partition_C(make_identity_tensor(Shape<HF, HD>{})), work);
      }
      trace.mark(PpTracePhase::kTileEnd);
    }
    // The last turn opened one that nobody takes: its owner passes it, so that no barrier keeps arrivals.
    if (kTurns && (g & 1) == w) cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, Cfg::kTurnBarrier + w);
  }
};

}  // namespace qksoftmax::cuda::sm90
