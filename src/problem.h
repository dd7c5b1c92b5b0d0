// The validated, normalised form of a call: what both backends receive. Built by validate.cpp only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "qksoftmax/qksoftmax.h"

namespace qksoftmax {

// A rank-4 operand (b, h, row, col) — or rank 3 (b, h, row) for lse, whose col stride is 0.
// Strides are in elements. ptr is null when the operand is absent.
struct Operand {
  void* ptr = nullptr;
  int64_t sb = 0, sh = 0, sr = 0, sc = 0;

  constexpr bool present() const { return ptr != nullptr; }
  constexpr int64_t offset(int64_t b, int64_t h, int64_t r, int64_t c = 0) const {
    return b * sb + h * sh + r * sr + c * sc;
  }
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBFloat16:
    case DType::kFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
  }
  return 0;
}

enum class Pass : uint8_t { kForward, kBackward };

// How the mask and the problem's edges (KeyRange) cut a tile: not at all, by the causal diagonal alone (one
// compare per element), or row by row (each row's count of columns).
enum class BlockCut { kNone, kDiagonal, kRows };

// The mask's geometry: which key columns each query row sees. Small enough for a kernel to keep in registers.
struct KeyRange {
  bool causal = false;
  int64_t Sq = 0, Sk = 0;

  // Last key column that query row i may see, plus one (causal: i + 1, clipped to Sk).
  constexpr int64_t col_end(int64_t i) const { return causal ? std::min(i + 1, Sk) : Sk; }
  // How many of the columns [n0, n0 + width) row i sees, in [0, width]; none for a row past Sq.
  constexpr int cols_in(int64_t i, int64_t n0, int width) const {
    return i < Sq ? int(std::min(std::max(col_end(i) - n0, int64_t(0)), int64_t(width))) : 0;
  }
  // Whether the tile of rows [m0, m0 + rows) and columns [n0, n0 + width) has an element that some row does
  // not see, or rows past Sq (col_end grows with the row: the tile's first row decides).
  constexpr bool cuts(int64_t m0, int rows, int64_t n0, int width) const {
    return n0 + width > col_end(m0) || m0 + rows > Sq;
  }
  // Whether no row of [m0, m0 + rows) sees a key from n0 on (col_end grows with the row: the last row below Sq
  // decides; a tile of rows past Sq sees none).
  constexpr bool sees_none(int64_t m0, int rows, int64_t n0) const {
    const int64_t last = std::min(m0 + rows, Sq) - 1;
    return last < m0 || col_end(last) <= n0;
  }
  // Whether the causal diagonal alone cuts the tile (no row past Sq, no column past Sk): then row m0 + r sees
  // column n0 + c exactly where c − r ≤ m0 − n0.
  constexpr bool diagonal_only(int64_t m0, int rows, int64_t n0, int width) const {
    return causal && m0 + rows <= Sq && n0 + width <= Sk;
  }
  // The kind of cut of that tile.
  constexpr BlockCut cut(int64_t m0, int rows, int64_t n0, int width) const {
    return !cuts(m0, rows, n0, width)           ? BlockCut::kNone
           : diagonal_only(m0, rows, n0, width) ? BlockCut::kDiagonal
                                                : BlockCut::kRows;
  }
};

struct Problem {
  Pass pass = Pass::kForward;
  int64_t B = 0, Hq = 0, Hk = 0, Sq = 0, Sk = 0, D = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::kCPU;
  // Device::kCUDA: the ordinal the tensors declared (TensorDesc::device_index; -1 where none did), and whether
  // every present tensor declared it. A plan resolves the rest from the pointers (cuda::locate).
  int device_index = -1;
  bool devices_declared = false;
  Mask mask = Mask::kCausal;
  BackwardMode mode = BackwardMode::kRecompute;  // backward only
  bool deterministic = false;
  float scale = 1.0f;  // resolved (default 1/sqrt(D))
  double scale_f64 = 1.0;  // the same, for the fp64 CPU backend

  // Inputs (forward: q, k; backward: q, k, dp, and p in saved-P mode, lse optionally in recompute mode).
  Operand q, k, p, dp, lse;
  // Outputs (forward: p, optional lse; backward: dq, dk).
  Operand out_p, out_lse, dq, dk;
  // A given lse that saved-P mode does not read: its memory is checked with the others, never read.
  Operand unread_lse;

  constexpr int64_t group() const { return Hq / Hk; }  // query heads per key head
  constexpr KeyRange keys() const { return {mask == Mask::kCausal, Sq, Sk}; }
  constexpr int64_t col_end(int64_t i) const { return keys().col_end(i); }
};

}  // namespace qksoftmax
