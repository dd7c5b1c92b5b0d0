// Configuration of the Hopper kernels (one per dtype and head dimension), shared by host and device:
// tile shapes, swizzled shared-memory layouts, wgmma tilings, TMA descriptor types.
#pragma once

#include <type_traits>

#include <cute/arch/copy_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/generic_config.h"
#include "cuda/generic_kernels.cuh"
#include "problem.h"

namespace qksoftmax::cuda::sm90 {

using namespace cute;

// log2(e): the kernels take exponentials as 2^x (ex2), with S and LSE scaled by it.
inline constexpr float kLog2e = 1.4426950408889634f;
// Shared memory on sm_90: at most 227 KB for one CTA, 228 KB per SM for all its CTAs (each of which the
// runtime gives 1 KB of its own).
inline constexpr int kSm90SmemPerCta = 227 * 1024;
inline constexpr int kSm90SmemPerSm = 228 * 1024;

// A TMA load of tiles (shared-memory layout SmemLayout) from a (rows, Cols, head, batch) global view with unit
// stride along Cols: Cols = Int<D> for Q and K, int32_t for P and dP.
template <class Element, class Cols, class SmemLayout>
using TmaLoad = decltype(make_tma_copy(
    SM90_TMA_LOAD{},
    make_tensor(make_gmem_ptr(static_cast<const Element*>(nullptr)), Shape<int32_t, Cols, int32_t, int32_t>{},
                Stride<int64_t, _1, int64_t, int64_t>{}),
    SmemLayout{}));

// One TMA load of `gmem` (a tile of tma's global tensor) into `smem` (the same shape), completing on the
// transaction barrier `full`; and one TMA store (or reduce-add, as tma was made) of `smem` into `gmem`.
template <class Tma, class GTile, class STile>
__device__ void tma_load_tile(const Tma& tma, uint64_t& full, const GTile& gmem, STile&& smem) {
  auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(smem), group_modes<0, 2>(gmem));
  copy(tma.with(full), tg, ts);
}
template <class Tma, class STile, class GTile>
__device__ void tma_store_tile(const Tma& tma, STile&& smem, const GTile& gmem) {
  auto [tg, ts] = tma_partition(tma, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(smem), group_modes<0, 2>(gmem));
  copy(tma, ts, tg);
}

// Reductions over the lanes that share the rows of a wgmma accumulator (a quad).
template <int kLanes>
__device__ inline float quad_max(float v) {
  CUTE_UNROLL
  for (int off = 1; off < kLanes; off *= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
template <int kLanes>
__device__ inline float quad_sum(float v) {
  CUTE_UNROLL
  for (int off = 1; off < kLanes; off *= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
// quad_sum of two per-row sums of each of a thread's rows, the rows in lockstep (their shuffle chains overlap).
template <int kLanes, int kRows>
__device__ inline void quad_sum_rows(float (&a)[kRows], float (&b)[kRows]) {
  CUTE_UNROLL
  for (int ri = 0; ri < kRows; ++ri) {
    a[ri] = quad_sum<kLanes>(a[ri]);
    b[ri] = quad_sum<kLanes>(b[ri]);
  }
}

// 2^x by the special-function unit alone (ex2.approx.ftz): exp2f adds a range fix-up of three instructions
// per call for results below 2^-126, which the softmax's outputs (≤ 1, rounded to 16 bits) do not need.
// 2^-inf = +0.
__device__ inline float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// log2 x by the special-function unit (lg2.approx.ftz: log2(+0) = −inf).
__device__ inline float log2_fast(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1/x by the special-function unit alone (rcp.approx.ftz: within an ulp or two; 1/(+0) = +inf): IEEE division
// adds a subroutine and a branch per call.
__device__ inline float rcp_fast(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A reduction of N values by a binary operation, as a tree: a dependency chain of log2 N operations instead
// of N (an element-wise pass over an accumulator row otherwise waits on each add or max in turn).
template <int N, class Op>
__device__ inline float tree_reduce(float (&v)[N], Op op) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two");
  CUTE_UNROLL
  for (int stride = 1; stride < N; stride *= 2) {
    CUTE_UNROLL
    for (int i = 0; i < N; i += 2 * stride) v[i] = op(v[i], v[i + stride]);
  }
  return v[0];
}
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Whether the key-block pass's dS carries the scale, folded into the exponent's offset (KbRows), so that the dQ
// partials and dK need no multiply after their products: in bf16, whose exponent range holds scale · dS; not in
// fp16, where a small scale would push dS below fp16's normal range (2^-14) before it is rounded (an fp64
// simulation: dQ's error at S = 1024 and scale 1e-3 from 1.8e-4 to 5.3e-3, past the bar), and dQ and dK take
// the scale afterwards as before.
template <class Element>
inline constexpr bool kScaleInDs = std::is_same_v<Element, cutlass::bfloat16_t>;

// Calls f(std::integral_constant<BlockCut, cut>{}) for a KeyRange::cut: the element-wise code compiled once
// per kind of cut.
template <class F>
__device__ inline void with_cut(BlockCut cut, F&& f) {
  if (cut == BlockCut::kNone) {
    f(std::integral_constant<BlockCut, BlockCut::kNone>{});
  } else if (cut == BlockCut::kDiagonal) {
    f(std::integral_constant<BlockCut, BlockCut::kDiagonal>{});
  } else {
    f(std::integral_constant<BlockCut, BlockCut::kRows>{});
  }
}

// Calls f(std::true_type) where a tile has masked elements and f(std::false_type) where it has none, so
// that only the tiles that need them pay for the per-element compares.
template <class F>
__device__ inline void with_mask(bool masked, F&& f) {
  if (masked) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Element offset of row r of (b, h) in the backward's fp32 dQ accumulator, (B, Hq, Sq, D), contiguous.
CUTE_HOST_DEVICE int64_t dq_accum_offset(const Problem& prob, int64_t b, int64_t h, int64_t r) {
  return ((b * prob.Hq + h) * prob.Sq + r) * prob.D;
}
// The rows of dQ that the row statistics clear for the key-block pass to add into: the fp32 accumulator, or dQ
// itself where the key-block pass adds its 16-bit partials there directly. Strides in bytes; a row is
// `row_vectors` 16-byte vectors, and every row start is 16-byte aligned (TMA's alignment).
struct DqTarget {
  char* ptr;
  int64_t sb, sh, sr;
  int row_vectors;
  CUTE_HOST_DEVICE uint4* row(int64_t b, int64_t h, int64_t r) const {
    return reinterpret_cast<uint4*>(ptr + b * sb + h * sh + r * sr);
  }
};
// Whether every row start of an operand of Element (pointer and strides) is aligned to `elements` elements.
template <class Element>
CUTE_HOST_DEVICE bool aligned_rows(const Operand& op, int64_t elements) {
  return reinterpret_cast<uintptr_t>(op.ptr) % uintptr_t(elements * sizeof(Element)) == 0 && op.sr % elements == 0 &&
         op.sh % elements == 0 && op.sb % elements == 0;
}
// Values converted to 16 bits and stored at out[0..n): one store where `vector`, else one per element.
template <class Element>
__device__ inline void store_converted(Element* out, float x, float y, bool vector) {
  if (vector) {
    const Element v[2] = {Element(x), Element(y)};
    *reinterpret_cast<uint32_t*>(out) = reinterpret_cast<const uint32_t&>(v);
  } else {
    out[0] = Element(x);
    out[1] = Element(y);
  }
}
template <class Element>
__device__ inline void store_converted(Element* out, float4 v, bool vector) {
  if (vector) {
    const Element e[4] = {Element(v.x), Element(v.y), Element(v.z), Element(v.w)};
    *reinterpret_cast<uint2*>(out) = reinterpret_cast<const uint2&>(e);
  } else {
    store_converted(out, v.x, v.y, false);
    store_converted(out + 2, v.z, v.w, false);
  }
}
// The same, scaled first.
template <class Element>
__device__ inline void store_scaled(Element* out, float x, float y, float scale, bool vector) {
  store_converted(out, x * scale, y * scale, vector);
}

// The row statistics of the two-pass backward (sm90_rowstats.cuh): the forward's pass-1 shape, two CTAs per
// SM of two warpgroups, each warpgroup 64 of the CTA's rows against 64-column key blocks.
template <class Element_, int kHeadDim_>
struct Config {
  using Element = Element_;
  static constexpr DType kDType = ElementTraits<Element>::kDType;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpgroups = 2;
  static constexpr int kBlockM = 64 * kWarpgroups;  // query rows per CTA, 64 per warpgroup
  static constexpr int kBlockN = 64;                // key columns per step
  static constexpr int kStages = 2;                 // TMA double buffering of the per-step tiles
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr int kQuad = 4;  // lanes that share the rows of a wgmma accumulator

  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  using HD = Int<kHeadDim>;
  using ST = Int<kStages>;

  // 128-byte swizzled, K-major tiles.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<BM, HD>{}));       // (rows, d)
  using SmemLayoutK = decltype(tile_to_shape(SmemAtom{}, Shape<BN, HD, ST>{}));   // (cols, d, stage)
  using SmemLayoutP = decltype(tile_to_shape(SmemAtom{}, Shape<BM, BN, ST>{}));   // (rows, cols, stage)

  using MmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BN, HD>, GMMA::Major::K, GMMA::Major::K>(),
      Layout<Shape<Int<kWarpgroups>, _1, _1>>{}));
  using TmaQ = TmaLoad<Element, HD, SmemLayoutQ>;
  using TmaK = TmaLoad<Element, HD, decltype(SmemLayoutK{}(_, _, 0))>;
  using TmaP = TmaLoad<Element, int32_t, decltype(SmemLayoutP{}(_, _, 0))>;

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kPBytes = kBlockM * kBlockN * sizeof(Element);  // one stage of a P or dP tile

  // Q resident and K staged (recompute), or P staged (saved-P): a mode needs one or the other, so they share
  // their space; dP staged in both.
  struct RowStatsStorage {
    union {
      struct {
        alignas(1024) cute::array<Element, cosize_v<SmemLayoutQ>> q;
        alignas(1024) cute::array<Element, cosize_v<SmemLayoutK>> k;
      } scores;
      alignas(1024) cute::array<Element, cosize_v<SmemLayoutP>> p;
    };
    alignas(1024) cute::array<Element, cosize_v<SmemLayoutP>> dp;
    alignas(8) uint64_t stage_full[kStages];
    alignas(8) uint64_t q_full;
  };
  static constexpr int kSmemBytes = int(sizeof(RowStatsStorage));
  // An SM has 228 KB of shared memory, of which each resident CTA takes 1 KB for the system.
  static_assert(kSmemBytes + 1024 <= kSm90SmemPerSm / kMinBlocksPerSm, "the row statistics' CTAs per SM do not fit");

  struct Params {
    Problem prob;
    TmaQ tma_q;
    TmaK tma_k;
    TmaP tma_dp;
    TmaP tma_p;             // saved-P mode only (a copy of tma_dp otherwise, never used)
    generic::RowVec lse;    // written by the row statistics unless lse_given; read by the key-block pass
    generic::RowVec delta;  // D, written by the row statistics
    bool lse_given;
    DqTarget dq_clear;  // what the key-block pass adds dQ into, cleared here
    int* kb_tile_counter;  // the key-block pass's tile counter, set to 0 here
  };
};

// A wgmma accumulator ((2, 2, V), M, N) viewed as (rows, cols): ((2, M), (2, V, N)).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol(const Layout& acc) {
  const auto mode0 = get<0>(acc);
  return make_layout(make_layout(get<1>(mode0), get<1>(acc)),
                     make_layout(get<0>(mode0), get<2>(mode0), get<2>(acc)));
}

// acc (+)= A · B over the first kBlocks k-blocks of the partitioned operands (descriptors of shared memory, or
// A in registers), on one warpgroup. With kWait false the products stay in flight: a later wait
// (warpgroup_wait<0>) completes them, after which the caller fences acc.
template <int kBlocks, bool kZeroInit, bool kWait = true, class Mma, class TA, class TB, class Acc>
__device__ void warpgroup_mma(Mma& mma, const TA& tA, const TB& tB, Acc& acc) {
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int kb = 0; kb < kBlocks; ++kb) {
    gemm(mma, tA(_, _, kb), tB(_, _, kb), acc);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait) {
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
  }
}

// acc (+)= A · B over the whole K extent of the shared-memory operands (partitioned for threadIdx.x).
template <bool kZeroInit, bool kWait = true, class Mma, class TA, class TB, class Acc>
__device__ void warpgroup_gemm(Mma& mma, const TA& sA, const TB& sB, Acc& acc) {
  auto thr_mma = mma.get_thread_slice(threadIdx.x);
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K) descriptors
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K) descriptors
  warpgroup_mma<size<2>(decltype(tCrA.layout()){}), kZeroInit, kWait>(mma, tCrA, tCrB, acc);
}

// Shared-memory accesses spelled out: the compiler cannot always prove that a pointer into the dynamic
// shared memory is one, and then emits generic accesses (and, for float atomics, compare-and-swap loops).
__device__ inline uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// The address of the same shared-memory location in CTA `rank` of the cluster.
__device__ inline uint32_t cluster_addr(uint32_t local, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(local), "r"(rank));
  return out;
}
// ldmatrix / stmatrix (x4) of a 16-bit shared-memory tile in a wgmma accumulator's layout, addressed by 32-bit
// shared-memory offsets computed once per thread. CuTe's tiled copies recompute every access's swizzled
// address in 64-bit generic arithmetic (about eight instructions per access, on the path to the load); a
// stage of a staged tile is then one add away, since stages are whole swizzle periods apart.
// A thread's (CPY, CPY_M, CPY_N) partition holds CPY = (8, A): A accesses of 8 contiguous 16-bit values each.
constexpr int kMatrixValues = 8;  // 16 bytes per thread per x4 access

// The address of each x4 access of `part`, this thread's partition of one stage of the tile (partition_S for
// loads, partition_D for stores): (A, CPY_M, CPY_N).
template <class Part>
__device__ auto matrix_addresses(const Part& part) {
  constexpr int kAccesses = size<0>(Part{}.layout()) / kMatrixValues;
  Tensor addr = make_tensor<uint32_t>(make_shape(Int<kAccesses>{}, size<1>(part), size<2>(part)));
  CUTE_UNROLL
  for (int a = 0; a < kAccesses; ++a) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(part); ++m) {
      CUTE_UNROLL
      for (int n = 0; n < size<2>(part); ++n) addr(a, m, n) = smem_addr(&part(a * kMatrixValues, m, n));
    }
  }
  return addr;
}
// f(a, m, n) for each access of `addr`.
template <class Addr, class F>
__device__ void for_each_access(const Addr& addr, F&& f) {
  CUTE_UNROLL
  for (int a = 0; a < size<0>(addr); ++a) {
    CUTE_UNROLL
    for (int m = 0; m < size<1>(addr); ++m) {
      CUTE_UNROLL
      for (int n = 0; n < size<2>(addr); ++n) f(a, m, n);
    }
  }
}
// One x4 access: v, the 8 16-bit values of the access in a (CPY) slice of a fragment, as 4 registers, as
// CuTe's copy of the atom unpacks them.
template <class Values>
__device__ void load_matrix(uint32_t addr, Values&& v) {
  Tensor d = recast<uint32_t>(v);  // 4 registers
  asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(d(0)), "=r"(d(1)), "=r"(d(2)), "=r"(d(3))
               : "r"(addr));
}
template <class Values>
__device__ void store_matrix(uint32_t addr, const Values& v) {
  Tensor d = recast<const uint32_t>(v);  // 4 registers
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};"
               :
               : "r"(addr), "r"(d(0)), "r"(d(1)), "r"(d(2)), "r"(d(3))
               : "memory");
}
// frag (CPY, CPY_M, CPY_N), 16-bit, the retile_D of the copy whose partition gave `addr`.
template <class Addr, class Frag>
__device__ void load_matrices(const Addr& addr, uint32_t offset, Frag&& frag) {
  for_each_access(addr, [&](int a, int m, int n) { load_matrix(addr(a, m, n) + offset, frag(make_coord(_, a), m, n)); });
}
// frag (CPY, CPY_M, CPY_N), 16-bit, the retile_S of the copy whose partition gave `addr`.
template <class Addr, class Frag>
__device__ void store_matrices(const Addr& addr, uint32_t offset, const Frag& frag) {
  for_each_access(addr, [&](int a, int m, int n) { store_matrix(addr(a, m, n) + offset, frag(make_coord(_, a), m, n)); });
}

// Shared memory by address (smem_addr), where a thread reads or writes what another role or the async proxy
// uses.
__device__ inline void store_shared_f2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" : : "r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ inline float2 load_shared_f2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}
__device__ inline void store_shared_f4(uint32_t addr, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" : : "r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}
__device__ inline float4 load_shared_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}
__device__ inline void store_shared_s32(uint32_t addr, int v) {
  asm volatile("st.shared.s32 [%0], %1;" : : "r"(addr), "r"(v) : "memory");
}
__device__ inline int load_shared_s32(uint32_t addr) {
  int v;
  asm volatile("ld.shared.s32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

}  // namespace qksoftmax::cuda::sm90
