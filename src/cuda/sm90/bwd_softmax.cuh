// The softmax warpgroups of the single-pass backward (the mainloop). Warpgroup w of a CTA takes the steps of
// odd or even global index; per step (64 query rows of one query head against the CTA's live chunks):
//   S = Q Kᵀ (wgmma, N = 32 · live chunks)                          recompute mode
//   this CTA's partial row statistics, pushed to every CTA of the cluster; the cluster's, combined
//   dS = P ∘ (dP − D) rounded to 16 bits: into the stage's dP tile (for the dK warpgroup) and registers
//   dQ partial = dS K (wgmma, dS from registers), pushed in pieces to the pieces' owners
//   the pieces this CTA owns: summed over the cluster in a fixed order, scaled, stored
// While one warpgroup waits on the cluster, the other issues its products.
#pragma once

#include "cuda/sm90/bwd_config.h"
#include "cuda/sm90/cluster_exchange.cuh"
#include "cuda/sm90/mask.h"
#include "cuda/sm90/tile_scheduler.h"

namespace qksoftmax::cuda::sm90 {

// A wgmma accumulator of 16-bit values ((2, 2, N/8), M, 1) viewed as the A operand of a following wgmma
// whose K is this accumulator's N: ((2, 2, 2), M, N/16), k-blocks of 16 columns.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_as_operand_a(const Layout& acc) {
  const auto split = get<0>(logical_divide(get<0, 2>(acc), Tile<_2>{}));  // (2, N/16)
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0>(split)), get<1>(acc), get<1>(split));
}

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
struct BwdSoftmax {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using CK = typename Cfg::CK;
  using HD = typename Cfg::HD;
  using Mask = ChunkMask<Cfg::kChunk, Cfg::kChunks, Cfg::kBlockM>;
  static constexpr bool kSavedP = Cfg::kSavedP;
  static constexpr int kChunk = Cfg::kChunk, kChunks = Cfg::kChunks, kBlockM = Cfg::kBlockM;
  static constexpr int kThreads = Cfg::kWarpgroupThreads;
  static constexpr int kQuad = Cfg::kQuad;
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr int kReduceLanes = 4;  // independent partial results per reduction (a shorter chain)

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;
  int w;  // this softmax warpgroup, 0 or 1

  template <class StagePipeline, class KPipeline>
  __device__ void run(StagePipeline& stage_pipe, KPipeline& k_pipe, const Mask& mask) {
    const Problem& prob = params.prob;
    const int tid = threadIdx.x % kThreads;
    const int lane = tid % 32;
    const int cluster = params.cluster;
    const uint32_t rank = uint32_t(mask.rank);
    const ItemSteps<kBlockM> steps(prob);
    const float scale_log2 = prob.scale * kLog2e;
    const bool lse_given = !kSavedP && prob.lse.present();
    const Operand& lse_op = prob.lse;

    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});     // (BM, D, ST)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutK{});     // (BN, D)
    Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKt{});   // (D, BN)
    Tensor sdP = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutP{});   // (BM, BN, ST)
    Tensor sP = make_tensor(make_smem_ptr(st.p.data()), typename Cfg::SmemLayoutP{});     // (BM, BN, ST), saved-P

    typename Cfg::template MmaS<kChunks> mma_s;  // the full tile's layouts; S is two products of MmaSPair
    auto thr_s = mma_s.get_thread_slice(tid);
    // Register fragments are made per step: an accumulator carried from the previous step would stay live
    // through this one (wgmma names every accumulator register as an input, zero-initialised or not).
    using FragS = decltype(partition_fragment_C(mma_s, Shape<BM, BN>{}));       // (MMA, 1, 1) fp32
    Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<BM, BN>{}));     // (MMA, 1, 1) → (m, n)
    Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));           // (rows, cols) → (m, n)
    constexpr int kRows = size<0>(decltype(tScS_rc.layout()){});
    constexpr int kCols = size<1>(decltype(tScS_rc.layout()){});
    constexpr int kColsPerChunk = kCols / kChunks;

    // dP, P into registers and dS out by ldmatrix / stmatrix. Access a of a thread covers 16 columns of chunk
    // a / kAccessesPerChunk; chunks are kChunkBytes apart, outside the swizzle, so the addresses of the first
    // chunk's accesses (from CuTe's partitions, stage 0) give every access's.
    auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_s);
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_s);
    auto thr_s2r = s2r.get_thread_slice(tid);
    auto thr_r2s = r2s.get_thread_slice(tid);
    Tensor tSsdP = thr_s2r.partition_S(sdP(_, _, 0));  // ((8, A), 1, 1)
    Tensor tSsdS = thr_r2s.partition_D(sdP(_, _, 0));  // ((8, A), 1, 1)
    constexpr int kAccesses = size<0, 1>(decltype(tSsdP.layout()){});
    constexpr int kAccessesPerChunk = kAccesses / kChunks;
    constexpr uint32_t kChunkBytes = kBlockM * kChunk * sizeof(Element);
    constexpr uint32_t kStageBytes = kChunkBytes * kChunks;
    static_assert(size<1>(decltype(tSsdP.layout()){}) == 1 && size<2>(decltype(tSsdP.layout()){}) == 1 &&
                      kAccessesPerChunk * kChunks == kAccesses,
                  "a thread's accesses split evenly into chunks");
    uint32_t dp_addr[kAccessesPerChunk], ds_addr[kAccessesPerChunk];
    CUTE_UNROLL
    for (int a = 0; a < kAccessesPerChunk; ++a) {
      dp_addr[a] = smem_addr(&tSsdP(make_coord(0, a), 0, 0));
      ds_addr[a] = smem_addr(&tSsdS(make_coord(0, a), 0, 0));
    }
    const uint32_t p_delta = smem_addr(st.p.data()) - smem_addr(st.dp.data());  // saved-P: P's tiles beside dP's
    const auto chunk_offset = [](int a) { return uint32_t(a / kAccessesPerChunk) * kChunkBytes; };

    typename Cfg::MmadQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(tid);
    Tensor tdQrK = thr_dq.partition_fragment_B(sKt);                          // (MMA, 1, BN/16) descriptors
    static_assert(size(decltype(partition_fragment_C(mma_dq, Shape<BM, HD>{})){}) == Cfg::kPieces * Cfg::kPieceValues,
                  "dQ pieces cover the accumulator");
    Tensor tdQcdQ = thr_dq.partition_C(make_identity_tensor(Shape<BM, HD>{}));  // (MMA, 1, 1) → (m, d)

    // Shared-memory addresses of the exchange, and this CTA's rows of the statistics slots.
    const uint32_t stats_full = smem_addr(&st.stats_full[w]);
    const uint32_t dq_full = smem_addr(&st.dq_full[w]);
    const uint32_t stats_bytes = uint32_t(cluster) * kBlockM * sizeof(float4);

    int own = 0;  // steps this warpgroup has taken: the parity of the exchange barriers
    int64_t g0 = 0;  // global index of the item's first step
    auto k_state = cutlass::PipelineState<1>{};
    PersistentScheduler sched(params.work, params.heads, prob.Hk, cluster);
    for (WorkItem item; sched.next(item); g0 += steps.count) {
      k_pipe.consumer_wait(k_state);
      for (int t = int((g0 + w) & 1); t < steps.count; t += Cfg::kSoftmaxWarpgroups) {
        const int64_t g = g0 + t;
        const int stage = int(g % Cfg::kStages);
        const int64_t h = steps.head(item, t);
        const int64_t m0 = steps.row0(t);
        const int live = mask.live(m0);
        const bool masked = live < kChunks || mask.cuts(m0, live);
        stage_pipe.consumer_wait(state_of<StagePipeline>(g));
        FragS tSrS;                                                           // (MMA, 1, 1) fp32: S, then e
        Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));     // (rows, cols)
        Tensor tSrdP = make_fragment_like<Element>(tSrS);                     // (MMA, 1, 1)
        Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));  // (rows, cols)
        Tensor tSrP = make_fragment_like<Element>(tSrS);                      // (MMA, 1, 1), saved-P
        Tensor tSrP_rc = make_tensor(tSrP.data(), rowcol(tSrP.layout()));     // (rows, cols)
        Tensor tSrdS = make_fragment_like<Element>(tSrS);                     // (MMA, 1, 1)
        Tensor tSrdS_rc = make_tensor(tSrdS.data(), rowcol(tSrdS.layout()));  // (rows, cols)
        Tensor tSrdP_cp = thr_s2r.retile_D(tSrdP);                            // ((8, A), 1, 1)
        Tensor tSrP_cp = thr_s2r.retile_D(tSrP);                              // ((8, A), 1, 1), saved-P
        Tensor tSrdS_cp = thr_r2s.retile_S(tSrdS);                            // ((8, A), 1, 1)

        // S (recompute), then dP (and P) of the live chunks.
        if constexpr (!kSavedP) {
          // Two products of 64 keys (a pair of chunks) each, the second only when a chunk of it is live.
          typename Cfg::MmaSPair mma;
          auto thr = mma.get_thread_slice(tid);
          Tensor tSrQ = thr.partition_fragment_A(sQ(_, _, stage));  // (MMA, 1, D/16) descriptors
          Tensor acc0 = make_tensor(tSrS.data(), partition_fragment_C(mma, Shape<BM, Int<2 * kChunk>>{}).layout());
          Tensor acc1 = make_tensor(tSrS.data() + size(acc0), partition_fragment_C(mma, Shape<BM, Int<2 * kChunk>>{}).layout());
          constexpr int kBlocks = size<2>(decltype(tSrQ.layout()){});
          if (live > 0) {
            Tensor tSrK = thr.partition_fragment_B(local_tile(sK, Shape<Int<2 * kChunk>, HD>{}, make_coord(0, 0)));
            warpgroup_mma<kBlocks, true>(mma, tSrQ, tSrK, acc0);
          }
          if (live > 2) {
            Tensor tSrK = thr.partition_fragment_B(local_tile(sK, Shape<Int<2 * kChunk>, HD>{}, make_coord(1, 0)));
            warpgroup_mma<kBlocks, true>(mma, tSrQ, tSrK, acc1);
          }
        }
        CUTE_UNROLL
        for (int a = 0; a < kAccesses; ++a) {
          if (a / kAccessesPerChunk >= live) continue;
          const uint32_t addr = dp_addr[a % kAccessesPerChunk] + chunk_offset(a) + uint32_t(stage) * kStageBytes;
          load_matrix(addr, tSrdP_cp(make_coord(_, a), 0, 0));
          if constexpr (kSavedP) load_matrix(addr + p_delta, tSrP_cp(make_coord(_, a), 0, 0));
        }

        // This CTA's partial statistics per row (e, the unnormalised probabilities, kept in tSrS).
        float4 part[kRows];
        float lse2[kRows];
        CUTE_UNROLL
        for (int ri = 0; ri < kRows; ++ri) {
          const int64_t i = m0 + get<0>(tScS_rc(ri, 0));
          lse2[ri] = lse_given && i < prob.Sq
                         ? static_cast<const float*>(lse_op.ptr)[lse_op.offset(item.b, h, i)] * kLog2e
                         : 0.0f;
        }
        // Values of a dead chunk (u ≥ live) are never read: its registers hold an earlier step's.
        with_mask(masked, [&](auto is_masked) {
          CUTE_UNROLL
          for (int ri = 0; ri < kRows; ++ri) {
            const int64_t i = m0 + get<0>(tScS_rc(ri, 0));
            Lanes<kReduceLanes> m(-INFINITY), sum(0.0f), dot(0.0f);
            const int end = mask.row_end(i);
            // f(ci, keep) over the live chunks' columns; only a chunk that some row of the block does not see
            // whole (the diagonal's, or past Sk) pays for per-element compares.
            const auto for_each_live = [&](auto&& f) {
              CUTE_UNROLL
              for (int u = 0; u < kChunks; ++u) {
                if (is_masked && u >= live) continue;
                const int key_base = mask.key0(u) - u * kChunk;  // key of tile column n: key_base + n
                if (is_masked && mask.partial(m0, u)) {
                  CUTE_UNROLL
                  for (int ci = u * kColsPerChunk; ci < (u + 1) * kColsPerChunk; ++ci) {
                    f(ci, key_base + get<1>(tScS_rc(ri, ci)) < end);
                  }
                } else {
                  CUTE_UNROLL
                  for (int ci = u * kColsPerChunk; ci < (u + 1) * kColsPerChunk; ++ci) f(ci, true);
                }
              }
            };
            float mx = 0.0f;
            if constexpr (kSavedP) {
              for_each_live([&](int ci, bool keep) { tSrS_rc(ri, ci) = keep ? float(tSrP_rc(ri, ci)) : 0.0f; });
            } else if (lse_given) {
              for_each_live([&](int ci, bool keep) {
                tSrS_rc(ri, ci) = keep ? exp2_fast(tSrS_rc(ri, ci) * scale_log2 - lse2[ri]) : 0.0f;
              });
            } else {
              for_each_live([&](int ci, bool keep) { m.max(ci, keep ? tSrS_rc(ri, ci) * scale_log2 : -INFINITY); });
              mx = quad_max<kQuad>(m.max());
              const float base = mx == -INFINITY ? 0.0f : mx;
              for_each_live([&](int ci, bool keep) {
                tSrS_rc(ri, ci) = keep ? exp2_fast(tSrS_rc(ri, ci) * scale_log2 - base) : 0.0f;
              });
            }
            for_each_live([&](int ci, bool keep) {
              sum.add(ci, tSrS_rc(ri, ci));
              dot.add(ci, keep ? tSrS_rc(ri, ci) * float(tSrdP_rc(ri, ci)) : 0.0f);
            });
            const float d = quad_sum<kQuad>(dot.sum());
            part[ri] = kSavedP || lse_given ? make_float4(0.0f, 0.0f, d, 0.0f)
                                            : make_float4(mx, quad_sum<kQuad>(sum.sum()), d, 0.0f);
          }
        });

        // Exchange: push this CTA's partials to every CTA (lane q of a quad to CTAs q, q + 4), then combine the
        // cluster's. One CTA keeps its own in registers (distributed shared memory needs a cluster of two).
        float factor[kRows], delta[kRows];
        const auto combine = [&](int ri, int n, auto&& partial) {  // partial(c): CTA c's float4 for row ri
          if (kSavedP || lse_given) {
            float d = 0.0f;
            for (int c = 0; c < n; ++c) d += partial(c).z;
            factor[ri] = 1.0f;
            delta[ri] = d;
            return;
          }
          float mx = -INFINITY;
          for (int c = 0; c < n; ++c) mx = fmaxf(mx, partial(c).x);
          const float base = mx == -INFINITY ? 0.0f : mx;
          float sum = 0.0f, dot = 0.0f;
          for (int c = 0; c < n; ++c) {
            const float4 x = partial(c);
            const float e = exp2_fast(x.x - base);  // an empty partial (−inf) weighs 0
            sum += x.y * e;
            dot += x.z * e;
          }
          const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
          factor[ri] = part[ri].x == -INFINITY ? 0.0f : exp2_fast(part[ri].x - base) * inv;
          delta[ri] = dot * inv;
        };
        if (cluster > 1) {
          if (own > 0) Cfg::Barrier::wait(&st.stats_empty[w], uint32_t((own - 1) & 1));
          CUTE_UNROLL
          for (int ri = 0; ri < kRows; ++ri) {
            const int r = get<0>(tScS_rc(ri, 0));
            const uint32_t slot = smem_addr(&st.stats[w][rank][r]);
            CUTE_UNROLL
            for (int j = 0; j < Cfg::kMaxCluster / kQuad; ++j) {
              const int c = lane % kQuad + kQuad * j;
              if (c < cluster) push_f4(cluster_addr(slot, uint32_t(c)), part[ri], cluster_addr(stats_full, uint32_t(c)));
            }
          }
          if (tid == 0) Cfg::TxBarrier::arrive_and_expect_tx(&st.stats_full[w], stats_bytes);
          Cfg::TxBarrier::wait(&st.stats_full[w], uint32_t(own & 1));
          CUTE_UNROLL
          for (int ri = 0; ri < kRows; ++ri) {
            const uint32_t slots = smem_addr(&st.stats[w][0][get<0>(tScS_rc(ri, 0))]);
            constexpr uint32_t kSenderBytes = kBlockM * sizeof(float4);
            combine(ri, cluster, [&](int c) { return load_shared_f4(slots + c * kSenderBytes); });
          }
          // The slots are read (their values used above): each warp frees them in every CTA, lane c in CTA c.
          __syncwarp();
          Cfg::Barrier::arrive(&st.stats_empty[w], uint32_t(lane), lane < cluster);
        } else {
          CUTE_UNROLL
          for (int ri = 0; ri < kRows; ++ri) combine(ri, 1, [&](int) { return part[ri]; });
        }

        // dS into registers and over the stage's dP tile (the dK warpgroup's A operand); a dead chunk next to
        // a live one is written as zeros (the dK product covers chunks in pairs).
        with_mask(masked, [&](auto is_masked) {
          CUTE_UNROLL
          for (int ri = 0; ri < kRows; ++ri) {
            const int end = mask.row_end(m0 + get<0>(tScS_rc(ri, 0)));
            CUTE_UNROLL
            for (int u = 0; u < kChunks; ++u) {
              if (is_masked && u >= live) {
                CUTE_UNROLL
                for (int ci = u * kColsPerChunk; ci < (u + 1) * kColsPerChunk; ++ci) tSrdS_rc(ri, ci) = Element(0.0f);
                continue;
              }
              const int key_base = mask.key0(u) - u * kChunk;  // key of tile column n: key_base + n
              const bool partial = is_masked && mask.partial(m0, u);
              CUTE_UNROLL
              for (int ci = u * kColsPerChunk; ci < (u + 1) * kColsPerChunk; ++ci) {
                const bool keep = !partial || key_base + get<1>(tScS_rc(ri, ci)) < end;
                const float p = tSrS_rc(ri, ci) * factor[ri];
                tSrdS_rc(ri, ci) = Element(keep ? p * (float(tSrdP_rc(ri, ci)) - delta[ri]) : 0.0f);
              }
            }
          }
        });
        CUTE_UNROLL
        for (int a = 0; a < kAccesses; ++a) {
          if (a / kAccessesPerChunk >= (live + 1) / 2 * 2) continue;
          store_matrix(ds_addr[a % kAccessesPerChunk] + chunk_offset(a) + uint32_t(stage) * kStageBytes,
                       tSrdS_cp(make_coord(_, a), 0, 0));
        }
        cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
        Cfg::Barrier::arrive(&st.ds_full[stage]);

        // dQ partial = dS K over the live chunks.
        Tensor tdQrdS = make_tensor(tSrdS.data(), acc_as_operand_a(tSrdS.layout()));  // (MMA, 1, BN/16)
        Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<BM, HD>{});                  // (MMA, 1, 1) fp32
        const auto dq_product = [&](auto n_blocks) {
          warpgroup_fence_operand(tdQrdS);
          warpgroup_mma<decltype(n_blocks)::value, true>(mma_dq, tdQrdS, tdQrK, tdQrdQ);
        };
        constexpr int kBlocksPerChunk = kChunk / 16;
        switch (live) {
          case 1: dq_product(Int<kBlocksPerChunk * 1>{}); break;
          case 2: dq_product(Int<kBlocksPerChunk * 2>{}); break;
          case 3: dq_product(Int<kBlocksPerChunk * 3>{}); break;
          case 4: dq_product(Int<kBlocksPerChunk * 4>{}); break;
          default: clear(tdQrdQ); break;
        }

        // The dQ pieces go to their owners (piece p to CTA p mod C, this one too), whose dK warpgroup sums them a
        // step later; a CTA alone stores its dQ itself (distributed shared memory needs a cluster of two).
        if (cluster > 1) {
          // Rank and size read again here: the slot addresses derived from them are recomputed, not kept.
          const int cta = int(cute::block_rank_in_cluster());
          const int ctas = cluster_ctas();
          const int log2_ctas = __ffs(ctas) - 1;
          if (own > 0) Cfg::Barrier::wait(&st.dq_empty[w], uint32_t((own - 1) & 1));
          constexpr uint32_t kVectorBytes = kThreads * sizeof(float4);  // between a slot's vectors
          CUTE_UNROLL
          for (int p = 0; p < Cfg::kPieces; ++p) {
            const uint32_t owner = uint32_t(p & (ctas - 1));
            const int slot = (cta << (Cfg::kLog2Pieces - log2_ctas)) + (p >> log2_ctas);
            const uint32_t remote = cluster_addr(smem_addr(&st.dq[w][slot][0][tid]), owner);
            const uint32_t remote_full = cluster_addr(dq_full, owner);
            CUTE_UNROLL
            for (int v = 0; v < Cfg::kPieceVectors; ++v) {
              const int e = p * Cfg::kPieceValues + 4 * v;
              push_f4(remote + v * kVectorBytes, make_float4(tdQrdQ(e), tdQrdQ(e + 1), tdQrdQ(e + 2), tdQrdQ(e + 3)),
                      remote_full);
            }
          }
        } else {
          const DqRows<Cfg> rows(prob, item.b, h, m0);
          CUTE_UNROLL
          for (int e = 0; e < size(tdQrdQ); e += 4) {
            rows.store(tdQcdQ, e, make_float4(tdQrdQ(e), tdQrdQ(e + 1), tdQrdQ(e + 2), tdQrdQ(e + 3)));
          }
        }
        ++own;
      }
      k_pipe.consumer_release(k_state);
      ++k_state;
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
