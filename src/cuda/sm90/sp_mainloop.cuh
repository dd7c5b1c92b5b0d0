// The consumer warpgroups of the single pass (sp_config.h): the key-block step (kb_mainloop.cuh) with each row's
// statistics computed by the consumers themselves, a step ahead. Consumer w owns keys [n0 + 64w, n0 + 64w + 64)
// of the tile's block. With S's rows on the products' M (SpStep::kRows, dispatched) the element-wise work is
// sp_rows.cuh's, on the kEarlyS schedule below; the Sᵀ forms' is here. A warp of an Sᵀ form holds 16 of the
// consumer's keys × the step's 64 rows of Sᵀ, a row's 16 keys in the 8 lanes of equal lane mod 4 (2 keys each).
// Per 64-row step t (g counting the CTA's steps over its tiles):
//   the statistics of step t, whose partials every consumer warp wrote in step t − 1, combined: each lane takes
//   two rows, reads the 8 warps' (m, l, u) of them, and forms LSE·log2e = M + log2 L, D = U / L
//   (L = Σ l_c 2^(m_c − M), U the same of u) and its warp's factor f = 2^(m_own − LSE·log2e) (times |scale| in
//   bf16, as the key-block pass's rows fold it), then f and f · D of every row for its lanes through its warp's
//   row of shared memory;
//   element-wise: dSᵀ = P_c ∘ (dPᵀ · f − f · D), where P_c = 2^(x − m_own) (x = S·scale·log2e) was kept from step
//   t − 1 in fp16 and dPᵀ in registers; masked positions have P_c = 0 and take dS = 0 whatever dP holds;
//   dS into the step's dS buffer, Sᵀ(t + 1) and dK += dSᵀ Q issued, on its turn the dQ product (both
//   consumers' dS) as in the key-block step; all three awaited, and the dQ partial rounded into the step's dS
//   buffer (free: its dQ product is done) and stored by TMA (at most 128 keys: each dQ row block has exactly
//   one step and is stored, not added), which frees its registers for what follows;
//   then the statistics a step ahead: x masked to −inf, each
//   row's maximum over the warp's keys (3 shuffles a row), P_c(t + 1) in fp16, dPᵀ(t + 1) read into
//   registers, l and u reduced by a butterfly that halves the values each round (8 + 4 + 2 shuffles leave a
//   lane two rows), the warp's (m, l, u) of its two rows per lane written as its partials, and an arrival on
//   the step's statistics barrier; the stage released.
// The two consumers meet once a step at the statistics (each needs the other's partials) and at the dS barrier
// (the consumer of the dQ turn needs the other's dS), as in the key-block step.
#pragma once

#include <cuda_fp16.h>
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/cluster_exchange.cuh"

#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/sp_config.h"
#include "cuda/sm90/sp_rows.cuh"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

// The last rounds of a halving reduction over the 8 lanes of equal lane mod 4 (the keys of a warp; a lane holds 16
// rows ci = 0 … 15 of Sᵀ): given v[k] (k < 8) = the reduction by `op` over lane and lane ^ 16 of row
// ci = k + 8 (lane / 16 mod 2), it leaves v[k] (k = 0, 1) = the warp's reduction of row ci = 2 (lane / 4) + k,
// sending half of the values each round (4 + 2 shuffles). Selects with constant indices keep them in registers.
template <class Op>
__device__ inline void halve_rows_from8(float (&v)[8], int lane, Op op) {
  const bool b3 = lane & 8, b2 = lane & 4;
  CUTE_UNROLL
  for (int k = 0; k < 4; ++k) {
    const float keep = b3 ? v[k + 4] : v[k], send = b3 ? v[k] : v[k + 4];
    v[k] = op(keep, __shfl_xor_sync(0xffffffffu, send, 8));
  }
  CUTE_UNROLL
  for (int k = 0; k < 2; ++k) {
    const float keep = b2 ? v[k + 2] : v[k], send = b2 ? v[k] : v[k + 2];
    v[k] = op(keep, __shfl_xor_sync(0xffffffffu, send, 4));
  }
}

// The whole halving reduction of 16 rows (its first round, then halve_rows_from8): v[0], v[1] the warp's
// reduction of rows ci = 2 (lane / 4) + {0, 1}.
template <class Op>
__device__ inline void halve_rows(float (&v)[16], int lane, Op op) {
  const bool b4 = lane & 16;
  float half[8];
  CUTE_UNROLL
  for (int k = 0; k < 8; ++k) {
    const float keep = b4 ? v[k + 8] : v[k], send = b4 ? v[k] : v[k + 8];
    half[k] = op(keep, __shfl_xor_sync(0xffffffffu, send, 16));
  }
  halve_rows_from8(half, lane, op);
  v[0] = half[0];
  v[1] = half[1];
}

// Its inverse for a value that every lane of a row holds alike (a maximum): v[0], v[1] as halve_rows leaves them
// spread back so that v[ci] holds row ci's value on every lane (2 + 4 + 8 shuffles).
__device__ inline void spread_rows(float (&v)[16], int lane) {
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
  CUTE_UNROLL
  for (int k = 1; k >= 0; --k) {
    const float own = v[k], other = __shfl_xor_sync(0xffffffffu, own, 4);
    v[k] = b2 ? other : own;
    v[k + 2] = b2 ? own : other;
  }
  CUTE_UNROLL
  for (int k = 3; k >= 0; --k) {
    const float own = v[k], other = __shfl_xor_sync(0xffffffffu, own, 8);
    v[k] = b3 ? other : own;
    v[k + 4] = b3 ? own : other;
  }
  CUTE_UNROLL
  for (int k = 7; k >= 0; --k) {
    const float own = v[k], other = __shfl_xor_sync(0xffffffffu, own, 16);
    v[k] = b4 ? other : own;
    v[k + 8] = b4 ? own : other;
  }
}

template <class Cfg>
struct SpMainloop {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using BN = typename Cfg::BN;
  using HD = typename Cfg::HD;
  using HF = typename Cfg::HF;
  static constexpr int kBlockM = Cfg::kBlockM, kHalf = Cfg::kHalf, kBuffers = Cfg::kBuffers;
  static constexpr int kWarps = Cfg::kConsumerWarps;

  const typename Cfg::Params& params;
  typename Cfg::Storage& st;
  int w;  // this consumer, 0 or 1

  template <class StagePipeline>
  __device__ void run(StagePipeline& stage_pipe) {
    constexpr int kDsBarrierThreads = Cfg::kConsumerThreads;
    const Problem& prob = params.prob;
    const int tid = threadIdx.x % Cfg::kWarpgroupThreads;
    const int lane = tid % 32;
    const int wi = w * (Cfg::kWarpgroupThreads / 32) + tid / 32;  // this warp among the consumers' 8
    typename Cfg::Trace trace(w == 0 ? KbTraceRole::kConsumer0 : KbTraceRole::kConsumer1, tid < 32);
    const KeyRange keys = prob.keys();
    const float scale_log2 = prob.scale * kLog2e;
    // What f carries beyond 2^(m_own − LSE·log2e): |scale| where dS carries the scale (KbRows' fold).
    const float fold = kScaleInDs<Element> ? fabsf(prob.scale) : 1.0f;

    Tensor sQ = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQ{});       // (BM, D, ST)
    Tensor sQt = make_tensor(make_smem_ptr(st.q.data()), typename Cfg::SmemLayoutQt{});     // (D, BM, ST)
    Tensor sK = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKB{});      // (BN, D, KB)
    Tensor sKt = make_tensor(make_smem_ptr(st.k.data()), typename Cfg::SmemLayoutKtB{});    // (D, BN, KB)
    Tensor sdPt = make_tensor(make_smem_ptr(st.dp.data()), typename Cfg::SmemLayoutPt{});   // (BN, BM, ST)
    Tensor sdS = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdS2{});   // (BM, BN, DB)
    Tensor sdSt = make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdSt2{});  // (BN, BM, DB)

    // Sᵀ of this consumer's keys: (HF, BM), keys on M.
    typename Cfg::MmaSt mma_s;
    auto thr_s = mma_s.get_thread_slice(tid);
    using FragS = decltype(partition_fragment_C(mma_s, Shape<HF, BM>{}));  // (MMA, 1, 1) fp32
    using FragS16 = decltype(make_fragment_like<Element>(FragS{}));        // (MMA, 1, 1)
    const auto sKw_of = [&](int b) { return local_tile(sK(_, _, b), Shape<HF, HD>{}, make_coord(w, 0)); };
    Tensor tSrK = thr_s.partition_fragment_A(sKw_of(0));                     // (MMA, 1, D/16) registers
    const Tensor tSrQ = thr_s.partition_fragment_B(sQ);                    // (MMA, 1, D/16, ST)
    typename Cfg::CopyKA s2r_k;
    auto thr_s2r_k = s2r_k.get_thread_slice(tid);
    Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<HF, BM>{}));  // (MMA, 1, 1) → (key, row)
    Tensor tScS_rc = make_tensor(tScS.data(), rowcol(tScS.layout()));        // (keys, rows) → (key, row)
    constexpr int kKeys = size<0>(decltype(tScS_rc.layout()){});
    constexpr int kRows = size<1>(decltype(tScS_rc.layout()){});
    static_assert(kKeys == 2 && kRows == 16, "a lane holds 2 keys × 16 rows of Sᵀ (halve_rows)");
    // The two rows this lane combines (halve_rows: rows ci = 2 (lane / 4) + {0, 1}, adjacent).
    const int own_row = get<1>(tScS_rc(0, 2 * (lane / 4)));

    typename Cfg::CopyS2R s2r;
    typename Cfg::CopyR2S r2s;
    auto thr_s2r = s2r.get_thread_slice(tid);
    auto thr_r2s = r2s.get_thread_slice(tid);

    typename Cfg::MmadK mma_dk;
    auto thr_dk = mma_dk.get_thread_slice(tid);
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<HF, HD>{});  // (MMA, 1, 1) fp32, the block's
    const Tensor tdKrQ = thr_dk.partition_fragment_B(sQt);           // (MMA, 1, BM/16, ST) descriptors
    // dSᵀ and Q as dK's operands from shared memory (kEarlyS).
    typename Cfg::MmadKShared mma_dk_shared;
    auto thr_dk_shared = mma_dk_shared.get_thread_slice(tid);
    const Tensor tdKsdS = thr_dk_shared.partition_fragment_A(Cfg::consumer_keys(sdSt, w));  // (MMA, 1, BM/16, DB)
    const Tensor tdKsQ = thr_dk_shared.partition_fragment_B(sQt);                           // (MMA, 1, BM/16, ST)

    typename Cfg::MmadQ mma_dq;
    auto thr_dq = mma_dq.get_thread_slice(tid);
    const Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);   // (MMA, 1, BN/16, DB) descriptors
    const Tensor tdQrK = thr_dq.partition_fragment_B(sKt);    // (MMA, 1, BN/16, KB) descriptors

    // K_w as Sᵀ's A operand from shared memory (kKResident false): (MMA, 1, D/16, KB) descriptors.
    typename Cfg::MmaStShared mma_s_shared;
    const Tensor tSsK = mma_s_shared.get_thread_slice(tid).partition_fragment_A(
        local_tile(sK, Shape<HF, HD, typename Cfg::KB>{}, make_coord(w, 0, 0)));
    // Sᵀ of the step in stage `stage` into acc (K_w of K buffer kbuf where it is not resident), one wgmma batch.
    const auto issue_s = [&](int stage, int kbuf, FragS& acc) {
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      if constexpr (Cfg::kKResident) {
        mma_s.accumulate_ = GMMA::ScaleOut::Zero;
      } else {
        mma_s_shared.accumulate_ = GMMA::ScaleOut::Zero;
      }
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
        if constexpr (Cfg::kKResident) {
          gemm(mma_s, tSrK(_, _, kb), tSrQ(_, _, kb, stage), acc);
          mma_s.accumulate_ = GMMA::ScaleOut::One;
        } else {
          gemm(mma_s_shared, tSsK(_, _, kb, kbuf), tSrQ(_, _, kb, stage), acc);
          mma_s_shared.accumulate_ = GMMA::ScaleOut::One;
        }
      }
      warpgroup_commit_batch();
    };

    // What crosses from a step to the next: P_c and dPᵀ. The accumulators of Sᵀ and of the dQ partial live within
    // a step (every product is awaited in its step, so no register that element-wise code writes is one of an
    // accumulator in flight), and are dead where the other's registers are needed.
    using FragdQ = decltype(partition_fragment_C(mma_dq, Shape<BM, HD>{}));  // (MMA, 1, 1) fp32
    // P_c of the step, against this warp's row maxima, a pair of rows per register: tSrPc[ki + 2j] holds key ki's
    // rows ci = 2j and 2j + 1 (rowcol's order: ci = e + 2j, e the accumulator's adjacent pair).
    __half2 tSrPc[kKeys * kRows / 2];
    FragS16 tSrdP;  // dPᵀ of the step
    mma_dk.accumulate_ = GMMA::ScaleOut::One;
    mma_dk_shared.accumulate_ = GMMA::ScaleOut::One;

    // The statistics a step ahead: from Sᵀ in tSrS and dP of stage `stage`, step g's P_c into tSrPc, dPᵀ into
    // tSrdP, and this warp's partials of its rows (stats_arrive announces them).
    const auto stats_ahead = [&](FragS& tSrS, int stage, int64_t m0, int64_t n0w, int g) {
      Tensor tSrS_rc = make_tensor(tSrS.data(), rowcol(tSrS.layout()));     // (keys, rows)
      Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));  // (keys, rows)
      copy(s2r, thr_s2r.partition_S(Cfg::consumer_keys(sdPt(_, _, stage), w)), thr_s2r.retile_D(tSrdP));
      // x = S·scale·log2e where the row sees the key, −inf elsewhere (KeyRange::cut's kinds, as the key-block
      // step's element-wise work).
      const auto scaled = [&](auto kind, int diagonal) {
        constexpr BlockCut kCut = decltype(kind)::value;
        CUTE_UNROLL
        for (int ci = 0; ci < kRows; ++ci) {
          const int end = kCut == BlockCut::kRows ? keys.cols_in(m0 + get<1>(tScS_rc(0, ci)), n0w, kHalf) : kHalf;
          CUTE_UNROLL
          for (int ki = 0; ki < kKeys; ++ki) {
            const int key = get<0>(tScS_rc(ki, ci));
            const bool keep = kCut == BlockCut::kNone       ? true
                              : kCut == BlockCut::kDiagonal ? key - get<1>(tScS_rc(ki, ci)) <= diagonal
                                                            : key < end;
            tSrS_rc(ki, ci) = keep ? tSrS_rc(ki, ci) * scale_log2 : -INFINITY;
          }
        }
      };
      const bool cut = keys.cuts(m0, kBlockM, n0w, kHalf);
      if (!cut) {
        scaled(std::integral_constant<BlockCut, BlockCut::kNone>{}, 0);
      } else if (keys.sees_none(m0, kBlockM, n0w)) {
        fill(tSrS, -INFINITY);
      } else if (keys.diagonal_only(m0, kBlockM, n0w, kHalf)) {
        scaled(std::integral_constant<BlockCut, BlockCut::kDiagonal>{}, int(m0 - n0w));
      } else {
        scaled(std::integral_constant<BlockCut, BlockCut::kRows>{}, 0);
      }
      // Each row's maximum over the warp's keys: halved (8 + 4 + 2 shuffles, this lane's two rows kept for its
      // partials) and spread back (2 + 4 + 8).
      float mx[kRows];
      CUTE_UNROLL
      for (int ci = 0; ci < kRows; ++ci) mx[ci] = fmaxf(tSrS_rc(0, ci), tSrS_rc(1, ci));
      halve_rows(mx, lane, [](float a, float b) { return fmaxf(a, b); });
      const float m_own[2] = {mx[0], mx[1]};
      spread_rows(mx, lane);
      const auto row_max = [&](int ci) {
        return mx[ci] == -INFINITY ? 0.0f : mx[ci];  // a row that sees none of the warp's keys: P_c = 0
      };
      // Rows ci, ci + 1, ci + 8, ci + 9 (ci even) at a time: a register of P_c holds rows ci and ci + 1 of a key
      // (written at once), and the first halving round pairs row ci with ci + 8, so that no more than 8 of l and
      // of u are live (halve_rows_from8 finishes them).
      float l[kRows / 2], u[kRows / 2];
      const bool b4 = lane & 16;
      const auto partial = [&](auto is_cut) {
        CUTE_UNROLL
        for (int k = 0; k < kRows / 2; k += 2) {
          float lk[4], uk[4];  // rows k, k + 1, k + 8, k + 9
          CUTE_UNROLL
          for (int h = 0; h < 4; ++h) {
            const int ci = k + (h & 1) + (h >> 1) * (kRows / 2);
            const float ref = row_max(ci);
            lk[h] = 0.0f;
            uk[h] = 0.0f;
            CUTE_UNROLL
            for (int ki = 0; ki < kKeys; ++ki) {
              const float p = exp2_fast(tSrS_rc(ki, ci) - ref);
              const float pdp = p * float(tSrdP_rc(ki, ci));
              tSrS_rc(ki, ci) = p;
              lk[h] += p;
              uk[h] += decltype(is_cut)::value ? (p > 0.0f ? pdp : 0.0f) : pdp;
            }
          }
          CUTE_UNROLL
          for (int h = 0; h < 4; h += 2) {  // P_c of the four rows, a pair of rows per register
            const int ci = k + (h >> 1) * (kRows / 2);
            CUTE_UNROLL
            for (int ki = 0; ki < kKeys; ++ki) {
              tSrPc[ki + ci] = __floats2half2_rn(tSrS_rc(ki, ci), tSrS_rc(ki, ci + 1));
            }
          }
          CUTE_UNROLL
          for (int e = 0; e < 2; ++e) {
            l[k + e] = (b4 ? lk[2 + e] : lk[e]) + __shfl_xor_sync(0xffffffffu, b4 ? lk[e] : lk[2 + e], 16);
            u[k + e] = (b4 ? uk[2 + e] : uk[e]) + __shfl_xor_sync(0xffffffffu, b4 ? uk[e] : uk[2 + e], 16);
          }
        }
      };
      // u = Σ P_c · dP over the keys the row sees: where the step is cut, a masked position (P_c = 0) adds 0
      // whatever dP holds there (NaN included).
      if (cut) {
        partial(std::true_type{});
      } else {
        partial(std::false_type{});
      }
      const auto plus = [](float a, float b) { return a + b; };
      halve_rows_from8(l, lane, plus);
      halve_rows_from8(u, lane, plus);
      const int b = g % Cfg::kStatBuffers;
      store_shared_f2(smem_addr(&st.partials[b][Cfg::kStatM][wi][own_row]), m_own[0], m_own[1]);
      store_shared_f2(smem_addr(&st.partials[b][Cfg::kStatL][wi][own_row]), l[0], l[1]);
      store_shared_f2(smem_addr(&st.partials[b][Cfg::kStatU][wi][own_row]), u[0], u[1]);
    };
    // This thread's partials of step g written: an arrival on its statistics barrier (a release of those stores
    // at CTA scope).
    const auto stats_arrive = [&](int g) { cutlass::arch::ClusterBarrier::arrive(&st.stats_full[g % Cfg::kStatBuffers]); };

    // Step g's partials, every consumer thread's, awaited.
    const auto stats_wait = [&](int g) {
      cutlass::arch::ClusterBarrier::wait(&st.stats_full[g % Cfg::kStatBuffers], (g / Cfg::kStatBuffers) & 1);
    };
    // Step g's statistics combined (its partials awaited) into this warp's (f, f · D) of each row.
    const auto combine = [&](int g) {
      const int b = g % Cfg::kStatBuffers;
      // The maxima first, then l and u a warp at a time: no more than the 8 warps' maxima stay live beside the
      // step's registers.
      float2 m[kWarps];
      CUTE_UNROLL
      for (int j = 0; j < kWarps; ++j) m[j] = load_shared_f2(smem_addr(&st.partials[b][Cfg::kStatM][j][own_row]));
      float2 ref = make_float2(-INFINITY, -INFINITY);
      CUTE_UNROLL
      for (int j = 0; j < kWarps; ++j) ref = make_float2(fmaxf(ref.x, m[j].x), fmaxf(ref.y, m[j].y));
      ref = make_float2(ref.x == -INFINITY ? 0.0f : ref.x, ref.y == -INFINITY ? 0.0f : ref.y);  // no key: L = 0
      float2 sum_l = make_float2(0.0f, 0.0f), sum_u = sum_l, own = sum_l;
      CUTE_UNROLL
      for (int j = 0; j < kWarps; ++j) {
        const float2 l = load_shared_f2(smem_addr(&st.partials[b][Cfg::kStatL][j][own_row]));
        const float2 u = load_shared_f2(smem_addr(&st.partials[b][Cfg::kStatU][j][own_row]));
        const float2 c = make_float2(exp2_fast(m[j].x - ref.x), exp2_fast(m[j].y - ref.y));
        sum_l = make_float2(fmaf(l.x, c.x, sum_l.x), fmaf(l.y, c.y, sum_l.y));
        sum_u = make_float2(fmaf(u.x, c.x, sum_u.x), fmaf(u.y, c.y, sum_u.y));
        own = j == wi ? c : own;
      }
      const float inv0 = sum_l.x > 0.0f ? 1.0f / sum_l.x : 0.0f, inv1 = sum_l.y > 0.0f ? 1.0f / sum_l.y : 0.0f;
      const float f0 = own.x * inv0 * fold, f1 = own.y * inv1 * fold;
      const float fh[4] = {f0, f0 * (sum_u.x * inv0), f1, f1 * (sum_u.y * inv1)};  // (f, f · D) of the two rows
      const uint32_t at = smem_addr(&st.factors[wi][own_row]);
      __syncwarp();  // every lane has read the previous step's factors
      store_shared_f2(at, fh[0], fh[1]);
      store_shared_f2(at + uint32_t(sizeof(float2)), fh[2], fh[3]);
      __syncwarp();
    };

    // dSᵀ of step g, its statistics combined: P_c · (dP · f − f · D), 0 where P_c is (masked).
    const auto dst_of = [&](FragS16& tSrdS, int64_t m0, int64_t n0w) {
      if (keys.cuts(m0, kBlockM, n0w, kHalf) && keys.sees_none(m0, kBlockM, n0w)) {
        fill(tSrdS, Element(0.0f));
        return;
      }
      Tensor tSrdP_rc = make_tensor(tSrdP.data(), rowcol(tSrdP.layout()));  // (keys, rows)
      Tensor tSrdS_rc = make_tensor(tSrdS.data(), rowcol(tSrdS.layout()));  // (keys, rows)
      const uint32_t factors = smem_addr(&st.factors[wi][0]);
      const auto elementwise = [&](auto is_cut) {
        CUTE_UNROLL
        for (int ci = 0; ci < kRows; ci += 2) {
          const float4 fh = load_shared_f4(factors + uint32_t(get<1>(tScS_rc(0, ci))) * uint32_t(sizeof(float2)));
          CUTE_UNROLL
          for (int ki = 0; ki < kKeys; ++ki) {
            const float2 p = __half22float2(tSrPc[ki + ci]);  // rows ci, ci + 1
            const float ds0 = p.x * fmaf(float(tSrdP_rc(ki, ci)), fh.x, -fh.y);
            const float ds1 = p.y * fmaf(float(tSrdP_rc(ki, ci + 1)), fh.z, -fh.w);
            tSrdS_rc(ki, ci) = Element(decltype(is_cut)::value && p.x == 0.0f ? 0.0f : ds0);
            tSrdS_rc(ki, ci + 1) = Element(decltype(is_cut)::value && p.y == 0.0f ? 0.0f : ds1);
          }
        }
      };
      if (keys.cuts(m0, kBlockM, n0w, kHalf)) {
        elementwise(std::true_type{});
      } else {
        elementwise(std::false_type{});
      }
    };

    // The dQ partial of step (head, m0), complete, finished (KbFinish), rounded into the step's dS buffer `buf`
    // (its dQ product, the buffer's only reader, is complete) by stmatrix and stored into dQ by one TMA from
    // this consumer's first thread; rows past Sq are clipped by TMA. That thread waits for the store's read of
    // the buffer before it arrives at the next step's dS barrier: the buffer's next writers (both consumers, two
    // steps on) pass that barrier first.
    // The step's element-wise work in S's layout (kRowsOnM, sp_rows.cuh) or in Sᵀ's (the lambdas above).
    constexpr bool kRowsOnM = Cfg::kRowsOnM;
    SpRowStats<Cfg> rows{prob, st, w, tid, keys, scale_log2, fold};
    using FragSStep = std::conditional_t<kRowsOnM, typename SpRowStats<Cfg>::FragS, FragS>;        // fp32
    using FragdSStep = std::conditional_t<kRowsOnM, typename SpRowStats<Cfg>::FragS16, FragS16>;  // Element
    const auto issue_step_s = [&](int stage, int kbuf, FragSStep& acc) {
      if constexpr (kRowsOnM) {
        rows.issue_s(stage, kbuf, acc);
      } else {
        issue_s(stage, kbuf, acc);
      }
    };
    const auto step_ahead = [&](FragSStep& acc, int stage, int64_t m0, int64_t n0w, int g) {
      if constexpr (kRowsOnM) {
        rows.ahead(acc, stage, m0, n0w, g);
      } else {
        stats_ahead(acc, stage, m0, n0w, g);
      }
    };

    typename Cfg::CopydQ r2s_dq;
    auto thr_r2s_dq = r2s_dq.get_thread_slice(tid);
    const auto dq_addr = matrix_addresses(
        thr_r2s_dq.partition_D(make_tensor(make_smem_ptr(st.ds.data()), typename Cfg::SmemLayoutdQ{})));
    constexpr uint32_t kDsBufferBytes = uint32_t(cosize_v<typename Cfg::SmemLayoutdQ> * sizeof(Element));
    Tensor mdQ = params.tma_dq.get_tma_tensor(make_shape(int32_t(prob.Sq), HD{}, int32_t(prob.Hq), int32_t(prob.B)));
    const auto store_dq = [&](const FragdQ& tdQrdQ, int buf, int64_t b, int64_t head, int64_t m0) {
      with_kb_finish<Cfg>(prob, [&](auto finish) {
        constexpr KbFinish kFinish = decltype(finish)::value;
        Tensor out = make_fragment_like<Element>(tdQrdQ);  // (MMA, 1, 1)
        CUTE_UNROLL
        for (int i = 0; i < size(tdQrdQ); ++i) out(i) = Element(kb_finish<kFinish>(tdQrdQ(i), prob.scale));
        store_matrices(dq_addr, uint32_t(buf) * kDsBufferBytes, thr_r2s_dq.retile_S(out));
      });
      cutlass::arch::fence_view_async_shared();  // dQ written by threads, read by TMA
      cutlass::arch::NamedBarrier::sync(Cfg::kWarpgroupThreads, Cfg::kDqStagedBarrier + w);
      if (tid == 0) {
        Tensor sdQ = make_tensor(make_smem_ptr(st.ds.data() + buf * cosize_v<typename Cfg::SmemLayoutdQ>),
                                 typename Cfg::SmemLayoutdQ{});                                       // (BM, D)
        Tensor gdQ = local_tile(mdQ(_, _, head, b), Shape<BM, HD>{}, make_coord(int(m0 / kBlockM), 0));  // (BM, D)
        tma_store_tile(params.tma_dq, sdQ, gdQ);
        tma_store_arrive();
      }
    };

    // The dQ partial = dS K over both consumers' dS in dS buffer `buf` and K buffer kbuf, one wgmma batch.
    const auto issue_dq = [&](int buf, int kbuf, FragdQ& acc) {
      warpgroup_arrive();
      mma_dq.accumulate_ = GMMA::ScaleOut::Zero;
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tdQrK); ++kb) {
        gemm(mma_dq, tdQrdS(_, _, kb, buf), tdQrK(_, _, kb, kbuf), acc);
        mma_dq.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };
    // Where K_w is not resident, the dQ product of a turn stays in flight under the statistics and is staged at
    // the next step's start (its accumulator live across steps); with kEarlyS once the step's partials are in,
    // for the other consumer's dK product of the previous step reads that dS buffer too and is done before that
    // consumer's arrival.
    constexpr bool kDqInFlight = !Cfg::kKResident;
    constexpr bool kEarlyS = Cfg::kEarlyS;
    FragdQ tdQrdQ_flight;  // (MMA, 1, 1) fp32
    int64_t dq_head = 0, dq_m0 = 0;
    int dq_buf = 0;
    auto stage_state = cutlass::PipelineState<Cfg::kStages>{};
    int g = 0;        // the CTA's steps so far: g mod 2 picks the dS buffer and the dQ product's consumer
    int k_loads = 0;  // tiles with steps so far
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      const int64_t n0w = work.n0 + int64_t(w) * kHalf;  // this consumer's first key
      const KBufferUse<Cfg> k_use(k_loads);
      clear(tdKrdK);
      StepCursor at = work.first();
      if (work.steps > 0) {
        ++k_loads;
        Cfg::TxBarrier::wait(&st.k_full[k_use.buffer], k_use.phase);
        if constexpr (Cfg::kKResident) {
          copy(s2r_k, thr_s2r_k.partition_S(sKw_of(k_use.buffer)), thr_s2r_k.retile_D(tSrK));  // resident
        }
        stage_pipe.consumer_wait(stage_state);  // Sᵀ of step 0
        FragSStep tSrS;                         // (MMA, 1, 1) fp32
        issue_step_s(stage_state.index(), k_use.buffer, tSrS);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tSrS);
        step_ahead(tSrS, stage_state.index(), int64_t(at.block) * kBlockM, n0w, g);
        stats_arrive(g);
      }
      trace.mark(SpTracePhase::kTileStart);
      // Nothing in flight at the top of a step (every product of a step awaited in it), but for the dQ product of
      // the previous step where it was this consumer's and stays in flight (kDqInFlight).
      for (int t = 0; t < work.steps; ++t, ++g) {
        const int stage = stage_state.index(), buf = g % kBuffers;
        const bool turn = buf == w;  // the dQ product of step g
        const int64_t head = at.head;
        const int64_t m0 = int64_t(at.block) * kBlockM;
        work.advance(at);
        auto next_state = stage_state;
        ++next_state;
        const bool ahead = t + 1 < work.steps;
        FragSStep tSrS;  // (MMA, 1, 1) fp32: S or Sᵀ of step t + 1
        if constexpr (kEarlyS) {
          // Sᵀ(t + 1) at the step's top, so that it runs under the combine and dS (the tile's last step's
          // multiplies its own tiles and is never read: straight-line wgmma keeps ptxas from serialising them).
          // Where step g − 1 was this consumer's turn, its dQ partial is staged first, once the step's partials
          // are in (the other consumer's dK product of step g − 1 done): with Sᵀ(t + 1) in flight, ptxas would
          // serialise the wgmma for the read of the dQ accumulator.
          const auto issue_next_s = [&] {
            if (ahead) stage_pipe.consumer_wait(next_state);
            issue_step_s(ahead ? next_state.index() : stage, k_use.buffer, tSrS);
          };
          if (t > 0 && !turn) {
            stats_wait(g);
            trace.mark(SpTracePhase::kStatsWait);
            warpgroup_wait<0>();
            warpgroup_fence_operand(tdQrdQ_flight);
            store_dq(tdQrdQ_flight, dq_buf, work.b, dq_head, dq_m0);
            trace.mark(SpTracePhase::kStoreDq);
            issue_next_s();
            trace.mark(SpTracePhase::kIssueS);
          } else {
            issue_next_s();
            trace.mark(SpTracePhase::kIssueS);
            stats_wait(g);
            trace.mark(SpTracePhase::kStatsWait);
          }
        } else {
          if constexpr (kDqInFlight) {
            if (t > 0 && !turn) {  // step g − 1 was this consumer's turn
              warpgroup_wait<0>();
              warpgroup_fence_operand(tdQrdQ_flight);
              store_dq(tdQrdQ_flight, dq_buf, work.b, dq_head, dq_m0);
            }
          }
          stats_wait(g);
          trace.mark(SpTracePhase::kStatsWait);
        }

        if constexpr (kRowsOnM) {
          rows.combine(g);
        } else {
          combine(g);
        }
        trace.mark(SpTracePhase::kCombine);
        FragdSStep tSrdS;  // (MMA, 1, 1): dS or dSᵀ of this step (dSᵀ: the dK product's A operand where resident)
        if constexpr (kRowsOnM) {
          rows.ds(tSrdS, m0, n0w);
        } else {
          dst_of(tSrdS, m0, n0w);
        }
        trace.mark(SpTracePhase::kDs);
        // dS buffer g mod 2 was last read by the dQ product of step g − 2, awaited in that step by its
        // consumer, who arrived at the dS barrier of step g − 1 after it (the other consumer passed it), and
        // (kEarlyS) by both consumers' dK products of step g − 2, each awaited before its statistics' arrival
        // in that step.
        if constexpr (kRowsOnM) {
          rows.store_ds(tSrdS, buf);
        } else {
          copy(r2s, thr_r2s.retile_S(tSrdS), thr_r2s.partition_D(Cfg::consumer_keys(sdSt(_, _, buf), w)));
        }
        if constexpr (kEarlyS) {
          cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
          if (!turn) {
            if (tid == 0) tma_store_wait<0>();  // the previous step's dQ store has read its dS buffer (store_dq)
            cutlass::arch::NamedBarrier::arrive(kDsBarrierThreads, Cfg::kDsBarrier + buf);
          }
          cutlass::arch::NamedBarrier::sync(Cfg::kWarpgroupThreads, Cfg::kDsOwnBarrier + w);
          trace.mark(SpTracePhase::kStoreDs);
          // dK += dSᵀ Q from shared memory (this consumer's dS alone), then on its turn, once the other's dS is
          // written, the dQ product: both run under the statistics.
          warpgroup_arrive();
          CUTE_UNROLL
          for (int kb = 0; kb < size<2>(tdKsdS); ++kb) {
            gemm(mma_dk_shared, tdKsdS(_, _, kb, buf), tdKsQ(_, _, kb, stage), tdKrdK);
          }
          warpgroup_commit_batch();
          trace.mark(SpTracePhase::kIssueDk);
          // Then S(t + 1) awaited (dK and, on turn, dQ in flight), each wait in the branch of its products so
          // that ptxas sees which accumulator it frees.
          if (turn) {
            cutlass::arch::NamedBarrier::sync(kDsBarrierThreads, Cfg::kDsBarrier + buf);
            trace.mark(SpTracePhase::kDsBarrier);
            issue_dq(buf, k_use.buffer, tdQrdQ_flight);
            dq_head = head;
            dq_m0 = m0;
            dq_buf = buf;
            trace.mark(SpTracePhase::kIssueDq);
            warpgroup_wait<2>();
          } else {
            warpgroup_wait<1>();
          }
          trace.mark(SpTracePhase::kWaitProducts);
          warpgroup_fence_operand(tSrS);
          if (ahead) step_ahead(tSrS, next_state.index(), int64_t(at.block) * kBlockM, n0w, g + 1);
          trace.mark(SpTracePhase::kStats);
          // dK done (its dSᵀ and the stage's Q read) before the arrival, so that the step's partials tell the
          // stager of this step's dQ partial that the dS buffer is read no more; the dQ product stays in flight.
          if (turn) {
            warpgroup_wait<1>();
          } else {
            warpgroup_wait<0>();
          }
          if (ahead) stats_arrive(g + 1);
          trace.mark(SpTracePhase::kWaitDk);
        } else {
          if (!turn) {
            if (tid == 0) tma_store_wait<0>();  // the previous step's dQ store has read its dS buffer (store_dq)
            cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
            cutlass::arch::NamedBarrier::arrive(kDsBarrierThreads, Cfg::kDsBarrier + buf);
          }
          trace.mark(SpTracePhase::kStoreDs);
          // Sᵀ of step t + 1 (the tile's last step's multiplies its own tiles and is never read: straight-line
          // wgmma keeps ptxas from serialising them), then dK += dSᵀ Q.
          if (ahead) stage_pipe.consumer_wait(next_state);
          issue_s(ahead ? next_state.index() : stage, k_use.buffer, tSrS);
          trace.mark(SpTracePhase::kIssueS);
          const Tensor tdKrdS = make_tensor(tSrdS.data(), acc_as_operand_a(tSrdS.layout()));  // ((2, 2, 2), 1, BM/16)
          warpgroup_arrive();
          CUTE_UNROLL
          for (int kb = 0; kb < size<2>(tdKrdS); ++kb) gemm(mma_dk, tdKrdS(_, _, kb), tdKrQ(_, _, kb, stage), tdKrdK);
          warpgroup_commit_batch();
          trace.mark(SpTracePhase::kIssueDk);
          if (turn) {
            cutlass::arch::fence_view_async_shared();  // dS written by threads, read by wgmma
            cutlass::arch::NamedBarrier::sync(kDsBarrierThreads, Cfg::kDsBarrier + buf);
            trace.mark(SpTracePhase::kDsBarrier);
            if constexpr (kDqInFlight) {
              issue_dq(buf, k_use.buffer, tdQrdQ_flight);
              trace.mark(SpTracePhase::kIssueDq);
              dq_head = head;
              dq_m0 = m0;
              dq_buf = buf;
              warpgroup_wait<1>();  // Sᵀ of step t + 1 and dK; dQ in flight into step t + 1
              trace.mark(SpTracePhase::kWaitProducts);
            } else {
              FragdQ tdQrdQ;  // (MMA, 1, 1) fp32
              issue_dq(buf, k_use.buffer, tdQrdQ);
              trace.mark(SpTracePhase::kIssueDq);
              // Every product of the step: the dQ partial is stored now, so that its registers are free for the
              // statistics a step ahead (Sᵀ(t + 1), P_c(t + 1) and dP(t + 1) live at once).
              warpgroup_wait<0>();
              warpgroup_fence_operand(tdQrdQ);
              trace.mark(SpTracePhase::kWaitProducts);
              store_dq(tdQrdQ, buf, work.b, head, m0);
              trace.mark(SpTracePhase::kStoreDq);
            }
          } else {
            warpgroup_wait<0>();
            trace.mark(SpTracePhase::kWaitProducts);
          }
          warpgroup_fence_operand(tSrS);
          if (ahead) {
            stats_ahead(tSrS, next_state.index(), int64_t(at.block) * kBlockM, n0w, g + 1);
            stats_arrive(g + 1);
          }
          trace.mark(SpTracePhase::kStats);
        }
        stage_pipe.consumer_release(stage_state);  // this warpgroup's last reader of the stage is done
        stage_state = next_state;
      }
      // Then this consumer reads the tile's K buffer no more (k_empty counts every consumer thread), its last dQ
      // product (kDqInFlight) awaited and staged: with kEarlyS once both consumers' dK products of the step, which
      // read the same dS buffer, are done.
      warpgroup_fence_operand(tdKrdK);
      if constexpr (kDqInFlight) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdQrdQ_flight);
        if (work.steps > 0) {
          if constexpr (kEarlyS) cutlass::arch::NamedBarrier::sync(kDsBarrierThreads, Cfg::kTileEndBarrier);
          if ((g - 1) % kBuffers == w) store_dq(tdQrdQ_flight, dq_buf, work.b, dq_head, dq_m0);
        }
      }
      if (work.steps > 0) cutlass::arch::ClusterBarrier::arrive(&st.k_empty[k_use.buffer]);
      kb_store_dk<Cfg>(params, w, tdKrdK, thr_dk.partition_C(make_identity_tensor(Shape<HF, HD>{})), work);
      trace.mark(SpTracePhase::kTileEnd);
    }
    if (tid == 0) tma_store_wait<0>();  // the last dQ store reads shared memory until it completes
  }
};

}  // namespace qksoftmax::cuda::sm90
