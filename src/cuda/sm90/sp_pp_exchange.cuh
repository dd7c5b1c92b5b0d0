// The pingpong single pass's row statistics across a cluster (sp_pp_config.h, kCluster): CTA r of a cluster holds
// keys [128 r, 128 r + 128) of a (batch, key head) (in a mirrored tile, KbTileOrder::paired, key block C − 1 − r)
// and walks the row blocks that see them (causal: from row block 2·nb up, or in a descending tile down to it). A
// row block is a block of every CTA whose keys it sees, walked in one order by all and of the same consumer
// warpgroup in each (each CTA's blocks before a head are of one parity: KbTileOrder::pairable). Its owner in each CTA reduces its rows over its own keys
// (SpPpSoftmax::sums), pushes each row's (LSE_r, D_r) over those keys, in log2 units, into a slot of every other
// CTA of the row block (st.async completing bytes on the slot's barrier, awaited at CTA scope), and combines the
// CTAs' partials (SpPpSoftmax::factors_of):
//   LSE = L + log2 Σ_r 2^(LSE_r − L), L = max_r LSE_r; D = Σ_r 2^(LSE_r − LSE) D_r;
// a CTA's p = 2^(x − m) over its keys then becomes P = p · 2^(m − LSE).
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/cluster_exchange.cuh"
#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90/trace.h"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
struct SpPpExchange {
  static constexpr int kRows = 2;  // rows of a thread in S's layout
  static constexpr int kQuad = 4;  // lanes of a row
  static constexpr int kPeers = Cfg::kPeers;
  static constexpr int kCountBits = 2;  // a pair's exchanges so far, modulo 4: the slot's parity and its phase
  static constexpr int kPerLane = Cfg::kCluster > 1 ? Cfg::kCluster / 2 : 1;  // a row's partials a lane combines (quads)
  static constexpr int kPushesPerLane = (kPeers + kQuad - 1) / kQuad;  // the peers a lane of a quad pushes to
  static_assert(kPeers * kCountBits <= 32, "the counts fit a register");
  using Barrier = cutlass::arch::ClusterTransactionBarrier;

  typename Cfg::Storage& st;
  const typename Cfg::TileOrder& order;
  int w;                // this consumer
  int rank;             // this CTA's
  bool mirrored = false;  // the tile's (KbTile): CTA r holds key block C − 1 − r
  uint32_t counts = 0;  // by peer p, bits [2p, 2p + 2): this consumer's exchanges with it so far, modulo 4

  // 2^(x − top), 0 where top is −inf (a row that sees none of the keys).
  __device__ static float rescaled(float x, float top) { return top == -INFINITY ? 0.0f : exp2_fast(x - top); }

  // The rank of peer p (the other CTAs, by rank), and this CTA's index among the peers of CTA `of`.
  __device__ int peer_rank(int p) const { return p < rank ? p : p + 1; }
  __device__ int index_at(int of) const { return rank < of ? rank : rank - 1; }
  __device__ uint32_t count(int p) const { return (counts >> (kCountBits * p)) & 3u; }
  __device__ int slot(int p) const { return Cfg::stats_slot(w, p, int(count(p) % Cfg::kStatsSlots)); }
  __device__ uint32_t phase(int p) const { return (count(p) / Cfg::kStatsSlots) & 1u; }  // of slot(p)'s barrier

  // The peers whose keys row block `block` sees (bit p: peer p; CTA r's key block is r, or C − 1 − r in a mirrored
  // tile, the tile order gives its first row block): the block's statistics are exchanged with them, none where 0.
  __device__ uint32_t peers_of(int block) const {
    uint32_t peers = 0;
    CUTE_UNROLL
    for (int p = 0; p < kPeers; ++p) {
      const int nb = mirrored ? kPeers - peer_rank(p) : peer_rank(p);
      peers |= uint32_t(block >= order.first_row_block(nb)) << p;
    }
    return peers;
  }

  // This thread's rows' (LSE, D) over its CTA's keys (`mine`; `rows`: their indices in the block) pushed to the
  // block's peers (peers_of), theirs awaited, and the row's combination returned: the largest LSE_r (`top`),
  // Σ_r 2^(LSE_r − top) (`sum`) and Σ_r 2^(LSE_r − top) D_r (`d`). `mark` is called after the pushes and after
  // the waits (the trace's phases).
  template <class Mark>
  __device__ void combine(uint32_t peers, const float2 (&mine)[kRows], const int (&rows)[kRows], int tid,
                          float (&top)[kRows], float (&sum)[kRows], float (&d)[kRows], Mark&& mark) {
    // A row's lanes hold the same values: lane q of the quad pushes them to peers q, q + 4, … (the quad's four
    // lanes share the pushes).
    CUTE_UNROLL
    for (int i = 0; i < kPushesPerLane; ++i) {
      const int p = tid % kQuad + kQuad * i;
      if (p >= kPeers || !(peers >> p & 1u)) continue;
      const int r = peer_rank(p);
      const int at = Cfg::stats_slot(w, index_at(r), int(count(p) % Cfg::kStatsSlots));
      const uint32_t remote_full = cluster_addr(smem_addr(&st.stats_full[at]), uint32_t(r));
      CUTE_UNROLL
      for (int ri = 0; ri < kRows; ++ri) {
        push_f2(cluster_addr(smem_addr(&st.stats[at][rows[ri]]), uint32_t(r)), mine[ri], remote_full);
      }
    }
    mark(PpTracePhase::kPush);
    // Every peer's slot awaited in turn (thread 0 arriving on each, its bytes expected).
    CUTE_UNROLL
    for (int p = 0; p < kPeers; ++p) {
      if (!(peers >> p & 1u)) continue;
      uint64_t* full = &st.stats_full[slot(p)];
      if (tid == 0) Barrier::arrive_and_expect_tx(full, Cfg::kStatsBytes);
      Barrier::wait(full, phase(p));
    }
    mark(PpTracePhase::kExchange);
    if constexpr (!Cfg::kQuadCombine) {  // every lane combines every partial of both its rows
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) top[r] = mine[r].x;
      CUTE_UNROLL
      for (int p = 0; p < kPeers; ++p) {
        if (!(peers >> p & 1u)) continue;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) top[r] = fmaxf(top[r], st.stats[slot(p)][rows[r]].x);
      }
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        sum[r] = rescaled(mine[r].x, top[r]);
        d[r] = sum[r] * mine[r].y;
      }
      CUTE_UNROLL
      for (int p = 0; p < kPeers; ++p) {
        if (!(peers >> p & 1u)) continue;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const float2 v = st.stats[slot(p)][rows[r]];
          const float b = rescaled(v.x, top[r]);
          sum[r] += b;
          d[r] = fmaf(b, v.y, d[r]);
        }
      }
    } else {
      combine_in_quads(peers, mine, rows, tid, top, sum, d);
    }
    // Each exchanged peer's count + 1 (modulo 4, field by field).
    uint32_t inc = 0;
    CUTE_UNROLL
    for (int p = 0; p < kPeers; ++p) inc |= (peers >> p & 1u) << (kCountBits * p);
    const uint32_t lo = counts & 0x55555555u, hi = counts & 0xAAAAAAAAu;
    counts = (lo ^ inc) | (hi ^ ((lo & inc) << 1));
  }

  // SpPpConfig::kQuadCombine: a row's kCluster partials (its own at position 0, peer p's at p + 1) split between two
  // lanes of its quad (lanes 0 and 1 row 0, lanes 2 and 3 row 1), lane h of the two the positions of parity h; each
  // reduces its half against its own largest LSE, the two halves are merged in one order on both lanes (so that
  // they agree bit for bit), and every lane of the quad takes both rows' results.
  __device__ void combine_in_quads(uint32_t peers, const float2 (&mine)[kRows], const int (&rows)[kRows], int tid,
                                   float (&top)[kRows], float (&sum)[kRows], float (&d)[kRows]) const {
    const int lane = tid % 32;
    const int ri = lane % kQuad / 2, h = lane % 2;
    const int row = ri == 0 ? rows[0] : rows[1];
    float2 v[kPerLane];
    CUTE_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      const int p = 2 * i + h - 1;  // (−1: this CTA's own)
      v[i] = make_float2(-INFINITY, 0.0f);  // (a peer that does not see the row block)
      if (p < 0) {
        v[i] = ri == 0 ? mine[0] : mine[1];
      } else if (peers >> p & 1u) {
        v[i] = st.stats[slot(p)][row];
      }
    }
    float t = v[0].x;
    CUTE_UNROLL
    for (int i = 1; i < kPerLane; ++i) t = fmaxf(t, v[i].x);
    float s = 0.0f, dd = 0.0f;
    CUTE_UNROLL
    for (int i = 0; i < kPerLane; ++i) {
      const float b = rescaled(v[i].x, t);
      s += b;
      dd = fmaf(b, v[i].y, dd);
    }
    const float t_o = __shfl_xor_sync(0xffffffffu, t, 1), s_o = __shfl_xor_sync(0xffffffffu, s, 1),
                d_o = __shfl_xor_sync(0xffffffffu, dd, 1);
    const float t0 = h ? t_o : t, s0 = h ? s_o : s, d0 = h ? d_o : dd;  // the even positions'
    const float t1 = h ? t : t_o, s1 = h ? s : s_o, d1 = h ? dd : d_o;  // the odd positions'
    const float tt = fmaxf(t0, t1);
    const float a0 = rescaled(t0, tt), a1 = rescaled(t1, tt);
    const float ss = fmaf(s0, a0, s1 * a1), ds = fmaf(d0, a0, d1 * a1);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int from = (lane & ~(kQuad - 1)) + 2 * r;  // a lane of the quad that combined row r
      top[r] = __shfl_sync(0xffffffffu, tt, from);
      sum[r] = __shfl_sync(0xffffffffu, ss, from);
      d[r] = __shfl_sync(0xffffffffu, ds, from);
    }
  }
};

}  // namespace qksoftmax::cuda::sm90
