// The tile scheduler of the key-block pass: FlashAttention-3's dynamic persistent scheduler, with its L2-sized
// sections of heads. A tile is a block of 128 keys nb of a (batch, key head); the launch runs one CTA per SM
// (or one per tile where there are fewer tiles) and each CTA takes the next tile of one order from a counter
// in device memory as it comes free: CTA c's first tile is c, and after that each CTA's claim (one atomicAdd,
// kb_claimed_tile) is the tile `grid` past the counter's old value. The tiles in flight are then always about
// `grid` consecutive tiles of the order, whatever their lengths (a static walk, CTA c taking c, c + grid, …,
// let the CTAs that drew short tiles run ahead, spreading the tiles in flight over many heads), and the CTAs
// finish together where the order ends with short tiles. The order:
//   - in sections of heads: the key blocks of one (batch, key head) read the same Q and add into the same dQ
//     rows. Taken nb-major over all heads, a head's next key block would come B·Hk tiles later, its Q and dQ
//     long evicted (at B8·H128·S1024 causal: 1024 tiles apart, ~0.3 GB of Q and dP read in between); in a
//     section whose tiles are about one window of tiles in flight, a head's key blocks run at nearly the same
//     time and its Q and dQ rows stay in L2 between them (kKbSectionL2Bytes). The sections are of equal width
//     (±1 head): a narrow last one would put its long tiles last.
//   - longest first within a section: with a causal mask key block nb has fewer steps the larger nb is (the
//     row blocks above it see none of it), so the tiles go by nb ascending, then by (batch, key head); the last
//     section ends with its short tiles (last of all those without a step: causal, Sk > Sq, key blocks that no
//     row sees), which even out the CTAs' finishing times. Without the mask all tiles are equal.
#pragma once

#include <cute/config.hpp>

#include <algorithm>
#include <cstdint>

#include "problem.h"

namespace qksoftmax::cuda::sm90 {

// What a section's heads share through L2 (Q and the dQ target of each): 8 MB, so that a section holds about
// one window of tiles in flight. The counter hands out ~grid consecutive tiles at a time, and a tile claimed
// early runs while later ones are claimed: at B8·H128·S1024 causal (8 key blocks of 2–16 steps, ~2.1 µs per
// step, 1185 µs for the pass's 8192 tiles: one claim per 0.145 µs), a 16-step tile runs ~34 µs, ~235 claims,
// so the tiles in flight span ~235 consecutive tiles. A section of 8 MB / head_bytes heads (head_bytes =
// group·Sq·D·(2 + 2) bytes with bf16 dQ added directly: 512 KB at Sq = 1024, 16 heads, 128 tiles; the same
// 128 tiles at any Sq = Sk, head_bytes and key blocks growing together) puts each head's 8 key blocks within
// 128 consecutive tiles, all in flight together: the span touches ~235 / 8 + 16 ≈ 45 heads, ~22 MB of Q and
// dQ, beside the dP and K tiles that stream through the H200's 60 MB of L2 once each. Sections of 32 MB (64
// heads, a head's first and last key blocks 448 tiles apart) put ~4 key blocks of each of 64–128 heads in such
// a span, 32–64 MB: under the static walk, which spread the span further, the loads hit L2 16 % of the time.
constexpr int64_t kKbSectionL2Bytes = int64_t(8) << 20;

// The tile that a claim takes (host and device): the counter's old value `claim` (the row statistics set it to 0;
// each CTA claims once per tile it runs, so it ends at `tiles` and never overflows) is the tile `grid` past it,
// the CTAs' first tiles being their own indices; past the last tile, `tiles`, the end of work.
CUTE_HOST_DEVICE int kb_claimed_tile(int claim, int grid, int tiles) {
  return int64_t(claim) + grid < tiles ? claim + grid : tiles;
}

struct KbTile {
  int b, kv_head, nb;     // batch, key head, block of keys
  bool mirrored = false;  // paired, second of its pair: CTA r holds key block C − 1 − r (the first walks its rows down)
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
  bool paired = false;  // pair_heads()

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

  // Each head's key blocks consecutive (tile i: key block i mod key_blocks of head i / key_blocks), so that a
  // cluster of key_blocks CTAs takes one head's tiles at once (the pingpong single pass in clusters).
  void by_head() {
    section = 1;
    wide_sections = heads;
  }
  // Causal rows in clusters (the pingpong single pass, by_head): heads 2p and 2p + 1 are one cluster's, one after
  // the other, so that its CTAs share the causal work evenly (docs/DESIGN.md, "Mirrored pairs"). In head 2p CTA r
  // holds key block r and walks its row blocks from the last down, in head 2p + 1 it holds key block C − 1 − r and
  // walks them up: CTA r's 2C − 2r blocks of the first head end as its first block of the second comes due at the
  // other CTAs' pace (C = key_blocks, 2C row blocks, one query head per key head: row block i of the first head
  // at step 2C − 1 − i, of the second at step i + 2), and every CTA runs 2C + 2 steps per pair, against 2C per head
  // when CTA 0's keys set the cluster's pace. The rows that two CTAs share are walked in one order by both, and a
  // CTA's block at position k of the head's walk (row blocks by query head in turn) is its consumer (k + g0) mod 2's
  // (g0: its blocks before the head, of one parity for every CTA of the cluster where pairable() holds), so that a
  // shared block is the same consumer's in each, as the statistics' exchange needs.
  void pair_heads() {
    by_head();
    paired = true;
  }
  // Whether pairing keeps the CTAs' counts of blocks of even parity before every head: each head's blocks of a
  // CTA are (row_blocks − first_row_block) · group, of the parity of row_blocks · group, or 0 where the CTA's keys
  // are past every row.
  CUTE_HOST_DEVICE bool pairable() const {
    return (row_blocks * group) % 2 == 0 || first_row_block(key_blocks - 1) < row_blocks;
  }
  CUTE_HOST_DEVICE int tiles() const { return key_blocks * heads; }
  // The static walk (one CTA per tile where there are fewer tiles than CTAs, else CTA c's tiles c, c + grid, …):
  // the first tile of CTA c and the tile after `current`, `tiles()` past the last. Paired: the cluster of CTAs
  // [C k, C k + C) takes heads 2k and 2k + 1, then 2k + 2·grid/C and the next, … (tile i: head i / C, CTA i mod C).
  // kMayPair false: the caller's kernel never pairs (its code then has no branch for it).
  template <bool kMayPair = true>
  CUTE_HOST_DEVICE int first_tile(int cta) const {
    return kMayPair && paired ? 2 * cta - cta % key_blocks : cta;
  }
  template <bool kMayPair = true>
  CUTE_HOST_DEVICE int next_tile(int current, int grid) const {
    if (!(kMayPair && paired)) return kb_claimed_tile(current, grid, tiles());
    const int64_t step = (current / key_blocks) % 2 == 0 ? key_blocks : 2 * int64_t(grid) - key_blocks;
    return current + step < tiles() ? int(current + step) : tiles();
  }

  // Tile i of the order: its section, then nb, then the head within the section (paired: above).
  template <bool kMayPair = true>
  CUTE_HOST_DEVICE KbTile tile(int i) const {
    if (kMayPair && paired) {
      const int head = i / key_blocks, rank = i % key_blocks;
      const bool mirrored = head % 2 == 1;
      return {head / hk, head % hk, mirrored ? key_blocks - 1 - rank : rank, mirrored};
    }
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
};


}  // namespace qksoftmax::cuda::sm90
