// Host-side checks of the Hopper kernels' shared-memory address arithmetic against CuTe's own tensors: where a
// kernel computes an address itself (32-bit offsets, stage strides), it must land where CuTe's partition of
// the same tile says. These run on the CPU (no GPU needed).
#include <cute/tensor.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/sm90_colpass.cuh"
#include "cuda/sm90_config.h"

namespace qksoftmax::cuda::sm90 {
namespace {

using namespace cute;


// The column pass stores each thread's dQ pairs at base + 4 · dq_offset(r, d): the addresses of CuTe's
// partition of the swizzled buffer, pairs of adjacent columns 8-byte aligned.
template <class Cfg>
void check_dq_offsets() {
  using L = typename Cfg::SmemLayoutdQ;
  static float buf[cosize_v<L>] __attribute__((aligned(1024)));
  Tensor sdQ = make_tensor(make_smem_ptr(buf), L{});  // (BM, D)
  typename Cfg::MmadQ mma_dq;
  int wrong = 0, unpaired = 0;
  for (int tid = 0; tid < Cfg::kThreads; ++tid) {
    auto thr = mma_dq.get_thread_slice(tid);
    Tensor tdQcdQ = thr.partition_C(make_identity_tensor(Shape<typename Cfg::BM, typename Cfg::HD>{}));
    Tensor tdQsdQ = thr.partition_C(sdQ);
    for (int i = 0; i < size(tdQcdQ); i += 2) {
      const int r = get<0>(tdQcdQ(i)), d = get<1>(tdQcdQ(i));
      const float* at = buf + Cfg::dq_offset(r, d);
      wrong += at != &tdQsdQ(i);
      unpaired += &tdQsdQ(i + 1) != at + 1 || (reinterpret_cast<uintptr_t>(at) % 8) != 0 ||
                  get<0>(tdQcdQ(i + 1)) != r || get<1>(tdQcdQ(i + 1)) != d + 1;
    }
  }
  EXPECT_EQ(wrong, 0) << "dQ pair offsets that differ from CuTe's partition";
  EXPECT_EQ(unpaired, 0) << "dQ pairs that are not two adjacent, 8-byte aligned columns";
}

TEST(Sm90Layouts, ColumnPassDqOffsets) {
  check_dq_offsets<ColPassConfig<cutlass::bfloat16_t, 128, false>>();
  check_dq_offsets<ColPassConfig<cutlass::bfloat16_t, 128, true>>();
  check_dq_offsets<ColPassConfig<cutlass::half_t, 128, true>>();
}

// store_dk walks the dK accumulator as (rows, cols) with one row pointer per row: each row must be one key
// column, each (ci, ci + 1) two adjacent head dimensions, and the threads together must cover the tile once.
template <class Cfg>
void check_dk_rows() {
  typename Cfg::MmadK mma_dk;
  std::vector<int> seen(Cfg::kBlockN * Cfg::kHeadDim, 0);
  int mixed = 0, unpaired = 0;
  for (int tid = 0; tid < Cfg::kThreads; ++tid) {
    Tensor tdKcdK = mma_dk.get_thread_slice(tid).partition_C(
        make_identity_tensor(Shape<typename Cfg::BN, typename Cfg::HD>{}));  // (MMA, MMA_N, MMA_D) → (c, d)
    Tensor rc = make_tensor(tdKcdK.data(), rowcol(tdKcdK.layout()));        // (rows, cols) → (c, d)
    for (int ri = 0; ri < size<0>(rc); ++ri) {
      for (int ci = 0; ci < size<1>(rc); ++ci) {
        const int c = get<0>(rc(ri, ci)), d = get<1>(rc(ri, ci));
        mixed += c != get<0>(rc(ri, 0));
        if (ci % 2 == 1) unpaired += d != get<1>(rc(ri, ci - 1)) + 1;
        ++seen[c * Cfg::kHeadDim + d];
      }
    }
  }
  EXPECT_EQ(mixed, 0) << "accumulator rows that hold more than one key column";
  EXPECT_EQ(unpaired, 0) << "column pairs that are not two adjacent head dimensions";
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), int(seen.size())) << "elements not covered exactly once";
}

TEST(Sm90Layouts, DkEpilogueRows) {
  check_dk_rows<ColPassConfig<cutlass::bfloat16_t, 128, false>>();
  check_dk_rows<ColPassConfig<cutlass::half_t, 128, true>>();
}

// ldmatrix of stage s is addressed as stage 0's address + s · kPBytes, each access 16 contiguous bytes.
template <class Cfg, class Mma>
void check_stage_offsets() {
  using Element = typename Cfg::Element;
  using L = typename Cfg::SmemLayoutP;
  static Element buf[cosize_v<L>] __attribute__((aligned(1024)));
  Tensor sP = make_tensor(make_smem_ptr(buf), L{});  // (BM, BN, stage)
  Mma mma;
  auto s2r = make_tiled_copy_C(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
  int wrong = 0, split = 0;
  for (int tid = 0; tid < int(size(mma)); ++tid) {
    auto thr = s2r.get_thread_slice(tid);
    Tensor first = thr.partition_S(sP(_, _, 0));  // (CPY, CPY_M, CPY_N)
    for (int stage = 0; stage < size<2>(sP); ++stage) {
      Tensor part = thr.partition_S(sP(_, _, stage));
      for (int i = 0; i < size(part); ++i) {
        const auto* expected = reinterpret_cast<const char*>(&first(i)) + stage * Cfg::kPBytes;
        wrong += reinterpret_cast<const char*>(&part(i)) != expected;
      }
      for (int a = 0; a < size(part) / kMatrixValues; ++a) {
        for (int j = 1; j < kMatrixValues; ++j) split += &part(a * kMatrixValues + j) != &part(a * kMatrixValues) + j;
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "elements of a stage that are not stage 0's plus the stage stride";
  EXPECT_EQ(split, 0) << "ldmatrix accesses that are not 16 contiguous bytes";
}

TEST(Sm90Layouts, MatrixAccessStages) {
  using ColRecompute = ColPassConfig<cutlass::bfloat16_t, 128, false>;
  using ColSavedP = ColPassConfig<cutlass::bfloat16_t, 128, true>;
  using Rows = Config<cutlass::bfloat16_t, 128>;
  check_stage_offsets<ColRecompute, typename ColRecompute::MmaS>();
  check_stage_offsets<ColSavedP, typename ColSavedP::MmaS>();
  check_stage_offsets<Rows, typename Rows::MmaS>();
}

}  // namespace
}  // namespace qksoftmax::cuda::sm90
