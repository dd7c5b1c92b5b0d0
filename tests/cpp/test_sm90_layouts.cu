// Host-side checks of the Hopper kernels' shared-memory address arithmetic against CuTe's own tensors: where a
// kernel computes an address itself (32-bit offsets, stage strides), it must land where CuTe's partition of
// the same tile says. These run on the CPU (no GPU needed).
#include <cute/tensor.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
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
  check_dq_offsets<ColPassConfig<cutlass::bfloat16_t, 128, false, false>>();
  check_dq_offsets<ColPassConfig<cutlass::bfloat16_t, 128, true, false>>();
  check_dq_offsets<ColPassConfig<cutlass::half_t, 128, true, false>>();
}

// Two coordinates below 4096 as one int (and a stage or buffer above them).
int code(int a, int b, int s = 0) { return s << 24 | a << 12 | b; }

// The 16-bit element that half h of register j of lane t reads (ldmatrix.x4) or writes (stmatrix.x4), from
// the 32 lanes' addresses (element offsets): lane 8j + i addresses row i of matrix j, 8 contiguous values;
// lane t's register j holds (row t/4, columns 2(t%4) + h) of matrix j, or with .trans (row 2(t%4) + h,
// column t/4) (PTX ISA, ldmatrix / stmatrix). Independent of CuTe's copy traits.
int matrix_element(const int (&addr)[32], int t, int j, int h, bool trans) {
  return trans ? addr[8 * j + 2 * (t % 4) + h] + t / 4 : addr[8 * j + t / 4] + 2 * (t % 4) + h;
}

// One warp's side of a warp-wide x4 matrix copy: per lane, the element offsets of its shared-memory side and
// the codes of its register side, slot by slot; slots [8g, 8g + 8) are the g-th instruction (CuTe's copy
// peels CPY into atom calls of 8 values, the first 8 in colexicographic order first).
struct WarpCopy {
  std::vector<int> smem[32], regs[32];
  int split = 0;     // instructions whose 8 shared-memory values are not 16 contiguous, aligned bytes
  int unpaired = 0;  // register slots (2i, 2i + 1) that are not the two halves of one 32-bit register
  // The addresses of instruction g, checking the shared-memory side of each lane.
  void addresses(int g, int (&addr)[32]) {
    for (int t = 0; t < 32; ++t) {
      addr[t] = smem[t][8 * g];
      bool ok = addr[t] % 8 == 0;
      for (int v = 1; v < 8; ++v) ok = ok && smem[t][8 * g + v] == addr[t] + v;
      split += !ok;
    }
  }
  int instructions() const { return int(smem[0].size()) / 8; }
};

// Lane `lane` of a copy: its shared-memory partition (offsets from base) and register slots (codes).
template <class Element, class Smem, class Regs>
void add_lane(WarpCopy& wc, int lane, const Element* base, const Smem& smem, const Regs& regs) {
  ASSERT_EQ(int(size(smem)), int(size(regs)));
  ASSERT_EQ(int(size(smem)) % kMatrixValues, 0);
  for (int i = 0; i < size(smem); ++i) {
    wc.smem[lane].push_back(int(&smem(i) - base));
    wc.regs[lane].push_back(regs(i));
    if (i % 2 == 1) wc.unpaired += &regs(i) != &regs(i - 1) + 1;
  }
}

// Direct dQ: the column pass rounds its dQ accumulator to 16 bits and stores it by stmatrix (CuTe's STSM_N
// copy of MmadQ's accumulator, one address per 8 values: store_matrices) into the swizzled 16-bit buffer that
// the reduce-add's TMA reads. CuTe's model must give each register slot the accumulator's own coordinate, and
// stmatrix's own semantics applied to the lanes' addresses must write every (r, d) of the buffer once, with
// the accumulator value (r, d), from 16 contiguous, aligned bytes per address.
template <class Cfg>
void check_direct_dq_stores() {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  using L = typename Cfg::SmemLayoutdQ;
  static_assert(Cfg::kDirectDq && std::is_same_v<typename Cfg::DqElement, Element>, "a direct-dQ configuration");
  static Element buf[cosize_v<L>] __attribute__((aligned(1024)));
  Tensor sdQ = make_tensor(make_smem_ptr(buf), L{});  // (BM, D)
  typename Cfg::MmadQ mma_dq;
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_dq);
  std::vector<int> written(cosize_v<L>, -1);
  int model = 0, twice = 0, split = 0, unpaired = 0;
  for (int warp = 0; warp < Cfg::kThreads / 32; ++warp) {
    WarpCopy wc;
    for (int lane = 0; lane < 32; ++lane) {
      const int tid = warp * 32 + lane;
      // The accumulator's coordinates, held as the kernel's fragment holds its values.
      Tensor tdQcdQ = mma_dq.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<BM, HD>{}));  // → (r, d)
      Tensor codes = make_fragment_like<int>(partition_fragment_C(mma_dq, Shape<BM, HD>{}));
      static_assert(std::is_same_v<decltype(shape(codes)), decltype(shape(tdQcdQ))>);
      for (int i = 0; i < size(codes); ++i) codes(i) = code(get<0>(tdQcdQ(i)), get<1>(tdQcdQ(i)));
      auto thr = r2s.get_thread_slice(tid);
      Tensor src = thr.retile_S(codes);
      Tensor cS = thr.partition_S(make_identity_tensor(Shape<BM, HD>{}));  // CuTe's coordinate of each slot
      for (int i = 0; i < size(src); ++i) model += src(i) != code(get<0>(cS(i)), get<1>(cS(i)));
      add_lane(wc, lane, buf, thr.partition_D(sdQ), src);
    }
    for (int g = 0; g < wc.instructions(); ++g) {
      int addr[32];
      wc.addresses(g, addr);
      for (int t = 0; t < 32; ++t) {
        for (int v = 0; v < 8; ++v) {
          int& at = written[matrix_element(addr, t, v / 2, v % 2, false)];
          twice += at != -1;
          at = wc.regs[t][8 * g + v];
        }
      }
    }
    split += wc.split;
    unpaired += wc.unpaired;
  }
  int wrong = 0;
  for (int r = 0; r < Cfg::kBlockM; ++r) {
    for (int d = 0; d < Cfg::kHeadDim; ++d) wrong += written[&sdQ(r, d) - buf] != code(r, d);
  }
  EXPECT_EQ(model, 0) << "CuTe's model: register slots whose coordinate is not the accumulator's";
  EXPECT_EQ(twice, 0) << "buffer elements written twice";
  EXPECT_EQ(wrong, 0) << "buffer elements (r, d) that stmatrix fills with another accumulator value";
  EXPECT_EQ(split, 0) << "stmatrix rows that are not 16 contiguous, aligned bytes";
  EXPECT_EQ(unpaired, 0) << "slot pairs that are not one 32-bit register";
}

TEST(Sm90Layouts, ColumnPassDirectDqStores) {
  check_direct_dq_stores<ColPassConfig<cutlass::bfloat16_t, 128, false, true>>();
  check_direct_dq_stores<ColPassConfig<cutlass::half_t, 128, true, true>>();
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
  check_dk_rows<ColPassConfig<cutlass::bfloat16_t, 128, false, true>>();
  check_dk_rows<ColPassConfig<cutlass::half_t, 128, true, false>>();
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
  using ColRecompute = ColPassConfig<cutlass::bfloat16_t, 128, false, true>;
  using ColSavedP = ColPassConfig<cutlass::bfloat16_t, 128, true, false>;
  using Rows = Config<cutlass::bfloat16_t, 128>;
  check_stage_offsets<ColRecompute, typename ColRecompute::MmaS>();
  check_stage_offsets<ColSavedP, typename ColSavedP::MmaS>();
  check_stage_offsets<Rows, typename Rows::MmaS>();
}

}  // namespace
}  // namespace qksoftmax::cuda::sm90
