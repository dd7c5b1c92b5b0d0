// The CPU backend, through the public API on host pointers, against the independent fp64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "problem.h"
#include "reference.h"
#include "test_util.h"

namespace qksoftmax::test {
namespace {

// Below this the CPU backend is "fp32-accurate" in the strict sense the brief asks of it.
constexpr double kCpuFp32Bound = 1e-6;
// fp64 results are never rounded to a narrower dtype: what remains is the sums' own rounding.
constexpr double kCpuFp64Bound = 1e-12;

reference::Dims dims_of(const Case& c) {
  return {c.B, c.Hq, c.Hk, c.Sq, c.Sk, c.D, c.mask == Mask::kCausal, c.options().scale.value_or(1 / std::sqrt(c.D))};
}

double cpu_bound(DType dtype) {
  if (dtype == DType::kFloat64) return kCpuFp64Bound;
  const double bound = std::min(rounding_tolerance(dtype), accuracy::bound(dtype));
  return dtype == DType::kFloat32 ? std::min(bound, kCpuFp32Bound) : bound;
}

class CpuVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(CpuVsReference, ForwardAndBackward) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, test_seed());
  Outputs out(c, c.dtype, c.layout);
  const Status s = cpu_run(c, in, out);
  ASSERT_TRUE(s.ok()) << s.message();

  const reference::Dims dims = dims_of(c);
  const std::vector<double> q = in.q.values(), k = in.k.values();
  const reference::Forward fwd = reference::forward(dims, q, k);
  expect_close("p", out.p, fwd.p, cpu_bound(c.dtype));
  expect_close("lse", out.lse, fwd.lse, cpu_bound(DType::kFloat32));
  expect_masked_zero(out.p, c.mask);

  const std::vector<double> saved_p = in.p ? in.p->values() : std::vector<double>{};
  const std::vector<double> lse = in.lse ? in.lse->values() : std::vector<double>{};
  // float64 gradients are float64-accurate even from a given (float32) lse: against the exact softmax.
  const bool lse_used = in.lse && c.dtype != DType::kFloat64;
  const reference::Gradients grads =
      reference::backward(dims, q, k, in.dp.values(), in.p ? &saved_p : nullptr, lse_used ? &lse : nullptr);
  expect_gradient_close(c, "dq", out.dq, grads.dq, cpu_bound(c.dtype));
  expect_gradient_close(c, "dk", out.dk, grads.dk, cpu_bound(c.dtype));
}

// The index-th combination of dtype, mask and mode: 18 consecutive indices cover every combination.
Case with_options(Case c, int index) {
  constexpr int kModes = 3, kDTypes = 3, kMasks = 2;
  c.variant = kAllVariants[index % kModes];
  c.dtype = kAllDTypes[index / kModes % kDTypes];
  c.mask = kAllMasks[index / (kModes * kDTypes) % kMasks];
  return c;
}

std::vector<Case> sweep() {
  std::vector<Case> cases;
  int index = 0;
  const auto add = [&](Case c) { cases.push_back(with_options(c, index++)); };
  // Every S and D, with dtype, mask and mode rotating so that each appears with many sizes.
  for (int64_t s : {1, 7, 64, 129, 200}) {
    for (int64_t d : {1, 3, 64, 128}) add({.B = 1, .Hq = 2, .Hk = 2, .Sq = s, .Sk = s, .D = d});
  }
  // Every dtype × mask × mode on one odd shape.
  for (int i = 0; i < int(std::size(kAllDTypes) * std::size(kAllMasks) * std::size(kAllVariants)); ++i) {
    cases.push_back(with_options({.B = 2, .Hq = 2, .Hk = 2, .Sq = 129, .Sk = 129, .D = 64}, i));
  }
  // Sq != Sk: causal rows past Sk see every key; keys past Sq are seen by no causal row.
  constexpr std::pair<int64_t, int64_t> kRectangles[] = {{7, 129}, {129, 7}, {200, 64}, {1, 200}, {200, 1}, {64, 200}};
  for (const auto& [sq, sk] : kRectangles) {
    for (Mask mask : kAllMasks) {
      Case c = with_options({.B = 1, .Hq = 2, .Hk = 1, .Sq = sq, .Sk = sk, .D = 64}, index++);
      c.mask = mask;
      cases.push_back(c);
    }
  }
  // GQA: two and four query heads per key head.
  for (int64_t hk : {2, 1}) {
    for (Variant variant : kAllVariants) {
      Case c = with_options({.B = 2, .Hq = 4, .Hk = hk, .Sq = 33, .Sk = 47, .D = 64}, index++);
      c.variant = variant;
      cases.push_back(c);
    }
  }
  // Non-contiguous views, with NaN in every gap.
  for (Layout layout : {Layout::kHeadsTransposed, Layout::kPaddedRows, Layout::kOddPaddedRows, Layout::kWideLastDim}) {
    for (Variant variant : kAllVariants) {
      Case c = with_options({.B = 2, .Hq = 4, .Hk = 2, .Sq = 65, .Sk = 70, .D = 64, .layout = layout}, index++);
      c.variant = variant;
      cases.push_back(c);
    }
  }
  // fp64 (CPU backend only): every mask and mode, with GQA and padded rows.
  for (Mask mask : kAllMasks) {
    for (Variant variant : kAllVariants) {
      cases.push_back({.B = 2, .Hq = 4, .Hk = 2, .Sq = 33, .Sk = 47, .D = 64, .dtype = DType::kFloat64,
                       .mask = mask, .variant = variant, .layout = Layout::kPaddedRows});
    }
  }
  // An explicit scale instead of 1/sqrt(D).
  for (double scale : {0.3, 2.0}) {
    cases.push_back({.B = 1, .Hq = 2, .Hk = 1, .Sq = 64, .Sk = 64, .D = 64, .dtype = DType::kFloat32, .scale = scale});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sweep, CpuVsReference, ::testing::ValuesIn(sweep()), param_name);

// What is planted in masked positions of p and dp (NaN, or zeros) must not change a single bit.
class CpuMaskedInputs : public ::testing::TestWithParam<Variant> {};

TEST_P(CpuMaskedInputs, AreNeverRead) {
  const Case c{.B = 2, .Hq = 2, .Hk = 1, .Sq = 70, .Sk = 70, .D = 64, .variant = GetParam()};
  Inputs with_nan = make_inputs(c, test_seed());
  Inputs with_zero = make_inputs(c, test_seed());
  for_each_masked(with_zero.dp, c.mask, [&](int64_t flat) { with_zero.dp.set(flat, 0.0); });
  if (with_zero.p) for_each_masked(*with_zero.p, c.mask, [&](int64_t flat) { with_zero.p->set(flat, 0.0); });

  Outputs a(c, c.dtype, c.layout), b(c, c.dtype, c.layout);
  ASSERT_TRUE(cpu_run(c, with_nan, a).ok());
  ASSERT_TRUE(cpu_run(c, with_zero, b).ok());
  expect_bitwise_equal(a, b);
}

INSTANTIATE_TEST_SUITE_P(Modes, CpuMaskedInputs, ::testing::ValuesIn(kAllVariants),
                         variant_param_name);

// Two runs of the same problem are bitwise identical (tasks never depend on the thread that runs them).
class CpuDeterminism : public ::testing::TestWithParam<Variant> {};

TEST_P(CpuDeterminism, TwoRunsBitwiseEqual) {
  const Case c{.B = 2, .Hq = 4, .Hk = 2, .Sq = 200, .Sk = 129, .D = 64, .dtype = DType::kFloat32,
               .variant = GetParam()};
  const Inputs in = make_inputs(c, test_seed());
  Outputs a(c, c.dtype, c.layout), b(c, c.dtype, c.layout);
  ASSERT_TRUE(cpu_run(c, in, a).ok());
  ASSERT_TRUE(cpu_run(c, in, b).ok());
  expect_bitwise_equal(a, b);
}

INSTANTIATE_TEST_SUITE_P(Modes, CpuDeterminism, ::testing::ValuesIn(kAllVariants),
                         variant_param_name);

// The forward's lse is float32: P = exp(S − lse) from it would be only float32-accurate (~1e-7). float64
// recompute computes its row statistics in fp64 instead, and is as accurate with lse as without.
TEST(Cpu, Float64RecomputeWithLseIsFloat64Accurate) {
  const Case c{.B = 1, .Hq = 2, .Hk = 1, .Sq = 70, .Sk = 90, .D = 32, .dtype = DType::kFloat64,
               .mask = Mask::kNone, .variant = Variant::kRecomputeLse};
  const Inputs in = make_inputs(c, test_seed());
  ASSERT_TRUE(in.lse.has_value());
  Outputs out(c, c.dtype, c.layout);
  ASSERT_TRUE(cpu_run(c, in, out).ok());
  const reference::Gradients exact =
      reference::backward(dims_of(c), in.q.values(), in.k.values(), in.dp.values(), nullptr, nullptr);
  expect_close("dq", out.dq, exact.dq, cpu_bound(c.dtype));
  expect_close("dk", out.dk, exact.dk, cpu_bound(c.dtype));
}

// Without an lse output the forward still writes P, and only P.
TEST(Cpu, ForwardWithoutLse) {
  const Case c{.B = 1, .Hq = 2, .Hk = 1, .Sq = 9, .Sk = 9, .D = 16, .dtype = DType::kFloat32};
  const Inputs in = make_inputs(c, test_seed());
  HostTensor p(c.dtype, c.probs_shape());
  ASSERT_TRUE(forward({in.q.desc(), in.k.desc(), p.desc(), {}}, c.options(), nullptr, 0, nullptr).ok());
  const reference::Forward fwd = reference::forward(dims_of(c), in.q.values(), in.k.values());
  expect_close("p", p, fwd.p, cpu_bound(c.dtype));
}

// The kinds of cut the Hopper kernels pick per tile (KeyRange::cuts, sees_none, diagonal_only) against the
// count of columns each row sees (cols_in), at tiles on and off the diagonal and the edges of Sq and Sk.
TEST(KeyRangeCuts, AgreeWithEachRowsColumns) {
  constexpr int kRows = 8, kWidth = 4;
  for (const bool causal : {false, true}) {
    for (const int64_t sq : {1, 7, 8, 13, 16}) {
      for (const int64_t sk : {1, 5, 8, 12, 16}) {
        const KeyRange keys{causal, sq, sk};
        for (int64_t m0 = 0; m0 < sq; m0 += 4) {
          for (int64_t n0 = 0; n0 < sk + kWidth; n0 += 2) {  // blocks past Sk too (a consumer's last keys)
            bool cut = false, none = true, diagonal = causal;
            for (int r = 0; r < kRows; ++r) {
              const int64_t i = m0 + r;
              const int seen = keys.cols_in(i, n0, kWidth);
              cut = cut || seen < kWidth;
              none = none && seen == 0;
              for (int c = 0; c < kWidth; ++c) {  // where the diagonal alone would cut: c − r ≤ m0 − n0
                diagonal = diagonal && (c < seen) == (c - r <= m0 - n0);
              }
            }
            SCOPED_TRACE(testing::Message() << "causal " << causal << " Sq " << sq << " Sk " << sk << " m0 " << m0
                                            << " n0 " << n0);
            EXPECT_EQ(keys.cuts(m0, kRows, n0, kWidth), cut);
            EXPECT_EQ(keys.sees_none(m0, kRows, n0), none);
            // diagonal_only promises the diagonal's rule; where it says so, that rule must hold
            if (keys.diagonal_only(m0, kRows, n0, kWidth)) {
              EXPECT_TRUE(diagonal);
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace qksoftmax::test
