// The persistent tile scheduler of the key-block pass (FlashAttention-3's static scheduler with its L2-sized
// sections of heads). A tile is a block of 128 keys nb of a (batch, key head); the launch runs one CTA per SM
// (or fewer where there are fewer tiles) and CTA c takes tiles c, c + grid, c + 2·grid, … of one order:
//   - in sections of heads whose shared data fits in L2: the key blocks of one (batch, key head) read the
//     same Q and add into the same dQ rows. Taken nb-major over all heads, a head's next key block would
//     come B·Hk tiles later, its Q and dQ long evicted (at B8·H128·S1024 causal: 1024 tiles apart, ~0.3 GB of
//     Q and dP read in between); a section of heads whose Q and dQ fit keeps them in L2 between its key
//     blocks. The sections are of equal width (±1 head): a narrow last one would put its long tiles last.
//   - longest first within a section: with a causal mask key block nb has fewer steps the larger nb is (the
//     row blocks above it see none of it), so the tiles go by nb ascending, then by (batch, key head); a
//     section ends with its short tiles, and the last one's (last of all those without a step: causal, Sk > Sq,
//     key blocks that no row sees) even out the CTAs' finishing times. Without the mask all tiles are equal.
// A static walk cannot even out tiles of very different lengths when each CTA takes only a few (long causal
// rows over few heads); there the launch gives every tile a CTA of its own (persistent_pays), which the
// hardware hands out in this order as SMs come free.
#pragma once

#include <cute/config.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "problem.h"

namespace qksoftmax::cuda::sm90 {

// What the tiles of a section's heads may keep in L2 between them: 32 MB of the H200's 50 MB (the share
// FlashAttention-3 gives its sections' K and V), the rest left to the dP and Q tiles streaming through.
constexpr int64_t kKbSectionL2Bytes = int64_t(32) << 20;

// What a tile costs beyond its steps when it has a CTA of its own, and the persistent CTAs save (the CTA's
// launch, its barriers' set-up, its first loads' latency, its last reduce-add's drain), in steps: ~2 µs against
// ~2 µs per step, an estimate until measured.
constexpr int64_t kKbTileSetupSteps = 1;

struct KbTile {
  int b, kv_head, nb;  // batch, key head, block of keys
};

// A problem's tiles in the order the CTAs take them, and the steps of each (host and device; the launch
// checks that the tiles and each head's steps fit 31 bits).
template <int kBlockM, int kBlockN>
struct KbTileOrder {
  static_assert(kBlockN % kBlockM == 0, "a key block starts on a row block");

  int key_blocks;     // per (batch, key head)
  int heads;          // (batch, key head) pairs, B · Hk
  int hk;             // key heads
  int section;        // (batch, key head) pairs of the widest sections
  int wide_sections;  // sections of `section` pairs, taken first; the others hold one pair fewer
  int row_blocks;     // per query head
  int group;          // query heads per key head
  bool causal;

  // `head_bytes`: what the key blocks of one (batch, key head) share through L2 (Q and the dQ target of its
  // query heads).
  static KbTileOrder of(const Problem& prob, int64_t head_bytes) {
    KbTileOrder order{};
    order.key_blocks = int((prob.Sk + kBlockN - 1) / kBlockN);
    order.heads = int(prob.B * prob.Hk);
    order.hk = int(prob.Hk);
    const int64_t widest = std::clamp<int64_t>(kKbSectionL2Bytes / std::max<int64_t>(head_bytes, 1), 1, order.heads);
    const int64_t sections = (order.heads + widest - 1) / widest;
    order.section = int((order.heads + sections - 1) / sections);
    order.wide_sections = int(order.heads - sections * (order.section - 1));
    order.row_blocks = int((prob.Sq + kBlockM - 1) / kBlockM);
    order.group = int(prob.group());
    order.causal = prob.keys().causal;
    return order;
  }

  CUTE_HOST_DEVICE int tiles() const { return key_blocks * heads; }

  // Tile i of the order: its section, then nb, then the head within the section.
  CUTE_HOST_DEVICE KbTile tile(int i) const {
    const int wide_tiles = wide_sections * section * key_blocks;
    const bool wide = i < wide_tiles;
    const int width = wide ? section : section - 1;
    const int j = wide ? i : i - wide_tiles;
    const int s = j / (width * key_blocks), in = j % (width * key_blocks);
    const int first = (wide ? 0 : wide_sections * section) + s * width;
    const int nb = in / width, head = first + in % width;
    return {head / hk, head % hk, nb};
  }

  // Causal: the row blocks above key block nb see none of it.
  CUTE_HOST_DEVICE int first_row_block(int nb) const {
    const int first = causal ? nb * (kBlockN / kBlockM) : 0;
    return first < row_blocks ? first : row_blocks;
  }
  CUTE_HOST_DEVICE int steps(int nb) const { return (row_blocks - first_row_block(nb)) * group; }

  // The most steps that one of `grid` CTAs takes in the static walk (host). The tiles of one nb in one section
  // (a level) are consecutive in the order and of equal steps: every CTA takes width / grid of them, and a
  // cyclic run of width mod grid CTAs one more, counted in a difference array.
  int64_t most_cta_steps(int grid) const {
    std::vector<int64_t> more(size_t(grid) + 1, 0);
    int64_t every = 0;  // steps that every CTA takes
    int64_t start = 0;  // order index of the level's first tile
    for (int s = 0, first = 0; first < heads; ++s) {
      const int width = s < wide_sections ? section : section - 1;
      for (int nb = 0; nb < key_blocks; ++nb, start += width) {
        const int64_t level_steps = steps(nb);
        every += level_steps * (width / grid);
        const int rest = width % grid;
        const int from = int((start + width - rest) % grid), to = from + rest;
        more[size_t(from)] += level_steps;
        more[size_t(std::min(to, grid))] -= level_steps;
        if (to > grid) {  // the run wraps to the first CTAs
          more[0] += level_steps;
          more[size_t(to - grid)] -= level_steps;
        }
      }
      first += width;
    }
    int64_t most = 0, at = 0;
    for (int c = 0; c < grid; ++c) most = std::max(most, at += more[size_t(c)]);
    return every + most;
  }

  // Whether `grid` persistent CTAs (fewer than the tiles) finish before one CTA per tile would (host): the
  // static walk's most loaded CTA may exceed what the hardware's hand-out of one CTA per tile in this order,
  // longest first, nears (the mean of the steps per CTA, the longest tile, or the CTA's share of tiles at the
  // shortest) by less than the set-up that the persistent CTAs save.
  bool persistent_pays(int grid) const {
    int64_t total = 0;
    for (int nb = 0; nb < key_blocks; ++nb) total += int64_t(steps(nb)) * heads;
    const int64_t share = (int64_t(tiles()) + grid - 1) / grid;
    const int64_t bound = std::max({(total + grid - 1) / grid, int64_t(steps(0)), share * steps(key_blocks - 1)});
    return (most_cta_steps(grid) - bound) * grid <= kKbTileSetupSteps * tiles();
  }
};

// CTA `cta` of `grid`: tiles cta, cta + grid, … of the order. Every role of the CTA walks its own copy, so all
// see the same tiles without exchanging them.
template <class Order>
class KbScheduler {
 public:
  CUTE_HOST_DEVICE KbScheduler(const Order& order, int cta, int grid) : order_(order), next_(cta), grid_(grid) {}

  // The next tile into `tile`; false when none is left.
  CUTE_HOST_DEVICE bool next(KbTile& tile) {
    if (next_ >= order_.tiles()) return false;
    tile = order_.tile(int(next_));
    next_ += grid_;
    return true;
  }

 private:
  const Order& order_;
  int64_t next_;  // (past the last tile by up to the grid: 64 bits)
  int grid_;
};

}  // namespace qksoftmax::cuda::sm90
