// The statistics warp of the single pass (sp_config.h): per step of the CTA's tiles, once every consumer warp
// has written its partials of the step's rows (the statistics barrier of the step's parity), each lane combines
// two rows over the 8 warps, M = max m_w, L = Σ l_w 2^(m_w − M), U = Σ u_w 2^(m_w − M) (LSE·log2e = M + log2 L,
// D = U / L), and writes for every warp w its factor f_w = 2^(m_w − M) / L (× |scale| where dS carries it) and
// f_w · D into the factor pipeline's slot, which the consumers read in the step's element-wise work
// (sp_mainloop.cuh): one combine per row, 16 exponentials per lane and step, instead of each consumer warp
// combining every row for itself.
#pragma once

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/sp_config.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct SpStats {
  const typename Cfg::Params& params;
  typename Cfg::Storage& st;

  template <class FactorPipeline>
  __device__ void run(FactorPipeline& factor_pipe, int lane) {
    constexpr int kWarps = Cfg::kConsumerWarps;
    static_assert(Cfg::kBlockM == 2 * 32, "a lane combines two adjacent rows");
    const Problem& prob = params.prob;
    const float fold = kScaleInDs<typename Cfg::Element> ? fabsf(prob.scale) : 1.0f;
    const int row = 2 * lane;
    auto state = cutlass::make_producer_start_state<FactorPipeline>();
    int g = 0;  // the CTA's steps so far
    KbTileReader<Cfg> tiles(params, st);
    for (KbTile tile; tiles.next(tile);) {
      const KbWork<Cfg> work(params.order, tile);
      for (int t = 0; t < work.steps; ++t, ++g, ++state) {
        const int b = g % Cfg::kStatBuffers;
        cutlass::arch::ClusterBarrier::wait(&st.stats_full[b], (g / Cfg::kStatBuffers) & 1);
        float2 c[kWarps];  // the warps' maxima, then their weights 2^(m_w − M)
        CUTE_UNROLL
        for (int j = 0; j < kWarps; ++j) c[j] = load_shared_f2(smem_addr(&st.partials[b][Cfg::kStatM][j][row]));
        float2 ref = make_float2(-INFINITY, -INFINITY);
        CUTE_UNROLL
        for (int j = 0; j < kWarps; ++j) ref = make_float2(fmaxf(ref.x, c[j].x), fmaxf(ref.y, c[j].y));
        ref = make_float2(ref.x == -INFINITY ? 0.0f : ref.x, ref.y == -INFINITY ? 0.0f : ref.y);  // no key: L = 0
        float2 sum_l = make_float2(0.0f, 0.0f), sum_u = sum_l;
        CUTE_UNROLL
        for (int j = 0; j < kWarps; ++j) {
          const float2 l = load_shared_f2(smem_addr(&st.partials[b][Cfg::kStatL][j][row]));
          const float2 u = load_shared_f2(smem_addr(&st.partials[b][Cfg::kStatU][j][row]));
          c[j] = make_float2(exp2_fast(c[j].x - ref.x), exp2_fast(c[j].y - ref.y));
          sum_l = make_float2(fmaf(l.x, c[j].x, sum_l.x), fmaf(l.y, c[j].y, sum_l.y));
          sum_u = make_float2(fmaf(u.x, c[j].x, sum_u.x), fmaf(u.y, c[j].y, sum_u.y));
        }
        const float inv0 = sum_l.x > 0.0f ? fold / sum_l.x : 0.0f, inv1 = sum_l.y > 0.0f ? fold / sum_l.y : 0.0f;
        const float d0 = sum_l.x > 0.0f ? sum_u.x / sum_l.x : 0.0f, d1 = sum_l.y > 0.0f ? sum_u.y / sum_l.y : 0.0f;
        factor_pipe.producer_acquire(state);  // the consumers have read this slot's factors of step g − 2
        const int slot = state.index();
        CUTE_UNROLL
        for (int j = 0; j < kWarps; ++j) {
          const float f0 = c[j].x * inv0, f1 = c[j].y * inv1;
          store_shared_f4(smem_addr(&st.factors[slot][j][row]), make_float4(f0, f0 * d0, f1, f1 * d1));
        }
        factor_pipe.producer_commit(state);  // each lane's arrival releases its own stores
      }
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
