// The mask policy of the single-pass backward: which keys of a CTA's chunks each row block and row sees.
// Chunk u of CTA `rank` in a cluster of `cluster` holds keys [kChunk (u C + rank), kChunk (u C + rank + 1)).
// Causal (top-left, j ≤ i) or none; keys past Sk are masked in both. Chunks are dealt in rotation, so the
// chunks a row block sees form a prefix [0, live) of every CTA's chunks, and a step needs per-element
// compares only where that prefix ends inside the mask (the diagonal) or past Sk.
#pragma once

#include <cute/config.hpp>

#include "problem.h"

namespace qksoftmax::cuda::sm90 {

template <int kChunk_, int kChunks_, int kBlockM_>
struct ChunkMask {
  static constexpr int kChunk = kChunk_;
  static constexpr int kChunks = kChunks_;
  static constexpr int kBlockM = kBlockM_;

  KeyRange keys;
  int cluster;
  int rank;
  int log2_cluster;

  // The first key of chunk u (keys of a cluster are below 2^31).
  CUTE_HOST_DEVICE int key0(int u) const { return kChunk * (u * cluster + rank); }
  // One past the last key row i sees (below 2^31 as the keys are).
  CUTE_HOST_DEVICE int row_end(int64_t i) const { return int(keys.col_end(i)); }

  // Chunks of this CTA that some row of the block from row m0 sees: a prefix, [0, kChunks]. (32-bit: the
  // keys of a cluster, and the chunks, are few.)
  CUTE_HOST_DEVICE int live(int64_t m0) const {
    const int64_t last = (m0 + kBlockM < keys.Sq ? m0 + kBlockM : keys.Sq) - 1;
    const int seen = (row_end(last) + kChunk - 1) / kChunk;  // cluster-wide chunks with a seen key
    if (seen <= rank) return 0;
    const int mine = (seen - rank + cluster - 1) >> log2_cluster;
    return mine < kChunks ? mine : kChunks;
  }
  // Whether a row of the block from row m0 misses a key of chunk u (the block's first row sees the fewest).
  CUTE_HOST_DEVICE bool partial(int64_t m0, int u) const { return key0(u) + kChunk > row_end(m0); }
  // Whether a row of the block misses a key of its `live` chunks (the block's first row sees the fewest).
  CUTE_HOST_DEVICE bool cuts(int64_t m0, int live) const {
    return live > 0 && partial(m0, live - 1);
  }
};

}  // namespace qksoftmax::cuda::sm90
