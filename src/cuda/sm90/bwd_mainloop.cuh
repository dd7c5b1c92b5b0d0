// The consumer warpgroups of the single-pass backward (the mainloop). Both consumers take every step (64 query
// rows of one query head against the CTA's live chunks); consumer w owns the chunks at positions 2w, 2w + 1
// (keys, for S, the statistics, dS and dK) and head dimensions [64w, 64w + 64) (for dQ). A step is split in
// two halves, the front one run a step ahead of the back one:
//   front(t + 1)  S = Q Kᵀ over the consumer's live chunks (wgmma, in flight during back(t)'s dS), then dP
//                 (and P) by ldmatrix and the consumer's partial row statistics, pushed to every CTA
//   back(t)       the cluster's statistics combined (pushed a step earlier: the exchange overlaps that step),
//                 dS = P ∘ (dP − D) into the stage's dP tile; once both consumers' dS is written:
//                 dK += dSᵀ Q (its keys) and dQ = dS K (all keys, its half of D) in one wgmma batch, whose
//                 completion frees the stage and sends the dQ pieces to their owners.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/bwd_config.h"
#include "cuda/sm90/cluster_exchange.cuh"
#include "cuda/sm90/mask.h"
#include "cuda/sm90/tile_scheduler.h"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

// A reduction over a row's values in kLanes interleaved partial results (value i into lane i % kLanes), so
// that consecutive operations do not wait on each other; combined at the end.
template <int kLanes>
struct Lanes {
  float v[kLanes];
  __device__ explicit Lanes(float init) {
    CUTE_UNROLL
    for (int i = 0; i < kLanes; ++i) v[i] = init;
  }
  __device__ void add(int i, float x) { v[i % kLanes] += x; }
  __device__ void max(int i, float x) { v[i % kLanes] = fmaxf(v[i % kLanes], x); }
  __device__ float sum() { return tree_reduce(v, SumOp{}); }
  __device__ float max() { return tree_reduce(v, MaxOp{}); }
};

template <class Cfg>
struct BwdMainloop {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using CK = typename Cfg::CK;
  using HD = typename Cfg::HD;
  using HF = typename Cfg::HF;
  using Mask = typename Cfg::Mask;
  static constexpr bool kSavedP = Cfg::kSavedP;
  static constexpr int kChunk = Cfg::kChunk, kBlockM = Cfg::kBlockM;
  static constexpr int kThreads = Cfg::kWarpgroupThreads;
  static constexpr int kQuad = Cfg::kQuad;
  static constexpr int kReduceLanes = 4;  // independent partial results per reduction (a shorter chain)
  static constexpr int kBlocksPerChunk = kChunk / 16;  // wgmma k-blocks of 16 keys
  static constexpr uint32_t kChunkBytes = kBlockM * kChunk * sizeof(Element);
  static constexpr uint32_t kStageBytes = kChunkBytes * Cfg::kChunks;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;
  int w;  // this consumer, 0 or 1

  // A step of an item, as this consumer sees it: its chunks u = w (j = 0) and u = w + 2 (j = 1), each live
  // when below `live`. Steps advance by next(): rows, then query heads of the group, then stages in turn.
  struct StepView {
    int64_t h, m0;
    int stage;
    int live;     // the CTA's live chunks, a prefix [0, live)
    bool masked;  // a column of this consumer's tile is dead or cut by the mask
    CUTE_DEVICE bool has(int w, int j) const { return w + 2 * j < live; }
  };

  __device__ void see(StepView& v, const Mask& mask) const {
    v.live = mask.live(v.m0);
    v.masked = !v.has(w, 1) || mask.partial(v.m0, w + 2);  // chunk w + 2 is cut whenever chunk w is
  }
  __device__ StepView first(const ItemSteps<kBlockM>& steps, const WorkItem& item, int64_t g, const Mask& mask) const {
    StepView v;
    v.h = steps.head(item, 0);
    v.m0 = 0;
    v.stage = int(g % Cfg::kStages);
    see(v, mask);
    return v;
  }
  __device__ StepView next(StepView v, const Mask& mask) const {
    v.m0 += kBlockM;
    if (v.m0 >= params.prob.Sq) {
      v.m0 = 0;
      ++v.h;
    }
    v.stage = v.stage + 1 == Cfg::kStages ? 0 : v.stage + 1;
    see(v, mask);
    return v;
  }

  template <class StagePipeline, class KPipeline>
  __device__ void run(StagePipeline& stage_pipe, KPipeline& k_pipe, const Mask& mask) {
    const Problem& prob = params.prob;
    const int tid = threadIdx.x % kThreads;
    typename Cfg::Trace trace(w == 0 ? TraceRole::kConsumer0 : TraceRole::kConsumer1, tid < 32);
    const int lane = tid % 32;
    const int cluster = params.cluster;
    const uint32_t rank = uint32_t(mask.rank);
    const ItemSteps<kBlockM> steps(prob);
    const float scale_log2 = prob.scale * kLog2e;
    const bool lse_given = !kSavedP && prob.lse.present();
    const bool base_given = kSavedP || lse_given;  // the exponentials' base known: only Σ P·dP is exchanged
    const Operand& lse_op = prob.lse;

    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});     // (BM, D, ST)
    Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});   // (D, BM, ST)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutK{});     // (BN, D), positions
    Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKt{});   // (D, BN)
    Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});   // (BM, BN, ST); dS
    Tensor sdSt = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutPt{});  // (BN, BM, ST)

    // This consumer's S tile, (BM, HF): two chunk products of MmaS, the first chunk's values first.
    typename Cfg::MmaSHalf mma_s_half;
    auto thr_s = mma_s_half.get_thread_slice(tid);
    using FragS = decltype(partition_fragment_C(mma_s_half, Shape<BM, HF>{}));  // (MMA, 1, 1) fp32
    using FragS16 = decltype(make_fragment_like<Element>(FragS{}));              // (MMA, 1, 1)
    Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<BM, HF>{}));      // (MMA, 1, 1) → (m, n)
    Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));            // (rows, cols) → (m, n)
    constexpr int kRows = size<0>(decltype(tScS_rc.layout()){});
    constexpr int kCols = size<1>(decltype(tScS_rc.layout()){});
    constexpr int kColsPerChunk = kCols / 2;
    typename Cfg::MmaS mma_s;
    auto thr_s_chunk = mma_s.get_thread_slice(tid);
    using FragSChunk = decltype(partition_fragment_C(mma_s, Shape<BM, CK>{}));  // (MMA, 1, 1) fp32
    static_assert(2 * size(FragSChunk{}) == size(FragS{}), "two chunk products fill the consumer's S");

    // dP, P into registers and dS out by ldmatrix / stmatrix, addresses of consumer 0's tile at stage 0 (access
    // a covers 16 columns of chunk a / kAccessesPerChunk); other tiles are whole swizzle periods away.
    auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_s_half);
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_s_half);
    auto thr_s2r = s2r.get_thread_slice(tid);
    auto thr_r2s = r2s.get_thread_slice(tid);
    Tensor sdP0 = local_tile(sdP(_, _, 0), Shape<BM, HF>{}, make_coord(0, 0));  // (BM, HF)
    Tensor tSsdP = thr_s2r.partition_S(sdP0);                                     // ((8, A), 1, 1)
    Tensor tSsdS = thr_r2s.partition_D(sdP0);                                     // ((8, A), 1, 1)
    constexpr int kAccesses = size<0, 1>(decltype(tSsdP.layout()){});
    constexpr int kAccessesPerChunk = kAccesses / 2;
    static_assert(size<1>(decltype(tSsdP.layout()){}) == 1 && size<2>(decltype(tSsdP.layout()){}) == 1 &&
                      kAccessesPerChunk * 2 == kAccesses,
                  "a thread's accesses split evenly into the two chunks");
    uint32_t dp_addr[kAccessesPerChunk], ds_addr[kAccessesPerChunk];
    CUTE_UNROLL
    for (int a = 0; a < kAccessesPerChunk; ++a) {
      dp_addr[a] = smem_addr(&tSsdP(make_coord(0, a), 0, 0)) + uint32_t(2 * w) * kChunkBytes;
      ds_addr[a] = smem_addr(&tSsdS(make_coord(0, a), 0, 0)) + uint32_t(2 * w) * kChunkBytes;
    }
    const uint32_t p_delta = smem_addr(st.p.data()) - smem_addr(st.dp.data());  // saved-P: P's tiles beside dP's
    const auto access_offset = [](int a, int stage) {
      return uint32_t(a / kAccessesPerChunk) * kChunkBytes + uint32_t(stage) * kStageBytes;
    };

    typename Cfg::MmadQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(tid);
    Tensor tdQrK = thr_dq.partition_fragment_B(local_tile(sKt, Shape<HF, BN>{}, make_coord(w, 0)));  // (MMA, 1, BN/16)
    using FragdQ = decltype(partition_fragment_C(mma_dq, Shape<BM, HF>{}));      // (MMA, 1, 1) fp32
    static_assert(size(FragdQ{}) == Cfg::kPiecesPerConsumer * Cfg::kPieceValues, "dQ pieces cover the accumulator");

    typename Cfg::MmadK mma_dk;
    auto thr_dk = mma_dk.get_thread_slice(tid);
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<HF, HD>{});                // (MMA, 1, 1) fp32, the head's
    Tensor tdKcdK = thr_dk.partition_C(make_identity_tensor(Shape<HF, HD>{}));    // (MMA, 1, 1) → (n, d)

    FragS tSrE;                                                       // (MMA, 1, 1): e of the step in back()
    Tensor tSrE_rc = make_tensor(tSrE.data(), rowcol(tSrE.layout()));
    FragS16 tSrdP;                                                    // (MMA, 1, 1): its dP
    Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));
    Tensor tSrdP_cp = thr_s2r.retile_D(tSrdP);                        // ((8, A), 1, 1)
    float mloc[kRows];                                                // its partial max per row (·log2e)

    const uint32_t stats_bytes = uint32_t(cluster) * Cfg::kStatsPushBytes;
    const uint32_t sender = 2 * rank + uint32_t(w);

    // wgmma descriptors of stage 0, made once: a stage's are these advanced by its offset (in the descriptor's
    // 16-byte units), K's are the same for every step.
    constexpr uint32_t kQStageDesc = Cfg::kQBytes / 16, kPStageDesc = kStageBytes / 16;
    const Tensor tSrQ0 = thr_s_chunk.partition_fragment_A(sQ(_, _, 0));  // (MMA, 1, D/16) descriptors
    const Tensor tSrK0 = thr_s_chunk.partition_fragment_B(local_tile(sK, Shape<CK, HD>{}, make_coord(2 * w, 0)));
    const Tensor tSrK1 = thr_s_chunk.partition_fragment_B(local_tile(sK, Shape<CK, HD>{}, make_coord(2 * w + 1, 0)));

    // S of a step over this consumer's live chunks into tSrS, one wgmma batch (empty when none is live).
    const auto issue_s = [&](const StepView& v, FragS& tSrS) {
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      const Tensor tSrQ = make_tensor(tSrQ0.data() + uint32_t(v.stage) * kQStageDesc, tSrQ0.layout());
      constexpr int kBlocks = size<2>(decltype(tSrQ0.layout()){});
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        if (!v.has(w, j)) continue;
        Tensor acc = make_tensor(tSrS.data() + j * size(FragSChunk{}), FragSChunk{}.layout());
        const auto& tSrK = j == 0 ? tSrK0 : tSrK1;
        mma_s.accumulate_ = GMMA::ScaleOut::Zero;
        CUTE_UNROLL
        for (int kb = 0; kb < kBlocks; ++kb) {
          gemm(mma_s, tSrQ(_, _, kb), tSrK(_, _, kb), acc);
          mma_s.accumulate_ = GMMA::ScaleOut::One;
        }
      }
      warpgroup_commit_batch();
    };

    // f(ci, keep) over the live columns of row ri of this consumer's tile; only a chunk that some row of the
    // block does not see whole pays for per-element compares.
    const auto for_each_live = [&](const StepView& v, auto is_masked, int ri, auto&& f) {
      const int end = mask.row_end(v.m0 + get<0>(tScS_rc(ri, 0)));
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        if (is_masked && !v.has(w, j)) continue;
        const int u = w + 2 * j;
        const int key_base = mask.key0(u) - j * kChunk;  // key of tile column n: key_base + n
        if (is_masked && mask.partial(v.m0, u)) {
          CUTE_UNROLL
          for (int ci = j * kColsPerChunk; ci < (j + 1) * kColsPerChunk; ++ci) {
            f(ci, key_base + get<1>(tScS_rc(ri, ci)) < end);
          }
        } else {
          CUTE_UNROLL
          for (int ci = j * kColsPerChunk; ci < (j + 1) * kColsPerChunk; ++ci) f(ci, true);
        }
      }
    };

    // front: dP (and P) of the step, e over S in tSrS (recompute; P in saved-P), the partial statistics pushed.
    const auto front = [&](const WorkItem& item, const StepView& v, int64_t g, FragS& tSrS) {
      FragS16 tSrP;                                 // (MMA, 1, 1), saved-P
      Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));
      Tensor tSrP_cp = thr_s2r.retile_D(tSrP);      // ((8, A), 1, 1)
      Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));
      CUTE_UNROLL
      for (int a = 0; a < kAccesses; ++a) {
        if (!v.has(w, a / kAccessesPerChunk)) continue;
        const uint32_t addr = dp_addr[a % kAccessesPerChunk] + access_offset(a, v.stage);
        load_matrix(addr, tSrdP_cp(make_coord(_, a), 0, 0));
        if constexpr (kSavedP) load_matrix(addr + p_delta, tSrP_cp(make_coord(_, a), 0, 0));
      }
      // Both rows of the thread in lockstep (no branch between them), so that their chains of shuffles and
      // exponentials overlap.
      float4 part[kRows];
      with_mask(v.masked, [&](auto is_masked) {
        float mx[kRows];  // this consumer's row max (·log2e): the exponentials' base without a given LSE
        if constexpr (kSavedP) {
          CUTE_UNROLL
          for (int ri = 0; ri < kRows; ++ri) {
            mx[ri] = 0.0f;
            for_each_live(v, is_masked, ri, [&](int ci, bool keep) {
              tSrE_rc(ri, ci) = keep ? float(tSrP_rc(ri, ci)) : 0.0f;
            });
          }
        } else {
          float base[kRows];
          if (lse_given) {
            CUTE_UNROLL
            for (int ri = 0; ri < kRows; ++ri) {
              const int64_t i = v.m0 + get<0>(tScS_rc(ri, 0));
              mx[ri] = 0.0f;
              base[ri] = i < prob.Sq ? static_cast<const float*>(lse_op.ptr)[lse_op.offset(item.b, v.h, i)] * kLog2e : 0.0f;
            }
          } else {
            CUTE_UNROLL
            for (int ri = 0; ri < kRows; ++ri) {
              Lanes<kReduceLanes> m(-INFINITY);
              for_each_live(v, is_masked, ri, [&](int ci, bool keep) {
                m.max(ci, keep ? tSrS_rc(ri, ci) * scale_log2 : -INFINITY);
              });
              mx[ri] = m.max();
            }
            CUTE_UNROLL
            for (int ri = 0; ri < kRows; ++ri) {
              mx[ri] = quad_max<kQuad>(mx[ri]);
              base[ri] = mx[ri] == -INFINITY ? 0.0f : mx[ri];
            }
          }
          CUTE_UNROLL
          for (int ri = 0; ri < kRows; ++ri) {
            for_each_live(v, is_masked, ri, [&](int ci, bool keep) {
              tSrE_rc(ri, ci) = keep ? exp2_fast(tSrS_rc(ri, ci) * scale_log2 - base[ri]) : 0.0f;
            });
          }
        }
        float sum[kRows], dot[kRows];
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          Lanes<kReduceLanes> s(0.0f), d(0.0f);
          for_each_live(v, is_masked, ri, [&](int ci, bool keep) {
            s.add(ci, tSrE_rc(ri, ci));
            d.add(ci, keep ? tSrE_rc(ri, ci) * float(tSrdP_rc(ri, ci)) : 0.0f);
          });
          sum[ri] = s.sum();
          dot[ri] = d.sum();
        }
        quad_sum_rows<kQuad>(sum, dot);
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          part[ri] = base_given ? make_float4(0.0f, 0.0f, dot[ri], 0.0f) : make_float4(mx[ri], sum[ri], dot[ri], 0.0f);
          mloc[ri] = base_given ? 0.0f : mx[ri];
        }
      });
      trace.mark(TracePhase::kFront);
      // To every CTA (lane q of a quad to CTAs q, q + 4), slot `sender`; a CTA alone writes its own memory.
      // No receiver's slot is awaited: this step's buffer was last read in the combine two steps back, and every
      // consumer of every CTA did that before it pushed the partials of the previous step, all of which this
      // consumer has received (its combine of that step waited for them) before it gets here.
      const int buf = int(g & 1);
      if (cluster > 1) {
        const uint32_t full = smem_addr(&st.stats_full[buf]);
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const int row = get<0>(tScS_rc(ri, 0));
          const uint32_t slot = smem_addr(&st.stats[buf][sender][Cfg::stats_row(sender, row)]);
          CUTE_UNROLL
          for (int j = 0; j < Cfg::kMaxCluster / kQuad; ++j) {
            const int c = lane % kQuad + kQuad * j;
            if (c < cluster) push_f4(cluster_addr(slot, uint32_t(c)), part[ri], cluster_addr(full, uint32_t(c)));
          }
        }
        if (w == 0 && tid == 0) Cfg::TxBarrier::arrive_and_expect_tx(&st.stats_full[buf], stats_bytes);
      } else if (lane % kQuad == 0) {
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const int row = get<0>(tScS_rc(ri, 0));
          st.stats[buf][sender][Cfg::stats_row(sender, row)] = part[ri];
        }
      }
      trace.mark(TracePhase::kPushStats);
    };

    // back, first part: the cluster's statistics, dS into registers and over this consumer's dP tile.
    const auto back_ds = [&](const StepView& v, int64_t g) {
      const int buf = int(g & 1);
      const int senders = 2 * cluster;
      if (cluster > 1) {
        Cfg::TxBarrier::wait(&st.stats_full[buf], uint32_t((g >> 1) & 1));
      } else {
        cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, Cfg::kStatsBarrier);
      }
      trace.mark(TracePhase::kStatsWait);
      // The partials of a row are split over the quad that holds it: lane q combines senders q, q + 4, … Both
      // rows in lockstep, their loads first.
      float factor[kRows], delta[kRows];
      constexpr int kPerLane = 2 * Cfg::kMaxCluster / kQuad;
      const int q = lane % kQuad;
      float4 x[kRows][kPerLane];
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        const int row = get<0>(tScS_rc(ri, 0));
        CUTE_UNROLL
        for (int k = 0; k < kPerLane; ++k) {
          const int s = q + kQuad * k;
          x[ri][k] = s < senders ? load_shared_f4(smem_addr(&st.stats[buf][s][Cfg::stats_row(s, row)]))
                                 : make_float4(-INFINITY, 0.0f, 0.0f, 0.0f);
        }
      }
      if (base_given) {
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          float d = 0.0f;
          CUTE_UNROLL
          for (int k = 0; k < kPerLane; ++k) d += x[ri][k].z;
          delta[ri] = d;
        }
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          factor[ri] = 1.0f;
          delta[ri] = quad_sum<kQuad>(delta[ri]);
        }
      } else {
        float base[kRows], sum[kRows], dot[kRows];
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          float mx = -INFINITY;
          CUTE_UNROLL
          for (int k = 0; k < kPerLane; ++k) mx = fmaxf(mx, x[ri][k].x);
          base[ri] = mx;
        }
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          base[ri] = quad_max<kQuad>(base[ri]);
          base[ri] = base[ri] == -INFINITY ? 0.0f : base[ri];
          sum[ri] = 0.0f;
          dot[ri] = 0.0f;
          CUTE_UNROLL
          for (int k = 0; k < kPerLane; ++k) {
            const float e = exp2_fast(x[ri][k].x - base[ri]);  // an empty partial (−inf) weighs 0
            sum[ri] += x[ri][k].y * e;
            dot[ri] += x[ri][k].z * e;
          }
        }
        quad_sum_rows<kQuad>(sum, dot);
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const float inv = sum[ri] > 0.0f ? rcp_fast(sum[ri]) : 0.0f;
          factor[ri] = mloc[ri] == -INFINITY ? 0.0f : exp2_fast(mloc[ri] - base[ri]) * inv;
          delta[ri] = dot[ri] * inv;
        }
      }
      trace.mark(TracePhase::kCombine);
      if (!v.has(w, 0)) return;  // no key of this consumer is live: its tile is read by nothing
      FragS16 tSrdS;                                                        // (MMA, 1, 1)
      Tensor tSrdS_rc = make_tensor(tSrdS.data(), rowcol(tSrdS.layout()));  // (rows, cols)
      Tensor tSrdS_cp = thr_r2s.retile_S(tSrdS);                            // ((8, A), 1, 1)
      // A dead chunk beside a live one is written as zeros (the dK product covers both).
      with_mask(v.masked, [&](auto is_masked) {
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const int end = mask.row_end(v.m0 + get<0>(tScS_rc(ri, 0)));
          CUTE_UNROLL
          for (int j = 0; j < 2; ++j) {
            if (is_masked && !v.has(w, j)) {
              CUTE_UNROLL
              for (int ci = j * kColsPerChunk; ci < (j + 1) * kColsPerChunk; ++ci) tSrdS_rc(ri, ci) = Element(0.0f);
              continue;
            }
            const int u = w + 2 * j;
            const int key_base = mask.key0(u) - j * kChunk;
            const bool partial = is_masked && mask.partial(v.m0, u);
            CUTE_UNROLL
            for (int ci = j * kColsPerChunk; ci < (j + 1) * kColsPerChunk; ++ci) {
              const bool keep = !partial || key_base + get<1>(tScS_rc(ri, ci)) < end;
              const float p = tSrE_rc(ri, ci) * factor[ri];
              tSrdS_rc(ri, ci) = Element(keep ? p * (float(tSrdP_rc(ri, ci)) - delta[ri]) : 0.0f);
            }
          }
        }
      });
      CUTE_UNROLL
      for (int a = 0; a < kAccesses; ++a) {
        store_matrix(ds_addr[a % kAccessesPerChunk] + access_offset(a, v.stage), tSrdS_cp(make_coord(_, a), 0, 0));
      }
    };

    const Tensor tdKrA0 = thr_dk.partition_fragment_A(local_tile(sdSt(_, _, 0), Shape<HF, BM>{}, make_coord(w, 0)));  // (MMA, 1, BM/16)
    const Tensor tdKrB0 = thr_dk.partition_fragment_B(sQt(_, _, 0));    // (MMA, 1, BM/16) descriptors
    const Tensor tdQrdS0 = thr_dq.partition_fragment_A(sdP(_, _, 0));   // (MMA, 1, BN/16) descriptors

    // back, second part: dK += dSᵀ Q over this consumer's keys and dQ = dS K over the live positions, one batch.
    const auto issue_dk_dq = [&](const StepView& v, FragdQ& tdQrdQ) {
      const Tensor tdKrA = make_tensor(tdKrA0.data() + uint32_t(v.stage) * kPStageDesc, tdKrA0.layout());
      const Tensor tdKrB = make_tensor(tdKrB0.data() + uint32_t(v.stage) * kQStageDesc, tdKrB0.layout());
      const Tensor tdQrdS = make_tensor(tdQrdS0.data() + uint32_t(v.stage) * kPStageDesc, tdQrdS0.layout());
      // No operand fence before the batch: S of the next step is in flight, and a fence reads the registers it
      // names. Nothing but wgmma touches these accumulators until the wait.
      warpgroup_arrive();
      if (v.has(w, 0)) {
        CUTE_UNROLL
        for (int kb = 0; kb < size<2>(tdKrA); ++kb) gemm(mma_dk, tdKrA(_, _, kb), tdKrB(_, _, kb), tdKrdK);
      }
      // k-blocks of the positions in kPositions (bit p: position p), the first one zero-initialising.
      const auto dq_over = [&](auto positions) {
        constexpr int kPositions = decltype(positions)::value;
        mma_dq.accumulate_ = GMMA::ScaleOut::Zero;
        CUTE_UNROLL
        for (int kb = 0; kb < size<2>(tdQrdS); ++kb) {
          if (!((kPositions >> (kb / kBlocksPerChunk)) & 1)) continue;
          gemm(mma_dq, tdQrdS(_, _, kb), tdQrK(_, _, kb), tdQrdQ);
          mma_dq.accumulate_ = GMMA::ScaleOut::One;
        }
      };
      // Live chunks [0, live) sit at positions pos(0 … live − 1): {0}, {0, 2}, {0, 1, 2}, all.
      static_assert(Cfg::pos(1) == 2 && Cfg::pos(2) == 1 && Cfg::pos(3) == 3, "the positions of the chunks");
      switch (v.live) {
        case 1: dq_over(Int<0b0001>{}); break;
        case 2: dq_over(Int<0b0101>{}); break;
        case 3: dq_over(Int<0b0111>{}); break;
        case 4: dq_over(Int<0b1111>{}); break;
        default: break;
      }
      warpgroup_commit_batch();
    };

    // The dQ pieces to their owners (piece p to CTA p mod C, this one too), whose reducer warps sum them; a CTA
    // alone stores its dQ itself (distributed shared memory needs a cluster of two).
    const auto send_dq = [&](const WorkItem& item, const StepView& v, int64_t g, const FragdQ& tdQrdQ) {
      const auto value = [&](int e) { return make_float4(tdQrdQ(e), tdQrdQ(e + 1), tdQrdQ(e + 2), tdQrdQ(e + 3)); };
      if (cluster > 1) {
        const int buf = int(g & 1);
        if (g >= Cfg::kBuffers) Cfg::Barrier::wait(&st.dq_empty[buf], uint32_t(((g >> 1) - 1) & 1));
        trace.mark(TracePhase::kDqEmpty);
        const int log2_ctas = mask.log2_cluster;
        const uint32_t full = smem_addr(&st.dq_full[buf]);
        constexpr uint32_t kVectorBytes = kThreads * sizeof(float4);  // between a slot's vectors
        CUTE_UNROLL
        for (int j = 0; j < Cfg::kPiecesPerConsumer; ++j) {
          const int p = w * Cfg::kPiecesPerConsumer + j;
          const uint32_t owner = uint32_t(p & (cluster - 1));
          const int slot = (int(rank) << (Cfg::kLog2Pieces - log2_ctas)) + (p >> log2_ctas);
          const uint32_t remote = cluster_addr(smem_addr(&st.dq[buf][slot][0][tid]), owner);
          const uint32_t remote_full = cluster_addr(full, owner);
          CUTE_UNROLL
          for (int vv = 0; vv < Cfg::kPieceVectors; ++vv) {
            push_f4(remote + vv * kVectorBytes, value(j * Cfg::kPieceValues + 4 * vv), remote_full);
          }
        }
      } else {
        const DqRows<Cfg> rows(params, item.b, v.h, v.m0, w * Cfg::kHalf);
        CUTE_UNROLL
        for (int e = 0; e < size(tdQrdQ); e += 4) rows.store(tid, e, value(e));
      }
    };

    // The dQ partial, declared once: registers that element-wise code wrote while S was in flight must not
    // become a later wgmma's accumulator (ptxas would serialise every wgmma of the kernel).
    FragdQ tdQrdQ;  // (MMA, 1, 1) fp32, written only when a chunk is live
    int64_t g0 = 0;  // global index of the item's first step
    auto k_state = cutlass::PipelineState<1>{};
    PersistentScheduler sched(params.work, params.heads, prob.Hk, cluster);
    for (WorkItem item; sched.next(item); g0 += steps.count) {
      k_pipe.consumer_wait(k_state);
      clear(tdKrdK);
      mma_dk.accumulate_ = GMMA::ScaleOut::One;
      trace.mark(TracePhase::kItem);
      // Step t's back half and step t + 1's front half per turn, from t = −1 (a front half alone: one copy of the
      // front half's code, for the instruction cache). The S batch and the dK/dQ batch are committed on every turn,
      // empty where there is nothing to compute, and waited unconditionally: ptxas does not relate two branches on
      // one condition, and a wait it cannot match to its batch makes it serialise every wgmma of the kernel.
      StepView v{};  // step t (before the first: nothing live)
      v.live = 0;
      StepView vn = first(steps, item, g0, mask);  // step t + 1
      for (int t = -1; t < steps.count; ++t) {
        const int64_t g = g0 + t;
        const bool ahead = t + 1 < steps.count;
        if (!ahead) vn.live = 0;
        FragS tSrS;  // (MMA, 1, 1) fp32: S of step t + 1, in flight during back(t)
        // Step t + 1's tiles: before its S product in recompute; in saved-P only before its front half, so that
        // their loads have back(t) to arrive in (two stages of Q, dP and P fit, not three).
        if (!kSavedP && ahead) stage_pipe.consumer_wait(state_of<StagePipeline>(g + 1));
        trace.mark(TracePhase::kStageWait);
        if constexpr (!kSavedP) issue_s(vn, tSrS);
        trace.mark(TracePhase::kIssueS);
        if (t >= 0) {
          back_ds(v, g);
          trace.mark(TracePhase::kDs);
          cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
          cutlass::arch::NamedBarrier::sync(Cfg::kConsumerThreads, Cfg::kDsBarrier);
          trace.mark(TracePhase::kDsBarrier);
        }
        issue_dk_dq(v, tdQrdQ);
        trace.mark(TracePhase::kIssueDkDq);
        if (kSavedP && ahead) stage_pipe.consumer_wait(state_of<StagePipeline>(g + 1));
        if constexpr (!kSavedP) {
          warpgroup_wait<1>();  // S of step t + 1 (batches complete in order)
          warpgroup_fence_operand(tSrS);
        }
        trace.mark(TracePhase::kWaitS);
        if (ahead) front(item, vn, g + 1, tSrS);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdKrdK);
        warpgroup_fence_operand(tdQrdQ);
        trace.mark(TracePhase::kWaitDkDq);
        if (t >= 0) {
          stage_pipe.consumer_release(state_of<StagePipeline>(g));
          if (v.live == 0) clear(tdQrdQ);  // no product wrote it (no wgmma is in flight here)
          send_dq(item, v, g, tdQrdQ);
        }
        trace.mark(TracePhase::kSendDq);
        v = vn;
        vn = next(vn, mask);
      }
      k_pipe.consumer_release(k_state);
      ++k_state;
      store_dk(item, mask, tdKrdK, tdKcdK);
    }
  }

  // dK = scale · the accumulator, at the keys of this consumer's chunks below Sk.
  template <class Acc, class Coord>
  __device__ void store_dk(const WorkItem& item, const Mask& mask, const Acc& tdKrdK, const Coord& tdKcdK) const {
    const Problem& prob = params.prob;
    const Operand dk_op = prob.dk;
    const bool vector = params.dk_pairs;
    Element* dk = static_cast<Element*>(dk_op.ptr) + dk_op.offset(item.b, item.kv_head, 0, 0);
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); i += 2) {  // an accumulator holds pairs of adjacent columns
      const int n = get<0>(tdKcdK(i)), d = get<1>(tdKcdK(i));
      const int64_t key = mask.key0(w + 2 * (n / kChunk)) + n % kChunk;
      if (key < prob.Sk) store_scaled(dk + key * dk_op.sr + d, tdKrdK(i), tdKrdK(i + 1), prob.scale, vector);
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
