// The consumer warpgroups of the key-block pass, walking the CTA's tiles from the tile ring. Consumer w owns keys
// [n0 + 64w, n0 + 64w + 64) of the tile's block (Sᵀ, dS, dK), K_w in registers (loaded at the tile's start
// from the tile's K buffer), and the dQ product of every other step (t mod 2 = w, t counting the CTA's steps
// over its tiles, so that the turns alternate across a tile's end). Per 64-row step t:
//   element-wise: dSᵀ = Pᵀ ∘ (dPᵀ − D), P = 2^(S·scale·log2e − LSE·log2e), with dPᵀ (and Pᵀ) by
//   ldmatrix.trans and the step's rows' terms from the rows pipeline, rounded to 16 bits, masked only where the
//   tile is cut; in bf16 the scale folded in (kScaleInDs, KbRows: recompute |scale| · dS, saved-P scale · dS),
//   the dQ partials and dK then taking only a negative scale's sign in recompute, in fp16 the scale (KbFinish);
//   dS into the step's dS buffer by stmatrix.trans. Meanwhile the tensor pipe runs the other consumer's products
//   and, after its turn, this one's dQ product of step t − 1;
//   then it is awaited (wait 0) and:
//   Sᵀ(t + 1) = K_w Q(t + 1)ᵀ (recompute) and dK += dSᵀ Q (both A operands from registers) issued; after its
//   turn, the dQ partial of step t − 1 rounded and stored into its staging buffer for the dQ warp's
//   reduce-add; then on its turn: the other consumer's dS of step t awaited (dS barrier t mod 2, which the other
//   arrives at, without waiting, once its dS is stored and its own dQ product of step t − 1 is complete), the
//   dQ partial = dS K (all of D, the CTA's 128 keys) issued and left in flight into step t + 1. Sᵀ(t + 1) and dK
//   awaited, the stage released. Neither consumer waits for the other's products: they drift apart, one's
//   element-wise work under the other's products.
// At a tile's end every product is awaited: the K buffer is handed back to the producer (the tile's last dQ
// product was its last reader), the last dQ partial staged, dK stored; the next tile's first stages are
// already loaded or loading meanwhile.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct KbMainloop {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  using HF = typename Cfg::HF;
  static constexpr bool kSavedP = Cfg::kSavedP;
  static constexpr int kBlockM = Cfg::kBlockM, kHalf = Cfg::kHalf, kBuffers = Cfg::kBuffers;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;
  int w;  // this consumer, 0 or 1

  template <class StagePipeline, class RowsPipeline>
  __device__ void run(StagePipeline& stage_pipe, RowsPipeline& rows_pipe) {
    // The dS barrier counts both consumers: the one whose turn it is waits, the other arrives.
    constexpr int kDsBarrierThreads = Cfg::kConsumerThreads;
    const Problem& prob = params.prob;
    const int tid = threadIdx.x % Cfg::kWarpgroupThreads;
    typename Cfg::Trace trace(w == 0 ? KbTraceRole::kConsumer0 : KbTraceRole::kConsumer1, tid < 32);
    const KeyRange keys = prob.keys();
    const float scale_log2 = prob.scale * kLog2e;

    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});       // (BM, D, ST)
    Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});     // (D, BM, ST)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKB{});      // (BN, D, KB)
    Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKtB{});    // (D, BN, KB)
    Tensor sdPt = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutPt{});   // (BN, BM, ST)
    Tensor sPt = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutPt{});     // (BN, BM, ST), saved-P
    Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS2{});   // (BM, BN, DB)
    Tensor sdSt = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdSt2{});  // (BN, BM, DB)

    // Sᵀ of this consumer's keys: (HF, BM), keys on M.
    typename Cfg::MmaSt mma_s;
    auto thr_s = mma_s.get_thread_slice(tid);
    using FragS = decltype(partition_fragment_C(mma_s, Shape<HF, BM>{}));  // (MMA, 1, 1) fp32
    using FragS16 = decltype(make_fragment_like<Element>(FragS{}));        // (MMA, 1, 1)
    // This consumer's keys of K buffer b: (HF, D).
    const auto sKw_of = [&](int b) { return local_tile(sK(_, _, b), Shape<HF, HD>{}, make_coord(w, 0)); };
    Tensor tSrK = thr_s.partition_fragment_A(sKw_of(0));                                 // (MMA, 1, D/16) registers
    const Tensor tSrQ = thr_s.partition_fragment_B(sQ);                                // (MMA, 1, D/16, ST)
    typename Cfg::CopyKA s2r_k;
    auto thr_s2r_k = s2r_k.get_thread_slice(tid);
    Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<HF, BM>{}));            // (MMA, 1, 1) → (key, row)
    Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));                  // (keys, rows) → (key, row)
    constexpr int kKeys = size<0>(decltype(tScS_rc.layout()){});
    constexpr int kRows = size<1>(decltype(tScS_rc.layout()){});

    // dPᵀ, Pᵀ into registers and dSᵀ out, transposed by ldmatrix / stmatrix.
    typename Cfg::CopyS2R s2r;
    typename Cfg::CopyR2S r2s;
    auto thr_s2r = s2r.get_thread_slice(tid);
    auto thr_r2s = r2s.get_thread_slice(tid);

    typename Cfg::MmadK mma_dk;
    auto thr_dk = mma_dk.get_thread_slice(tid);
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<HF, HD>{});  // (MMA, 1, 1) fp32, the block's
    const Tensor tdKrQ = thr_dk.partition_fragment_B(sQt);           // (MMA, 1, BM/16, ST) descriptors

    typename Cfg::MmadQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(tid);
    const Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);   // (MMA, 1, BN/16, DB) descriptors
    const Tensor tdQrK = thr_dq.partition_fragment_B(sKt);    // (MMA, 1, BN/16, KB) descriptors
    // The dQ partial into this consumer's staging buffer (buffer w: its turns are the steps t mod 2 = w).
    typename Cfg::CopydQ r2s_dq;
    auto thr_r2s_dq = r2s_dq.get_thread_slice(tid);
    const auto dq_addr = [&] {  // (A, CPY_M, CPY_D), kDirectDq
      if constexpr (Cfg::kDirectDq) {
        return matrix_addresses(thr_r2s_dq.partition_D(
            make_tensor(make_smem_ptr(st.dq[w].data()), typename Cfg::SmemLayoutdQ{})));
      } else {
        return 0;
      }
    }();
    Tensor tdQcdQ = thr_dq.partition_C(make_identity_tensor(Shape<BM, HD>{}));  // (MMA, 1, 1) → (r, d), fp32
    const uint32_t rows_base = smem_addr(&st.rows[0][0]);
    constexpr uint32_t kRowsStageBytes = uint32_t(sizeof(st.rows[0]));

    // Sᵀ of the step in stage `stage` into acc, one wgmma batch.
    const auto issue_s = [&](int stage, FragS& acc) {
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      mma_s.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tSrK); ++kb) {
        gemm(mma_s, tSrK(_, _, kb), tSrQ(_, _, kb, stage), acc);
        mma_s.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };

    // dSᵀ of the step from row m0 at this consumer's keys from n0w, carrying the scale in bf16 (what the rows
    // pipeline holds of its rows in slot `slot`: KbRows): Sᵀ in tSrS (recompute) or Pᵀ in tSrP (saved-P), dPᵀ in
    // tSrdP. Per element only where the block is cut, and cheaply where the causal diagonal alone cuts it (a step
    // in six at S = 1024); a block that no row sees is zero without any of it.
    const auto dst_of = [&](const FragS& tSrS, const FragS16& tSrP, const FragS16& tSrdP, FragS16& tSrdS,
                            int slot, int64_t m0, int64_t n0w) {
      Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));     // (keys, rows)
      Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));     // (keys, rows), saved-P
      Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));  // (keys, rows)
      Tensor tSrdS_rc = make_tensor(tSrdS.data(), rowcol(tSrdS.layout()));  // (keys, rows)
      const uint32_t rows = rows_base + uint32_t(slot) * kRowsStageBytes;
      // The element-wise work, compiled once per kind of cut (the uncut kind tests nothing else first).
      const auto elementwise = [&](auto kind, int diagonal) {
        constexpr BlockCut kCut = decltype(kind)::value;
        CUTE_UNROLL
        for (int ci = 0; ci < kRows; ++ci) {
          const int r = get<1>(tScS_rc(0, ci));
          const float2 lse2_delta = load_shared_f2(rows + uint32_t(r) * uint32_t(sizeof(float2)));
          // keys of this consumer that row r sees, where the rows differ otherwise
          const int end = kCut == BlockCut::kRows ? keys.cols_in(m0 + r, n0w, kHalf) : kHalf;
          CUTE_UNROLL
          for (int ki = 0; ki < kKeys; ++ki) {
            const int key = get<0>(tScS_rc(ki, ci));
            const bool keep = kCut == BlockCut::kNone       ? true
                              : kCut == BlockCut::kDiagonal ? key - get<1>(tScS_rc(ki, ci)) <= diagonal
                                                            : key < end;
            float ds;
            if constexpr (kSavedP) {
              const float dp = float(tSrdP_rc(ki, ci));
              ds = float(tSrP_rc(ki, ci)) * (kScaleInDs<Element> ? fmaf(dp, prob.scale, -lse2_delta.y) : dp - lse2_delta.y);
            } else {
              ds = exp2_fast(tSrS_rc(ki, ci) * scale_log2 - lse2_delta.x) * (float(tSrdP_rc(ki, ci)) - lse2_delta.y);
            }
            tSrdS_rc(ki, ci) = Element(keep ? ds : 0.0f);
          }
        }
      };
      // KeyRange::cut's kinds, and before the diagonal's a block that no row of the step sees (on the causal
      // diagonal, the consumer whose 64 keys all lie past the step's rows).
      if (!keys.cuts(m0, kBlockM, n0w, kHalf)) {
        elementwise(std::integral_constant<BlockCut, BlockCut::kNone>{}, 0);
      } else if (keys.sees_none(m0, kBlockM, n0w)) {
        fill(tSrdS, Element(0.0f));
      } else if (keys.diagonal_only(m0, kBlockM, n0w, kHalf)) {
        // key − row ≤ m0 − n0w: within (−kHalf, kHalf) where the diagonal cuts a block that some row sees
        elementwise(std::integral_constant<BlockCut, BlockCut::kDiagonal>{}, int(m0 - n0w));
      } else {
        elementwise(std::integral_constant<BlockCut, BlockCut::kRows>{}, 0);
      }
    };

    // The dQ partial of the CTA's step s (this consumer's turn: buffer s mod 2 = w), its product complete, into
    // the staging buffer once the reduce-add of step s − 2 has read it, for the dQ warp, finished (KbFinish):
    // rounded by stmatrix (kDirectDq), or as fp32 pairs of adjacent columns in 8-byte stores (the swizzle moves 16-byte
    // chunks, so a pair stays together).
    const auto write_dq = [&](int s, const auto& acc) {
      if (s >= kBuffers) cutlass::arch::NamedBarrier::sync(Cfg::kDqBarrierThreads, Cfg::kDqEmptyBarrier + w);
      with_kb_finish<Cfg>(prob, [&](auto finish) {  // compiled per KbFinish
        constexpr KbFinish kFinish = decltype(finish)::value;
        if constexpr (Cfg::kDirectDq) {
          Tensor out = make_fragment_like<Element>(acc);  // (MMA, 1, 1)
          CUTE_UNROLL
          for (int i = 0; i < size(acc); ++i) out(i) = Element(kb_finish<kFinish>(acc(i), prob.scale));
          store_matrices(dq_addr, 0, thr_r2s_dq.retile_S(out));
        } else {
          const uint32_t dq = smem_addr(st.dq[w].data());
          CUTE_UNROLL
          for (int i = 0; i < size(acc); i += 2) {
            const int offset = Cfg::dq_offset(get<0>(tdQcdQ(i)), get<1>(tdQcdQ(i)));
            store_shared_f2(dq + uint32_t(offset) * uint32_t(sizeof(float)), kb_finish<kFinish>(acc(i), prob.scale),
                            kb_finish<kFinish>(acc(i + 1), prob.scale));
          }
        }
      });
      cutlass::arch::fence_view_async_shared();  // dQ written by threads, read by TMA
      cutlass::arch::NamedBarrier::arrive(Cfg::kDqBarrierThreads, Cfg::kDqFullBarrier + w);
    };

    // Accumulators and the dK product's register operand, declared once: registers that element-wise code wrote
    // while a batch was in flight must not become a later wgmma's accumulator (ptxas would serialise every wgmma
    // of the kernel). Every wait that precedes a read of an accumulator retires a batch committed in the same
    // iteration, or is a wait for all: ptxas does not match a partial wait to a batch of the previous iteration
    // (it serialised every wgmma when the dQ partial was read after a partial wait).
    using FragdQ = decltype(partition_fragment_C(mma_dq, Shape<BM, HD>{}));  // (MMA, 1, 1) fp32
    FragdQ tdQrdQ;
    FragS tSrS;  // (MMA, 1, 1) fp32: Sᵀ of the step, recompute
    mma_dk.accumulate_ = GMMA::ScaleOut::One;

    auto stage_state = cutlass::PipelineState<Cfg::kStages>{};
    auto rows_state = typename RowsPipeline::PipelineState{};
    int g = 0;        // the CTA's steps so far: g mod 2 picks the dS and dQ buffers and the dQ product's consumer
    int k_loads = 0;  // tiles with steps so far
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      const int64_t n0w = work.n0 + int64_t(w) * kHalf;  // this consumer's first key
      const KBufferUse<Cfg> k_use(k_loads);
      clear(tdKrdK);  // (no product in flight: the previous tile's were all awaited)
      StepCursor at = work.first();
      if (work.steps > 0) {
        ++k_loads;
        Cfg::TxBarrier::wait(&st.k_full[k_use.buffer], k_use.phase);
        if constexpr (!kSavedP) {
          copy(s2r_k, thr_s2r_k.partition_S(sKw_of(k_use.buffer)), thr_s2r_k.retile_D(tSrK));  // resident
          stage_pipe.consumer_wait(stage_state);  // Sᵀ of step 0
          issue_s(stage_state.index(), tSrS);
          warpgroup_wait<0>();
          warpgroup_fence_operand(tSrS);
        }
      }
      trace.mark(KbTracePhase::kTileStart);
      // In flight at the top of step t of the tile (g of the CTA): dQ of step g − 1 where it was this consumer's
      // turn and t > 0.
      for (int t = 0; t < work.steps; ++t, ++g) {
        const int stage = stage_state.index(), buf = g % kBuffers;
        const bool turn = buf == w, last_turn = t > 0 && !turn;  // dQ of step g, of step g − 1
        const int64_t m0 = int64_t(at.block) * kBlockM;
        work.advance(at);
        auto next_state = stage_state;
        ++next_state;
        if constexpr (kSavedP) stage_pipe.consumer_wait(stage_state);
        trace.mark(KbTracePhase::kStageWait);

        FragS16 tSrdP, tSrP;  // (MMA, 1, 1); tSrP saved-P
        copy(s2r, thr_s2r.partition_S(Cfg::consumer_keys(sdPt(_, _, stage), w)), thr_s2r.retile_D(tSrdP));
        if constexpr (kSavedP) {
          copy(s2r, thr_s2r.partition_S(Cfg::consumer_keys(sPt(_, _, stage), w)), thr_s2r.retile_D(tSrP));
        }
        trace.mark(KbTracePhase::kLoadDp);
        rows_pipe.consumer_wait(rows_state);
        trace.mark(KbTracePhase::kRowsWait);
        FragS16 tSrdS;  // (MMA, 1, 1): dSᵀ of this step, the dK product's A operand
        dst_of(tSrS, tSrP, tSrdP, tSrdS, rows_state.index(), m0, n0w);
        rows_pipe.consumer_release(rows_state);
        ++rows_state;
        trace.mark(KbTracePhase::kDs);
        // dS buffer g mod 2 was last read by the dQ product of step g − 2 (Cfg::kBuffers).
        copy(r2s, thr_r2s.retile_S(tSrdS), thr_r2s.partition_D(Cfg::consumer_keys(sdSt(_, _, buf), w)));
        trace.mark(KbTracePhase::kStoreDs);

        // dQ of step g − 1 where it was this consumer's, which ran under the work above: the dQ partial is free.
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdQrdQ);
        if (!turn) {
          // The other consumer's dQ product may read this dS from here on; and by passing this barrier it learns
          // that this consumer's dQ product of step g − 1, the last reader of dS buffer (g + 1) mod 2, which it
          // writes next step, is complete (the wait above). So the arrival comes after that wait.
          cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
          cutlass::arch::NamedBarrier::arrive(kDsBarrierThreads, Cfg::kDsBarrier + buf);
        }
        trace.mark(KbTracePhase::kWaitDq);
        // Sᵀ of step t + 1 first: the next step's element-wise work waits for it alone. Issued in every step
        // (straight-line wgmma keeps ptxas from serialising them): the tile's last step's multiplies its own
        // tiles and is never read.
        if constexpr (!kSavedP) {
          const bool ahead = t + 1 < work.steps;
          if (ahead) stage_pipe.consumer_wait(next_state);
          issue_s(ahead ? next_state.index() : stage, tSrS);
        }
        trace.mark(KbTracePhase::kIssueS);
        // dK += dSᵀ Q: needs no other consumer's dS, so issued before the barrier. No operand fence before it: Sᵀ
        // of the next step is in flight, and a fence reads the registers it names.
        const Tensor tdKrdS = make_tensor(tSrdS.data(), acc_as_operand_a(tSrdS.layout()));  // ((2, 2, 2), 1, BM/16)
        warpgroup_arrive();
        CUTE_UNROLL
        for (int kb = 0; kb < size<2>(tdKrdS); ++kb) gemm(mma_dk, tdKrdS(_, _, kb), tdKrQ(_, _, kb, stage), tdKrdK);
        warpgroup_commit_batch();
        trace.mark(KbTracePhase::kIssueDk);
        if (last_turn) write_dq(g - 1, tdQrdQ);
        trace.mark(KbTracePhase::kWriteDq);
        if (turn) {
          // dQ = dS K over both consumers' dS, once the other's is written.
          cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
          cutlass::arch::NamedBarrier::sync(kDsBarrierThreads, Cfg::kDsBarrier + buf);
          trace.mark(KbTracePhase::kDsBarrier);
          warpgroup_arrive();
          mma_dq.accumulate_ = GMMA::ScaleOut::Zero;
          CUTE_UNROLL
          for (int kb = 0; kb < size<2>(tdQrK); ++kb) {
            gemm(mma_dq, tdQrdS(_, _, kb, buf), tdQrK(_, _, kb, k_use.buffer), tdQrdQ);
            mma_dq.accumulate_ = GMMA::ScaleOut::One;
          }
          warpgroup_commit_batch();
          trace.mark(KbTracePhase::kIssueDq);
          // Sᵀ of step t + 1 (recompute) and dK, the older batches: dQ stays in flight into step t + 1. dK is
          // not left in flight: its A operand registers would be those the next step's element-wise work writes
          // (ptxas reuses them across the loop's back edge, whatever copy is made), and its stage is released
          // now, a step ahead of its reuse.
          warpgroup_wait<1>();
        } else {
          warpgroup_wait<0>();
        }
        if constexpr (!kSavedP) warpgroup_fence_operand(tSrS);
        stage_pipe.consumer_release(stage_state);  // this warpgroup's last reader of the stage is done
        trace.mark(KbTracePhase::kWaitProducts);
        stage_state = next_state;
      }
      // The tile's last dQ product, where it was this consumer's: then this consumer reads the tile's K buffer
      // no more, and once both have said so (k_empty counts every consumer thread) the producer may load it
      // again, while the last dQ partial is staged and dK stored.
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdKrdK);
      warpgroup_fence_operand(tdQrdQ);
      if (work.steps > 0) {
        cutlass::arch::ClusterBarrier::arrive(&st.k_empty[k_use.buffer]);
        if ((g - 1) % kBuffers == w) write_dq(g - 1, tdQrdQ);
      }
      kb_store_dk<Cfg>(params, w, tdKrdK, thr_dk.partition_C(make_identity_tensor(Shape<HF, HD>{})), work);
      trace.mark(KbTracePhase::kTileEnd);
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
