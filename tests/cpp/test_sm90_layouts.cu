// Host-side checks of the Hopper kernels' shared-memory address arithmetic against CuTe's own tensors: where a
// kernel computes an address itself (32-bit offsets, stage strides), it must land where CuTe's partition of
// the same tile says. For the key-block pass (sm90/kb_*) they also check by value which (row, key) each
// register slot of a consumer receives or stores (ldmatrix / stmatrix emulated from the PTX ISA's rules) and
// the register order of the RS wgmma's A operands, and the order in which its persistent CTAs take their tiles.
// These run on the CPU (no GPU needed).
#include <cute/tensor.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/kb_scheduler.h"
#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90_config.h"
#include "problem.h"

namespace qksoftmax::cuda::sm90 {
namespace {

using namespace cute;


// Into the fp32 accumulator the key-block pass stores each thread's dQ pairs at base + 4 · dq_offset(r, d):
// the addresses of CuTe's partition of the swizzled buffer, pairs of adjacent columns 8-byte aligned.
template <class Cfg>
void check_dq_offsets(int threads) {
  using L = typename Cfg::SmemLayoutdQ;
  static float buf[cosize_v<L>] __attribute__((aligned(1024)));
  Tensor sdQ = make_tensor(make_smem_ptr(buf), L{});  // (BM, D)
  typename Cfg::MmadQ mma_dq;
  int wrong = 0, unpaired = 0;
  for (int tid = 0; tid < threads; ++tid) {
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

// stmatrix's own semantics applied to one warp's copy: each lane's register slots (codes) written at the
// elements its lanes' addresses give, into `written` (by element offset); elements written twice counted.
void apply_stmatrix(WarpCopy& wc, std::vector<int>& written, int& twice) {
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
}

// Direct dQ: the key-block pass rounds its dQ accumulator to 16 bits and stores it by stmatrix (a copy of
// MmadQ's accumulator, one address per 8 values: store_matrices) into the swizzled 16-bit buffer that the
// reduce-add's TMA reads (check (4) below). CuTe's model must give each register slot the accumulator's own
// coordinate, and stmatrix's own semantics applied to the lanes' addresses must write every (r, d) of the buffer once, with
// the accumulator value (r, d), from 16 contiguous, aligned bytes per address.
template <class Cfg, class Copy>
void check_dq_stores(int threads) {
  using Element = typename Cfg::Element;
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  using L = typename Cfg::SmemLayoutdQ;
  static Element buf[cosize_v<L>] __attribute__((aligned(1024)));
  Tensor sdQ = make_tensor(make_smem_ptr(buf), L{});  // (BM, D)
  typename Cfg::MmadQ mma_dq;
  Copy r2s;
  std::vector<int> written(cosize_v<L>, -1);
  int model = 0, twice = 0, split = 0, unpaired = 0;
  for (int warp = 0; warp < threads / 32; ++warp) {
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
    apply_stmatrix(wc, written, twice);
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
  using Rows = Config<cutlass::bfloat16_t, 128>;
  check_stage_offsets<Rows, typename Rows::MmaS>();
}


// ---- The key-block pass (sm90/kb_*): its consumer warpgroups slice their MMAs and copies by
// threadIdx.x % 128, so every check below runs over the 128 threads of a warpgroup and both consumers w.

using KbBf16Recompute = KbConfig<cutlass::bfloat16_t, 128, false, true>;
using KbBf16SavedP = KbConfig<cutlass::bfloat16_t, 128, true, true>;
using KbFp16SavedP = KbConfig<cutlass::half_t, 128, true, true>;
using KbBf16RecomputeAccum = KbConfig<cutlass::bfloat16_t, 128, false, false>;  // dQ into the fp32 accumulator
using KbFp16SavedPAccum = KbConfig<cutlass::half_t, 128, true, false>;
constexpr int kWarpgroup = 128;

// A fragment laid out like the consumer's 16-bit copy of Sᵀ's accumulator (kb_mainloop.cuh's FragS16),
// holding at each register the code of its (key of the consumer, row) by MmaSt's partition_C of an identity
// tensor: retile_D / retile_S views of it give the coordinate that belongs in each slot of a copy.
template <class Cfg>
auto st_coords(int tid) {
  using HF = typename Cfg::HF;
  using BM = typename Cfg::BM;
  typename Cfg::MmaSt mma_s;
  using FragS = decltype(partition_fragment_C(mma_s, Shape<HF, BM>{}));
  using FragS16 = decltype(make_fragment_like<typename Cfg::Element>(FragS{}));
  Tensor frag = make_fragment_like<int>(FragS{});
  static_assert(std::is_same_v<decltype(frag.layout()), decltype(FragS16{}.layout())>);
  Tensor tScS = mma_s.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<HF, BM>{}));  // → (key, row)
  static_assert(std::is_same_v<decltype(shape(frag)), decltype(shape(tScS))>);
  for (int j = 0; j < size(frag); ++j) frag(j) = code(get<0>(tScS(j)), get<1>(tScS(j)));
  return frag;
}

// CuTe's own model of a tiled copy: the copy's partition of an identity tensor over the (HF, BM) tile gives
// each slot's tile coordinate. Register side: those coordinates must be Sᵀ's (`regs`, the retiled codes);
// shared-memory side: `smem(identity)` checks or records the elements there. Returns mismatches.
template <class Cfg, bool kLoad, class Thr, class Regs, class Smem>
int copy_model_mismatches(const Thr& thr, const Regs& regs, Smem&& smem) {
  Tensor id = make_identity_tensor(Shape<typename Cfg::HF, typename Cfg::BM>{});
  const auto count = [&](const auto& cR) {
    int bad = 0;
    for (int i = 0; i < size(cR); ++i) bad += regs(i) != code(get<0>(cR(i)), get<1>(cR(i)));
    return bad;
  };
  if constexpr (kLoad) {
    return count(thr.partition_D(id)) + smem(id);
  } else {
    return count(thr.partition_S(id)) + smem(id);
  }
}

// (1) dPᵀ and Pᵀ by ldmatrix.trans: TMA leaves (row, key) of the step's tile at SmemLayoutP(row, key, stage);
// consumer w copies with CopyS2R from partition_S of consumer_keys(SmemLayoutPt view (_, _, stage), w) into
// retile_D of its FragS16. Each register slot must receive (row, 64w + key) for the (key, row) that Sᵀ's
// partition_C gives the slot: by CuTe's model (the copy's partitions of an identity tensor: partition_S's
// coordinates hold their (row, key), partition_D's are Sᵀ's) and by ldmatrix.trans's own semantics applied to
// the lanes' addresses (which also catches rows that are not 16 contiguous bytes, which CuTe's model misses).
template <class Cfg>
void check_kb_ldsm_t() {
  using Element = typename Cfg::Element;
  using L = typename Cfg::SmemLayoutP;
  constexpr int kSize = int(cosize_v<L>);
  static Element buf[kSize] __attribute__((aligned(1024)));
  std::vector<int> held(kSize, -1);
  Tensor sP = make_tensor(make_smem_ptr(buf), L{});  // (BM, BN, ST), as TMA writes it
  for (int s = 0; s < size<2>(sP); ++s) {
    for (int r = 0; r < Cfg::kBlockM; ++r) {
      for (int k = 0; k < Cfg::kBlockN; ++k) held[&sP(r, k, s) - buf] = code(r, k, s);
    }
  }
  Tensor sPt = make_tensor(make_smem_ptr(buf), typename Cfg::SmemLayoutPt{});  // (BN, BM, ST)
  typename Cfg::CopyS2R s2r;
  const auto expected = [](int slot, int w, int s) {  // slot: code(key, row) → code(row, 64w + key, s)
    return code(slot & 4095, Cfg::kHalf * w + (slot >> 12), s);
  };
  int model = 0, hardware = 0, split = 0, unpaired = 0, slots = 0;
  for (int w = 0; w < Cfg::kConsumers; ++w) {
    for (int s = 0; s < size<2>(sPt); ++s) {
      for (int warp = 0; warp < kWarpgroup / 32; ++warp) {
        WarpCopy wc;
        for (int lane = 0; lane < 32; ++lane) {
          auto thr = s2r.get_thread_slice(warp * 32 + lane);
          auto frag = st_coords<Cfg>(warp * 32 + lane);
          add_lane(wc, lane, buf, thr.partition_S(Cfg::consumer_keys(sPt(_, _, s), w)), thr.retile_D(frag));
          model += copy_model_mismatches<Cfg, true>(thr, thr.retile_D(frag), [&](auto id) {
            Tensor src = thr.partition_S(Cfg::consumer_keys(sPt(_, _, s), w));
            Tensor cS = thr.partition_S(id);
            int bad = 0;
            for (int i = 0; i < size(src); ++i) {
              bad += held[&src(i) - buf] != expected(code(get<0>(cS(i)), get<1>(cS(i))), w, s);
            }
            return bad;
          });
        }
        for (int g = 0; g < wc.instructions(); ++g) {
          int addr[32];
          wc.addresses(g, addr);
          for (int t = 0; t < 32; ++t) {
            for (int v = 0; v < 8; ++v, ++slots) {
              hardware += held[matrix_element(addr, t, v / 2, v % 2, true)] != expected(wc.regs[t][8 * g + v], w, s);
            }
          }
        }
        split += wc.split;
        unpaired += wc.unpaired;
      }
    }
  }
  EXPECT_EQ(slots, Cfg::kConsumers * Cfg::kStages * Cfg::kHalf * Cfg::kBlockM) << "slots loaded";
  EXPECT_EQ(model, 0) << "CuTe's model: partition_S elements not at their tile coordinate, or partition_D "
                          "coordinates that are not Sᵀ's";
  EXPECT_EQ(hardware, 0) << "slots that ldmatrix.trans fills with another (row, key) than Sᵀ's coordinate";
  EXPECT_EQ(split, 0) << "ldmatrix rows that are not 16 contiguous, aligned bytes";
  EXPECT_EQ(unpaired, 0) << "slot pairs that are not one 32-bit register";
}

TEST(Sm90Layouts, KeyBlockTransposedLoads) {
  check_kb_ldsm_t<KbBf16Recompute>();
  check_kb_ldsm_t<KbBf16SavedP>();
  check_kb_ldsm_t<KbFp16SavedP>();
}

// (2) dSᵀ by stmatrix.trans: consumer w copies with CopyR2S from retile_S of its FragS16 into partition_D of
// consumer_keys(SmemLayoutdSt2 view (_, _, buffer), w); the dQ product then reads the buffer as SmemLayoutdS2
// (rows, keys). Each (row, key) of each buffer must be written exactly once, with the value of Sᵀ's
// coordinate (key − 64w, row) of consumer w: by CuTe's model and by the instruction's semantics.
template <class Cfg>
void check_kb_stsm_t() {
  using Element = typename Cfg::Element;
  using L = typename Cfg::SmemLayoutdS2;
  constexpr int kSize = int(cosize_v<L>);
  static Element buf[kSize] __attribute__((aligned(1024)));
  std::vector<int> model(kSize, -1), hardware(kSize, -1);
  Tensor sdSt = make_tensor(make_smem_ptr(buf), typename Cfg::SmemLayoutdSt2{});  // (BN, BM, DB)
  typename Cfg::CopyR2S r2s;
  const auto value = [](int slot, int w, int b) { return code(slot & 4095, Cfg::kHalf * w + (slot >> 12), b); };
  int twice = 0, split = 0, unpaired = 0, model_slots = 0;
  for (int b = 0; b < Cfg::kBuffers; ++b) {
    for (int w = 0; w < Cfg::kConsumers; ++w) {
      for (int warp = 0; warp < kWarpgroup / 32; ++warp) {
        WarpCopy wc;
        for (int lane = 0; lane < 32; ++lane) {
          auto thr = r2s.get_thread_slice(warp * 32 + lane);
          auto frag = st_coords<Cfg>(warp * 32 + lane);
          add_lane(wc, lane, buf, thr.partition_D(Cfg::consumer_keys(sdSt(_, _, b), w)), thr.retile_S(frag));
          model_slots += copy_model_mismatches<Cfg, false>(thr, thr.retile_S(frag), [&](auto id) {
            Tensor dst = thr.partition_D(Cfg::consumer_keys(sdSt(_, _, b), w));
            Tensor cD = thr.partition_D(id);
            for (int i = 0; i < size(dst); ++i) {
              int& at = model[&dst(i) - buf];
              twice += at != -1;
              at = value(code(get<0>(cD(i)), get<1>(cD(i))), w, b);
            }
            return 0;
          });
        }
        for (int g = 0; g < wc.instructions(); ++g) {
          int addr[32];
          wc.addresses(g, addr);
          for (int t = 0; t < 32; ++t) {
            for (int v = 0; v < 8; ++v) {
              int& at = hardware[matrix_element(addr, t, v / 2, v % 2, true)];
              twice += at != -1;
              at = value(wc.regs[t][8 * g + v], w, b);
            }
          }
        }
        split += wc.split;
        unpaired += wc.unpaired;
      }
    }
  }
  Tensor sdS = make_tensor(make_smem_ptr(buf), L{});  // (BM, BN, DB), the dQ product's A operand
  int model_wrong = 0, hardware_wrong = 0;
  for (int b = 0; b < Cfg::kBuffers; ++b) {
    for (int r = 0; r < Cfg::kBlockM; ++r) {
      for (int k = 0; k < Cfg::kBlockN; ++k) {
        model_wrong += model[&sdS(r, k, b) - buf] != code(r, k, b);
        hardware_wrong += hardware[&sdS(r, k, b) - buf] != code(r, k, b);
      }
    }
  }
  EXPECT_EQ(twice, 0) << "dS elements written twice";
  EXPECT_EQ(model_slots, 0) << "CuTe's model: partition_S coordinates that are not Sᵀ's";
  EXPECT_EQ(model_wrong, 0) << "CuTe's model: dS (row, key) whose partition_D element is another coordinate";
  EXPECT_EQ(hardware_wrong, 0) << "dS (row, key) that stmatrix.trans fills with another coordinate";
  EXPECT_EQ(split, 0) << "stmatrix rows that are not 16 contiguous, aligned bytes";
  EXPECT_EQ(unpaired, 0) << "slot pairs that are not one 32-bit register";
}

TEST(Sm90Layouts, KeyBlockTransposedDsStores) {
  check_kb_stsm_t<KbBf16Recompute>();
  check_kb_stsm_t<KbBf16SavedP>();
  check_kb_stsm_t<KbFp16SavedP>();
}

// (3) dK += dSᵀ Q from registers: the kernel views FragS16 (dSᵀ, Sᵀ's accumulator layout) through
// acc_as_operand_a as MmadK's A operand ((2, 2, 2), 1, BM/16). Each (value, k-block) must hold the
// (key, row) that MmadK's partition_A gives it (M = keys, K = rows), value pairs must be 32-bit registers
// (as the RS wgmma takes them), and k-block kb of both A and B (Q as (d, rows)) must be rows [16 kb, 16 kb + 16).
template <class Cfg>
void check_kb_dst_operand() {
  using HF = typename Cfg::HF;
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  typename Cfg::MmadK mma_dk;
  int wrong = 0, unpaired = 0, kblocks = 0;
  for (int tid = 0; tid < kWarpgroup; ++tid) {
    auto frag = st_coords<Cfg>(tid);
    Tensor tdKrdS = make_tensor(frag.data(), acc_as_operand_a(frag.layout()));  // as the kernel
    auto thr = mma_dk.get_thread_slice(tid);
    Tensor tdKcA = thr.partition_A(make_identity_tensor(Shape<HF, BM>{}));  // (MMA, 1, BM/16) → (key, row)
    Tensor tdKcB = thr.partition_B(make_identity_tensor(Shape<HD, BM>{}));  // (MMA, 1, BM/16) → (d, row)
    ASSERT_EQ(int(size(tdKrdS)), int(size(tdKcA)));
    ASSERT_EQ(int(size<0>(tdKrdS)), int(size<0>(tdKcA)));
    ASSERT_EQ(int(size<2>(tdKrdS)), int(size<2>(tdKcA)));
    ASSERT_EQ(int(size<2>(tdKcB)), int(size<2>(tdKcA)));
    for (int kb = 0; kb < size<2>(tdKcA); ++kb) {
      for (int m = 0; m < size<1>(tdKcA); ++m) {
        for (int v = 0; v < size<0>(tdKcA); ++v) {
          const auto c = tdKcA(v, m, kb);
          wrong += tdKrdS(v, m, kb) != code(get<0>(c), get<1>(c));
          if (v % 2 == 1) unpaired += &tdKrdS(v, m, kb) != &tdKrdS(v - 1, m, kb) + 1;
          kblocks += int(get<1>(c)) / 16 != kb;
        }
      }
      for (int n = 0; n < size<1>(tdKcB); ++n) {
        for (int v = 0; v < size<0>(tdKcB); ++v) kblocks += int(get<1>(tdKcB(v, n, kb))) / 16 != kb;
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "A-operand values whose register holds another (key, row) of dSᵀ";
  EXPECT_EQ(unpaired, 0) << "A-operand value pairs that are not one 32-bit register";
  EXPECT_EQ(kblocks, 0) << "A or B values of k-block kb outside rows [16 kb, 16 kb + 16)";
}

TEST(Sm90Layouts, KeyBlockDsOperand) {
  check_kb_dst_operand<KbBf16Recompute>();
  check_kb_dst_operand<KbFp16SavedP>();
}

// The element-wise step walks Sᵀ's accumulator as (keys, rows) (rowcol) and reads LSE·log2e and D of the row
// of column ci once for all keys: each column must be one row; and kb_store_dk stores dK pairs (i, i + 1)
// as two adjacent head dimensions of one key. Both cover their tile exactly once per consumer.
template <class Cfg>
void check_kb_rowcol() {
  using HF = typename Cfg::HF;
  using BM = typename Cfg::BM;
  using HD = typename Cfg::HD;
  typename Cfg::MmaSt mma_s;
  typename Cfg::MmadK mma_dk;
  std::vector<int> seen_s(Cfg::kHalf * Cfg::kBlockM, 0), seen_dk(Cfg::kHalf * Cfg::kHeadDim, 0);
  int mixed = 0, unpaired = 0;
  for (int tid = 0; tid < kWarpgroup; ++tid) {
    Tensor tScS = mma_s.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<HF, BM>{}));
    Tensor rc = make_tensor(tScS.data(), rowcol(tScS.layout()));  // (keys, rows) → (key, row)
    for (int ci = 0; ci < size<1>(rc); ++ci) {
      for (int ki = 0; ki < size<0>(rc); ++ki) {
        const int key = get<0>(rc(ki, ci)), row = get<1>(rc(ki, ci));
        mixed += row != get<1>(rc(0, ci)) || key != get<0>(rc(ki, 0));
        ++seen_s[key * Cfg::kBlockM + row];
      }
    }
    Tensor tdKcdK = mma_dk.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<HF, HD>{}));
    for (int i = 0; i < size(tdKcdK); i += 2) {
      const int c = get<0>(tdKcdK(i)), d = get<1>(tdKcdK(i));
      unpaired += get<0>(tdKcdK(i + 1)) != c || get<1>(tdKcdK(i + 1)) != d + 1;
      ++seen_dk[c * Cfg::kHeadDim + d];
      ++seen_dk[c * Cfg::kHeadDim + d + 1];
    }
  }
  EXPECT_EQ(mixed, 0) << "Sᵀ (keys, rows) columns that hold more than one row, or rows more than one key";
  EXPECT_EQ(unpaired, 0) << "dK pairs that are not two adjacent head dimensions of one key";
  EXPECT_EQ(std::count(seen_s.begin(), seen_s.end(), 1), int(seen_s.size())) << "Sᵀ not covered once";
  EXPECT_EQ(std::count(seen_dk.begin(), seen_dk.end(), 1), int(seen_dk.size())) << "dK not covered once";
}

TEST(Sm90Layouts, KeyBlockAccumulatorWalks) {
  check_kb_rowcol<KbBf16Recompute>();
  check_kb_rowcol<KbFp16SavedP>();
}

// (4) dQ by stmatrix: the consumer whose turn a step is rounds its MmadQ accumulator (all of (BM, D)) and
// stores it with CopydQ into its staging buffer, which the reduce-add's TMA reads as SmemLayoutdQ. CuTe's
// model must give each register slot the accumulator's coordinate, and stmatrix's own semantics applied to the
// lanes' addresses must write every (r, d) once with the value (r, d), 16 contiguous, aligned bytes per address.
template <class Cfg>
void check_kb_dq_stores() {
  check_dq_stores<Cfg, typename Cfg::CopydQ>(kWarpgroup);
}

TEST(Sm90Layouts, KeyBlockDqStores) {
  check_kb_dq_stores<KbBf16Recompute>();
  check_kb_dq_stores<KbFp16SavedP>();
  // Into the fp32 accumulator: pairs at dq_offset, by the one consumer whose turn the step is.
  check_dq_offsets<KbBf16RecomputeAccum>(kWarpgroup);
  check_dq_offsets<KbFp16SavedPAccum>(kWarpgroup);
}

// The pingpong single pass's one-register addresses (SpPpConfig::matrix_address): the consumers' ldmatrix of dP
// from slot 0 of its ring (SmemLayoutP), their stmatrix of dS into buffer 0 (SmemLayoutdS2) and of dQ into its
// staging tile (SmemLayoutdQ), and the dK warpgroup's stmatrix of dK into its K buffer (SmemLayoutK, as TMA stores
// it). Access a of row half m takes slots [8a, 8a + 8) of the copy's (CPY, m, 0) (its retile_D for a load,
// retile_S for a store). Those addresses must be CuTe's partition of the tile (partition_S for a load,
// partition_D for a store; slot 0 sliced from the tensor, as the kernel does, so that the swizzle stays on the
// pointer), CuTe's model must give each slot the accumulator's own coordinate, and the x4 semantics (ldmatrix and
// stmatrix address alike) applied to the lanes' addresses must reach every (row, column) of the tile once, with
// the accumulator's value (row, column).
template <class Cfg, class Mma, class Copy, class L, bool kLoad>
void check_matrix_addresses(const char* what) {
  SCOPED_TRACE(what);
  using Element = typename Cfg::Element;
  constexpr int kTileRows = decltype(size<0>(L{}))::value;
  constexpr int kTileCols = decltype(size<1>(L{}))::value;
  using Shape2 = Shape<Int<kTileRows>, Int<kTileCols>>;  // (rows, columns)
  static Element buf[cosize_v<L>] __attribute__((aligned(1024)));
  const auto tile = [&] {  // (rows, columns): the tile, or slot 0 of a ring of them
    Tensor t = make_tensor(make_smem_ptr(buf), L{});
    if constexpr (rank_v<L> == 3) {
      return t(_, _, 0);
    } else {
      return t;
    }
  }();
  Mma mma;
  Copy copy;
  std::vector<int> written(cosize_v<L>, -1);
  int model = 0, addresses = 0, twice = 0, split = 0, unpaired = 0;
  for (int warp = 0; warp < kWarpgroup / 32; ++warp) {
    WarpCopy wc;
    for (int lane = 0; lane < 32; ++lane) {
      const int tid = warp * 32 + lane;
      Tensor tCcC = mma.get_thread_slice(tid).partition_C(make_identity_tensor(Shape2{}));  // → (row, column)
      Tensor codes = make_fragment_like<int>(partition_fragment_C(mma, Shape2{}));
      static_assert(std::is_same_v<decltype(shape(codes)), decltype(shape(tCcC))>);
      for (int i = 0; i < size(codes); ++i) codes(i) = code(get<0>(tCcC(i)), get<1>(tCcC(i)));
      auto thr = copy.get_thread_slice(tid);
      const auto regs = [&](auto&& t) {  // (CPY, CPY_M, CPY_N): the registers' side of the copy
        if constexpr (kLoad) {
          return thr.retile_D(t);
        } else {
          return thr.retile_S(t);
        }
      };
      const auto smem = [&](auto&& t) {  // (CPY, CPY_M, CPY_N): the tile's side
        if constexpr (kLoad) {
          return thr.partition_S(t);
        } else {
          return thr.partition_D(t);
        }
      };
      const auto coords = [&](auto&& t) {  // CuTe's coordinate of each register slot
        if constexpr (kLoad) {
          return thr.partition_D(t);
        } else {
          return thr.partition_S(t);
        }
      };
      Tensor src = regs(codes);
      Tensor cS = coords(make_identity_tensor(Shape2{}));
      for (int i = 0; i < size(src); ++i) model += src(i) != code(get<0>(cS(i)), get<1>(cS(i)));
      Tensor part = smem(tile);
      ASSERT_EQ(int(size<0>(src)), kMatrixValues * Cfg::kMatrixAccesses);
      ASSERT_EQ(int(size<1>(src)), kTileRows / Cfg::kBlockM);
      ASSERT_EQ(int(size<2>(src)), 1);
      const uint32_t first = Cfg::matrix_first(tid);
      for (int m = 0; m < size<1>(src); ++m) {
        for (int a = 0; a < Cfg::kMatrixAccesses; ++a) {
          const uint32_t at = Cfg::template matrix_address<kTileRows>(first, a, m);
          addresses += at != uint32_t(reinterpret_cast<const char*>(&part(a * kMatrixValues, m, 0)) -
                                      reinterpret_cast<const char*>(buf));
          for (int v = 0; v < kMatrixValues; ++v) {
            const int i = a * kMatrixValues + v;
            wc.smem[lane].push_back(int(at / sizeof(Element)) + v);
            wc.regs[lane].push_back(src(i, m, 0));
            if (v % 2 == 1) unpaired += &src(i, m, 0) != &src(i - 1, m, 0) + 1;
          }
        }
      }
    }
    apply_stmatrix(wc, written, twice);
    split += wc.split;
  }
  int wrong = 0;
  for (int r = 0; r < kTileRows; ++r) {
    for (int c = 0; c < kTileCols; ++c) wrong += written[&tile(r, c) - buf] != code(r, c);
  }
  EXPECT_EQ(addresses, 0) << "matrix_address: accesses not at CuTe's partition of the tile";
  EXPECT_EQ(model, 0) << "CuTe's model: register slots whose coordinate is not the accumulator's";
  EXPECT_EQ(twice, 0) << "tile elements reached twice";
  EXPECT_EQ(wrong, 0) << "tile elements (row, column) that the accesses pair with another accumulator value";
  EXPECT_EQ(split, 0) << "x4 rows that are not 16 contiguous, aligned bytes";
  EXPECT_EQ(unpaired, 0) << "slot pairs that are not one 32-bit register";
}

template <class Cfg>
void check_sp_matrix_addresses() {
  check_matrix_addresses<Cfg, typename Cfg::MmaS, typename Cfg::CopydP, typename Cfg::SmemLayoutP, true>("dP");
  check_matrix_addresses<Cfg, typename Cfg::MmaS, typename Cfg::CopydS, typename Cfg::SmemLayoutdS2, false>("dS");
  check_matrix_addresses<Cfg, typename Cfg::MmadQ, typename Cfg::CopydQ, typename Cfg::SmemLayoutdQ, false>(
      "dQ staging");
  check_matrix_addresses<Cfg, typename Cfg::MmadKAll, typename Cfg::CopydK, typename Cfg::SmemLayoutK, false>(
      "dK staging");
}

TEST(Sm90Layouts, MatrixAddresses) {
  check_sp_matrix_addresses<SpPpConfig<cutlass::bfloat16_t, 128, true, 1>>();
  check_sp_matrix_addresses<SpPpConfig<cutlass::half_t, 128, true, 8>>();
}

// The pingpong single pass's element-wise view of S (SpPpSoftmax's RowCol: a thread's (rows, keys) of the (64, 128)
// block): a row's values (ci, ci + 1), ci even, must be adjacent in the fragment from an even index, one 32-bit pair
// of a 16-bit fragment (SpPpSoftmax::value reads bf16 dP's values so).
TEST(Sm90Layouts, SoftmaxValueOrder) {
  using Cfg = SpPpConfig<cutlass::bfloat16_t, 128, true, 1>;
  using Shape2 = Shape<typename Cfg::BM, typename Cfg::BN>;
  typename Cfg::MmaS mma;
  const auto rc = rowcol(partition_fragment_C(mma, Shape2{}).layout());  // (rows, keys) → fragment index
  ASSERT_EQ(size(rc), 64);
  int unpaired = 0;
  for (int ri = 0; ri < size<0>(rc); ++ri) {
    for (int ci = 0; ci < size<1>(rc); ci += 2) unpaired += rc(ri, ci) % 2 != 0 || rc(ri, ci + 1) != rc(ri, ci) + 1;
  }
  EXPECT_EQ(unpaired, 0) << "a row's value pairs that are not one 32-bit pair of a 16-bit fragment";
}

// (5) K_w as Sᵀ's register A operand: CopyKA (ldmatrix) from consumer w's (HF, D) part of K, as TMA wrote it,
// into MmaSt's partition_fragment_A. Each register slot must receive K(64w + key, d) for the (key, d) that
// MmaSt's partition_A gives the slot, by CuTe's model and by ldmatrix's own semantics; value pairs must be
// 32-bit registers.
template <class Cfg>
void check_kb_k_operand() {
  using Element = typename Cfg::Element;
  using HF = typename Cfg::HF;
  using HD = typename Cfg::HD;
  using L = typename Cfg::SmemLayoutK;
  static Element buf[cosize_v<L>] __attribute__((aligned(1024)));
  std::vector<int> held(cosize_v<L>, -1);
  Tensor sK = make_tensor(make_smem_ptr(buf), L{});  // (BN, D), as TMA writes it
  for (int k = 0; k < Cfg::kBlockN; ++k) {
    for (int d = 0; d < Cfg::kHeadDim; ++d) held[&sK(k, d) - buf] = code(k, d);
  }
  typename Cfg::MmaSt mma_s;
  typename Cfg::CopyKA s2r;
  int model = 0, hardware = 0, split = 0, unpaired = 0, slots = 0;
  for (int w = 0; w < Cfg::kConsumers; ++w) {
    Tensor sKw = local_tile(sK, Shape<HF, HD>{}, make_coord(w, 0));  // (HF, D), as the kernel
    for (int warp = 0; warp < kWarpgroup / 32; ++warp) {
      WarpCopy wc;
      for (int lane = 0; lane < 32; ++lane) {
        const int tid = warp * 32 + lane;
        Tensor tScA = mma_s.get_thread_slice(tid).partition_A(make_identity_tensor(Shape<HF, HD>{}));  // → (key, d)
        Tensor codes = make_fragment_like<int>(mma_s.get_thread_slice(tid).partition_fragment_A(sKw).layout());
        ASSERT_EQ(int(size(codes)), int(size(tScA)));
        for (int i = 0; i < size(codes); ++i) codes(i) = code(Cfg::kHalf * w + get<0>(tScA(i)), get<1>(tScA(i)));
        auto thr = s2r.get_thread_slice(tid);
        Tensor src = thr.partition_S(sKw);
        Tensor dst = thr.retile_D(codes);
        add_lane(wc, lane, buf, src, dst);
        Tensor cD = thr.partition_D(make_identity_tensor(Shape<HF, HD>{}));  // CuTe's coordinate of each slot
        for (int i = 0; i < size(dst); ++i) model += dst(i) != code(Cfg::kHalf * w + get<0>(cD(i)), get<1>(cD(i)));
      }
      for (int g = 0; g < wc.instructions(); ++g) {
        int addr[32];
        wc.addresses(g, addr);
        for (int t = 0; t < 32; ++t) {
          for (int v = 0; v < 8; ++v, ++slots) {
            hardware += held[matrix_element(addr, t, v / 2, v % 2, false)] != wc.regs[t][8 * g + v];
          }
        }
      }
      split += wc.split;
      unpaired += wc.unpaired;
    }
  }
  EXPECT_EQ(slots, Cfg::kConsumers * Cfg::kHalf * Cfg::kHeadDim) << "slots loaded";
  EXPECT_EQ(model, 0) << "CuTe's model: register slots given another (key, d) of K than MmaSt's A coordinate";
  EXPECT_EQ(hardware, 0) << "register slots that ldmatrix fills with another (key, d) than MmaSt's A coordinate";
  EXPECT_EQ(split, 0) << "ldmatrix rows that are not 16 contiguous, aligned bytes";
  EXPECT_EQ(unpaired, 0) << "slot pairs that are not one 32-bit register";
}

TEST(Sm90Layouts, KeyBlockKOperand) {
  check_kb_k_operand<KbBf16Recompute>();
  check_kb_k_operand<KbFp16SavedP>();
}

// (6) The shared-memory arithmetic the key-block pass does by hand: the dQ buffers follow one another (the
// dQ warp and the consumers each take buffer b as dq[b]) and the rows slots as rows[0] + stage · sizeof(rows[0]) + 8 r (ld.shared.v2:
// 8-byte aligned); the swizzled tiles start on 1024-byte boundaries; the stage pipeline expects kStageBytes
// per stage and K's barrier kKBytes: the bytes of the TMA boxes (whole boxes, also where cut by Sq or Sk).
template <class Cfg>
void check_kb_storage() {
  using St = typename Cfg::Storage;
  using Element = typename Cfg::Element;
  alignas(St) static unsigned char raw[sizeof(St)];  // (Storage has no constructor: only its addresses are used)
  St& st = *reinterpret_cast<St*>(raw);
  const auto off = [&](const void* p) {
    return int(reinterpret_cast<const char*>(p) - reinterpret_cast<const char*>(&st));
  };
  EXPECT_EQ(alignof(St) % 1024, 0u);
  for (const void* tile : {static_cast<const void*>(st.q.data()), static_cast<const void*>(st.k.data()),
                           static_cast<const void*>(st.dp.data()), static_cast<const void*>(st.p.data()),
                           static_cast<const void*>(st.ds.data()), static_cast<const void*>(st.dq[0].data()),
                           static_cast<const void*>(st.dq[1].data())}) {
    EXPECT_EQ(off(tile) % 1024, 0) << "a swizzled tile off a 1024-byte boundary";
  }
  for (int b = 0; b < Cfg::kBuffers; ++b) {
    EXPECT_EQ(off(st.dq[b].data()), off(st.dq[0].data()) + b * int(sizeof(st.dq[0])));
  }
  for (int s = 0; s < Cfg::kStages; ++s) {
    for (int r = 0; r < Cfg::kBlockM; ++r) {
      const int at = off(&st.rows[0][0]) + s * int(sizeof(st.rows[0])) + r * int(sizeof(float2));
      EXPECT_EQ(off(&st.rows[s][r]), at);
      EXPECT_EQ(at % 8, 0);
    }
  }
  using QBox = decltype(typename Cfg::SmemLayoutQ{}(_, _, 0));
  using PBox = decltype(typename Cfg::SmemLayoutP{}(_, _, 0));
  constexpr int kQBox = int(size(QBox{})) * int(sizeof(Element));
  constexpr int kPBox = int(size(PBox{})) * int(sizeof(Element));
  EXPECT_EQ(kQBox, Cfg::kBlockM * Cfg::kHeadDim * int(sizeof(Element)));
  EXPECT_EQ(kPBox, Cfg::kBlockM * Cfg::kBlockN * int(sizeof(Element)));
  EXPECT_EQ(int(Cfg::kStageBytes), kQBox + kPBox * (Cfg::kSavedP ? 2 : 1)) << "stage transaction bytes";
  EXPECT_EQ(int(Cfg::kKBytes), int(size(typename Cfg::SmemLayoutK{})) * int(sizeof(Element))) << "K bytes";
  // Every stage's tiles inside their arrays (the stage modes of the layouts are whole tiles apart).
  EXPECT_EQ(int(cosize_v<typename Cfg::SmemLayoutQ>), Cfg::kStages * kQBox / int(sizeof(Element)));
  EXPECT_EQ(int(cosize_v<typename Cfg::SmemLayoutP>), Cfg::kStages * kPBox / int(sizeof(Element)));
  EXPECT_EQ(int(sizeof(st.dq[0])), Cfg::kBlockM * Cfg::kHeadDim * int(sizeof(typename Cfg::DqElement)));
  EXPECT_LE(Cfg::kSmemBytes, 227 * 1024);
  // K buffer b is TMA's K tile (SmemLayoutK) b whole tiles on, each in st.k and on a 1024-byte boundary.
  using KB = typename Cfg::SmemLayoutKB;
  using K = typename Cfg::SmemLayoutK;
  static_assert(decltype(rank(KB{}))::value == 3 && int(size<2>(KB{})) == Cfg::kKBuffers);
  EXPECT_EQ(int(cosize_v<KB>), Cfg::kKBuffers * int(cosize_v<K>));
  EXPECT_EQ(int(sizeof(st.k)), int(cosize_v<KB>) * int(sizeof(Element)));
  int moved = 0, transposed = 0;
  for (int b = 0; b < Cfg::kKBuffers; ++b) {
    EXPECT_EQ(int(KB{}(0, 0, b)) * int(sizeof(Element)) % 1024, 0) << "a K buffer off a 1024-byte boundary";
    for (int k = 0; k < Cfg::kBlockN; ++k) {
      for (int d = 0; d < Cfg::kHeadDim; ++d) {
        moved += int(KB{}(k, d, b)) != int(K{}(k, d)) + b * int(cosize_v<K>);
        transposed += int(typename Cfg::SmemLayoutKtB{}(d, k, b)) != int(KB{}(k, d, b));
      }
    }
  }
  EXPECT_EQ(moved, 0) << "K buffer elements that are not K's tile a whole number of tiles on";
  EXPECT_EQ(transposed, 0) << "elements of K's transposed view that are not those of K";
}

TEST(Sm90Layouts, KeyBlockStorage) {
  check_kb_storage<KbBf16Recompute>();
  check_kb_storage<KbBf16SavedP>();
  check_kb_storage<KbFp16SavedP>();
  check_kb_storage<KbBf16RecomputeAccum>();
  check_kb_storage<KbFp16SavedPAccum>();
  // With 16-bit dQ staging two K buffers fit (the next tile's K loads under the current tile), with the
  // accumulator's fp32 staging one.
  EXPECT_EQ(KbBf16Recompute::kKBuffers, 2);
  EXPECT_EQ(KbBf16SavedP::kKBuffers, 2);
  EXPECT_EQ(KbBf16RecomputeAccum::kKBuffers, 1);
  EXPECT_EQ(KbFp16SavedPAccum::kKBuffers, 1);
}

// (7) The persistent key-block pass's tiles (kb_scheduler.h): the order takes every (batch, key head, key block)
// once; the sections of heads are contiguous, within the L2 budget unless one head alone exceeds it, as few as
// that allows and of equal width (±1); within a section the order is longest first (steps never grow); and the
// counter's claims, made by the CTAs in any order, hand every tile out once and then the end of work to each.
struct KbShape {
  int64_t B, Hq, Hk, Sq, Sk;
  Mask mask;
};

KbBf16Recompute::TileOrder kb_tile_order(const KbShape& shape, int64_t head_bytes) {
  Problem prob;
  prob.pass = Pass::kBackward;
  prob.B = shape.B, prob.Hq = shape.Hq, prob.Hk = shape.Hk, prob.Sq = shape.Sq, prob.Sk = shape.Sk;
  prob.mask = shape.mask;
  return KbBf16Recompute::TileOrder::of(prob, head_bytes);
}

void check_kb_tile_order(const KbShape& shape, int64_t head_bytes) {
  using Order = KbBf16Recompute::TileOrder;
  const Order order = kb_tile_order(shape, head_bytes);
  const int key_blocks = int((shape.Sk + KbBf16Recompute::kBlockN - 1) / KbBf16Recompute::kBlockN);
  const int heads = int(shape.B * shape.Hk);
  ASSERT_EQ(order.tiles(), key_blocks * heads);

  // The sections: `wide_sections` of `section` heads, then ones of section − 1, covering the heads.
  ASSERT_GE(order.section, 1);
  ASSERT_TRUE(order.wide_sections >= 1 && order.wide_sections * order.section <= heads);
  const int narrow = order.section - 1;
  const int rest = heads - order.wide_sections * order.section;
  ASSERT_TRUE(rest == 0 || (narrow > 0 && rest % narrow == 0));
  const int sections = order.wide_sections + (rest == 0 ? 0 : rest / narrow);
  if (order.section > 1) EXPECT_LE(order.section * head_bytes, kKbSectionL2Bytes) << "a section past L2's budget";
  const int64_t widest = std::max<int64_t>(1, std::min<int64_t>(heads, kKbSectionL2Bytes / head_bytes));
  EXPECT_EQ(sections, (heads + widest - 1) / widest) << "more sections than the budget needs";
  std::vector<int> section_of(size_t(heads), 0);
  for (int s = 0, first = 0; s < sections; first += s < order.wide_sections ? order.section : narrow, ++s) {
    for (int h = first; h < first + (s < order.wide_sections ? order.section : narrow); ++h) section_of[size_t(h)] = s;
  }

  // Every tile once in the order.
  std::vector<int> taken(size_t(order.tiles()), 0);
  for (int i = 0; i < order.tiles(); ++i) {
    const KbTile tile = order.tile(i);
    ASSERT_TRUE(tile.b >= 0 && tile.b < shape.B && tile.kv_head >= 0 && tile.kv_head < shape.Hk && tile.nb >= 0 &&
                tile.nb < key_blocks);
    ++taken[size_t((int64_t(tile.b) * shape.Hk + tile.kv_head) * key_blocks + tile.nb)];
  }
  EXPECT_EQ(std::count(taken.begin(), taken.end(), 1), int64_t(order.tiles())) << "tiles not in the order once";

  // Sections one after the other, longest first within each, against the steps counted here from the mask.
  const int row_blocks = int((shape.Sq + KbBf16Recompute::kBlockM - 1) / KbBf16Recompute::kBlockM);
  const auto steps_of = [&](int nb) {
    int first = 0;
    if (shape.mask == Mask::kCausal) {
      first = int(std::min<int64_t>(int64_t(nb) * KbBf16Recompute::kBlockN / KbBf16Recompute::kBlockM, row_blocks));
    }
    return (row_blocks - first) * int(shape.Hq / shape.Hk);
  };
  int growing = 0, wrong_steps = 0, back = 0;
  for (int i = 0; i < order.tiles(); ++i) {
    const KbTile tile = order.tile(i);
    wrong_steps += order.steps(tile.nb) != steps_of(tile.nb);
    if (i > 0) {
      const KbTile prev = order.tile(i - 1);
      const int s = section_of[size_t(tile.b * shape.Hk + tile.kv_head)];
      const int prev_s = section_of[size_t(prev.b * shape.Hk + prev.kv_head)];
      back += s < prev_s || s > prev_s + 1;
      growing += s == prev_s && steps_of(tile.nb) > steps_of(prev.nb);
    }
  }
  EXPECT_EQ(wrong_steps, 0) << "tiles whose step count differs from the mask's";
  EXPECT_EQ(back, 0) << "sections not taken one after the other";
  EXPECT_EQ(growing, 0) << "tiles of a section with more steps than the one before";
}

TEST(Sm90Layouts, KeyBlockTileOrder) {
  constexpr int64_t kMiB = int64_t(1) << 20;
  // B8·H128·S1024 causal, direct dQ: 0.5 MB of Q and dQ per head, 64 sections of 16 heads.
  check_kb_tile_order({8, 128, 128, 1024, 1024, Mask::kCausal}, kMiB / 2);
  // Without the mask, two sections of 16 heads; GQA (4 query heads per key head) in 12 sections of 2 heads; five
  // sections of 6 heads and one of 5.
  check_kb_tile_order({2, 16, 16, 1000, 1000, Mask::kNone}, kMiB / 2);
  check_kb_tile_order({3, 32, 8, 777, 1200, Mask::kCausal}, 3 * kMiB);
  check_kb_tile_order({5, 7, 7, 2048, 2048, Mask::kCausal}, 4 * kMiB / 3);
  // Causal with Sk > Sq: key blocks without steps (dK zero), last in the one section.
  check_kb_tile_order({2, 4, 2, 200, 1000, Mask::kCausal}, kMiB);
  // One head larger than the budget (sections of one head); one tile.
  check_kb_tile_order({2, 3, 3, 4096, 4096, Mask::kCausal}, 64 * kMiB);
  check_kb_tile_order({1, 1, 1, 100, 100, Mask::kCausal}, kMiB);
}

// Mirrored pairs (KbTileOrder::pair_heads, the pingpong single pass's causal clusters of C = Sk / 128 CTAs): the
// static walk (first_tile, next_tile) of a grid of whole clusters gives every (head, key block) to one CTA, CTA c
// holding key block c mod C of even heads (rows walked down) and C − 1 − that of odd ones (rows walked up), the two
// heads of a pair one after the other. Every row block that CTAs share is the same consumer's in each (its index
// among each CTA's blocks of one parity), and the cluster's CTAs, each waiting for the others at a shared row
// block, finish without a deadlock: with square rows, one query head per key head and whole pairs, in 2C + 2
// steps per pair (against 2C per head one at a time).
struct PairedBlock {
  int head, query_head, row_block;
  bool operator==(const PairedBlock& o) const {
    return head == o.head && query_head == o.query_head && row_block == o.row_block;
  }
};

void check_paired_walk(int clusters, int heads, int row_blocks, int group, int grid_clusters) {
  SCOPED_TRACE(testing::Message() << "C " << clusters << ", heads " << heads << ", T " << row_blocks << ", group "
                                  << group << ", clusters in the grid " << grid_clusters);
  using Order = KbTileOrder<64, 128>;
  Order order{};
  order.key_blocks = clusters, order.heads = heads, order.hk = heads, order.row_blocks = row_blocks;
  order.group = group, order.causal = true;
  if (!order.pairable()) return;
  order.pair_heads();
  const int grid = std::min((heads + 1) / 2, grid_clusters) * clusters;
  std::vector<int> taken(size_t(order.tiles()), 0);
  std::vector<std::vector<PairedBlock>> blocks(static_cast<size_t>(grid));  // each CTA's blocks in its consumers' order
  for (int c = 0; c < grid; ++c) {
    const int rank = c % clusters;
    int previous_head = -1;
    for (int i = order.first_tile(c); i < order.tiles(); i = order.next_tile(i, grid)) {
      ++taken[size_t(i)];
      const KbTile tile = order.tile(i);
      const int head = tile.b * heads + tile.kv_head;
      ASSERT_EQ(tile.nb, head % 2 == 0 ? rank : clusters - 1 - rank) << "tile " << i;
      ASSERT_EQ(tile.mirrored, head % 2 == 1);
      if (head % 2 == 1) EXPECT_EQ(previous_head, head - 1) << "a pair's heads one after the other";
      previous_head = head;
      const int first = order.first_row_block(tile.nb);
      for (int qh = 0; qh < group; ++qh) {
        for (int t = first; t < row_blocks; ++t) {
          blocks[size_t(c)].push_back({head, qh, tile.mirrored ? t : row_blocks - 1 - (t - first)});
        }
      }
    }
  }
  EXPECT_EQ(std::count(taken.begin(), taken.end(), 1), int64_t(order.tiles())) << "tiles not dealt once";

  // The cluster's steps: a CTA takes its next block once every CTA that shares it has it next.
  for (int k = 0; k < grid / clusters; ++k) {
    std::vector<size_t> next(size_t(clusters), 0);
    std::vector<int> time(size_t(clusters), 0);
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < clusters; ++r) {
        const auto& mine = blocks[size_t(k * clusters + r)];
        if (next[size_t(r)] == mine.size()) continue;
        const PairedBlock b = mine[next[size_t(r)]];
        std::vector<int> sharers;
        bool due = true;
        for (int q = 0; q < clusters; ++q) {
          const auto& theirs = blocks[size_t(k * clusters + q)];
          if (std::find(theirs.begin(), theirs.end(), b) == theirs.end()) continue;
          sharers.push_back(q);
          due = due && next[size_t(q)] < theirs.size() && theirs[next[size_t(q)]] == b;
        }
        if (!due) continue;
        for (int q : sharers) {
          EXPECT_EQ(next[size_t(q)] % 2, next[size_t(r)] % 2)
              << "row block " << b.row_block << " of head " << b.head << ": two consumers";
        }
        int at = 0;
        for (int q : sharers) at = std::max(at, time[size_t(q)] + 1);
        for (int q : sharers) time[size_t(q)] = at, ++next[size_t(q)];
        moved = true;
      }
    }
    for (int r = 0; r < clusters; ++r) {
      ASSERT_EQ(next[size_t(r)], blocks[size_t(k * clusters + r)].size()) << "CTA " << r << " of cluster " << k
                                                                          << " waits forever";
    }
    if (row_blocks == 2 * clusters && group == 1 && heads % 2 == 0) {
      const int cluster_pairs = int(blocks[size_t(k * clusters)].size()) / (2 * clusters + 2);
      EXPECT_EQ(*std::max_element(time.begin(), time.end()), (2 * clusters + 2) * cluster_pairs);
    }
  }
}

TEST(Sm90Layouts, PairedWalk) {
  for (int clusters : {2, 4, 8}) {
    for (int heads : {1, 2, 3, 6, 37}) {
      for (int row_blocks : {1, 3, 2 * clusters - 1, 2 * clusters, 2 * clusters + 1}) {
        for (int group : {1, 2, 3}) {
          for (int grid_clusters : {1, 2, 16}) check_paired_walk(clusters, heads, row_blocks, group, grid_clusters);
        }
      }
    }
  }
}

// The counter's hand-out (kb_claimed_tile): CTA c starts on tile c; each tile a CTA runs costs it one claim, made in
// any order among the CTAs; between them they take every tile once, each CTA's last claim is the end of work
// (the order's tile count), and the counter ends at the tile count (so it never overflows 31 bits). Also with
// more CTAs than tiles, which the launch never makes: the CTAs past the last tile run none and claim nothing.
void check_kb_hand_out(int tiles, int grid, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> current(size_t(grid), 0);  // each CTA's tile
  std::vector<int> running;  // CTAs with a tile
  std::vector<int> taken(size_t(tiles), 0);
  for (int c = 0; c < grid; ++c) {
    current[size_t(c)] = c;
    if (c < tiles) running.push_back(c);
  }
  int counter = 0;
  while (!running.empty()) {
    const size_t k = size_t(std::uniform_int_distribution<size_t>(0, running.size() - 1)(rng));
    const int c = running[k];
    ASSERT_LT(current[size_t(c)], tiles);
    ++taken[size_t(current[size_t(c)])];
    current[size_t(c)] = kb_claimed_tile(counter++, grid, tiles);
    if (current[size_t(c)] >= tiles) {
      EXPECT_EQ(current[size_t(c)], tiles) << "the end of work is the tile count";
      running.erase(running.begin() + std::ptrdiff_t(k));
    }
  }
  EXPECT_EQ(std::count(taken.begin(), taken.end(), 1), int64_t(tiles)) << "tiles not handed out once";
  EXPECT_EQ(counter, tiles) << "claims other than one per tile run";
}

TEST(Sm90Layouts, KeyBlockHandOut) {
  constexpr int kSms = 132;
  check_kb_hand_out(8192, kSms, 1);  // B8·H128·S1024: 62 tiles per CTA
  check_kb_hand_out(640, kSms, 2);   // the GPU tests' 640-tile cases
  check_kb_hand_out(133, kSms, 3);   // one CTA takes a second tile
  check_kb_hand_out(kSms, kSms, 4);  // a tile each: every claim is the end
  check_kb_hand_out(5, 7, 5);        // more CTAs than tiles
  check_kb_hand_out(1, 1, 6);
  // Near 2^31 − 1 tiles the claim's sum would overflow 32 bits: it is the end of work.
  EXPECT_EQ(kb_claimed_tile(INT_MAX - 10, kSms, INT_MAX - 5), INT_MAX - 5);
  EXPECT_EQ(kb_claimed_tile(INT_MAX - 200, kSms, INT_MAX - 5), INT_MAX - 200 + kSms);
}

}  // namespace
}  // namespace qksoftmax::cuda::sm90
