// The pingpong single pass (src/cuda/sm90/sp_pp_config.h) through its internal entry point (sp_variants.cu), as
// dispatched (with a dK warpgroup) and with dK held by its consumers, with the Problem built here from the test's
// tensors, on shapes the public API would also send it: each against the CPU backend, and all bit for bit against
// the first run; and in clusters of 2, 4 and 8 CTAs (rows of up to 1024 keys), against the CPU backend; recompute
// and saved-P (P given: each case's variant).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "cuda_util.h"
#include "sp_variants.h"
#include "test_util.h"

namespace qksoftmax::test {
namespace {

Operand operand(const TensorDesc& t) { return {t.data, t.stride[0], t.stride[1], t.stride[2], t.stride[3]}; }

// A case's inputs on the device (P in saved-P).
struct DeviceInputs {
  explicit DeviceInputs(const Inputs& in) : q(in.q), k(in.k), dp(in.dp) {
    if (in.p) p.emplace(*in.p);
  }
  DeviceTensor q, k, dp;
  std::optional<DeviceTensor> p;
};

// The Problem of a backward of case c (recompute, or saved-P where c's variant is) on the given device tensors.
Problem sp_problem(const Case& c, const DeviceInputs& in, const TensorDesc& dq, const TensorDesc& dk) {
  Problem prob;
  prob.pass = Pass::kBackward;
  prob.B = c.B, prob.Hq = c.Hq, prob.Hk = c.Hk, prob.Sq = c.Sq, prob.Sk = c.Sk, prob.D = c.D;
  prob.dtype = c.dtype;
  prob.device = Device::kCUDA;
  int device = 0;
  EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
  prob.device_index = device;
  prob.mask = c.mask;
  prob.mode = c.variant == Variant::kSavedP ? BackwardMode::kSavedP : BackwardMode::kRecompute;
  prob.scale = float(c.scale.value_or(1.0 / std::sqrt(double(c.D))));
  prob.scale_f64 = c.scale.value_or(1.0 / std::sqrt(double(c.D)));
  prob.q = operand(in.q.desc()), prob.k = operand(in.k.desc()), prob.dp = operand(in.dp.desc());
  if (in.p) prob.p = operand(in.p->desc());
  prob.dq = operand(dq), prob.dk = operand(dk);
  return prob;
}

// One run of `launch` (a Problem and a stream to a Status) of case c into freshly poisoned dQ and dK (dK in
// `dk_layout` where given), downloaded into a new entry of `outs`.
template <class Launch>
void run_poisoned(const Case& c, const DeviceInputs& in, CUstream_st* stream, const Launch& launch,
                  std::vector<Outputs>& outs, std::optional<Layout> dk_layout = std::nullopt) {
  Outputs& out = outs.emplace_back(c, c.dtype, c.output_layout());
  if (dk_layout) out.dk = HostTensor(c.dtype, c.k_shape(), *dk_layout);
  DeviceTensor dq(out.dq), dk(out.dk);
  dq.poison();
  dk.poison();
  const Status s = launch(sp_problem(c, in, dq.desc(), dk.desc()), stream);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (auto [from, to] : {std::pair{&dq, &out.dq}, {&dk, &out.dk}}) {
    const Status d = from->download(*to);
    ASSERT_TRUE(d.ok()) << d.message();
  }
}

// Each run's gradients against the CPU backend on fp32 copies of the inputs (test_cuda.cpp's reference).
void expect_close_to_cpu(const Case& c, const Inputs& in, const std::vector<Outputs>& outs,
                         const char* const* names) {
  Outputs ref(c, DType::kFloat32, Layout::kContiguous);
  const Status s = cpu_run(c, in.converted(DType::kFloat32), ref);
  ASSERT_TRUE(s.ok()) << "CPU reference: " << s.message();
  const double tolerance = accuracy::bound(c.dtype);
  for (size_t f = 0; f < outs.size(); ++f) {
    SCOPED_TRACE(names[f]);
    expect_gradient_close(c, "dq", outs[f].dq, ref.dq.values(), tolerance);
    expect_gradient_close(c, "dk", outs[f].dk, ref.dk.values(), tolerance);
  }
}

class GpuSpVariants : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuSpVariants, AgainstCpuAndEachOther) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, test_seed());
  // The dispatched form twice, then with dK held by the consumers: the same products over the same operands, dK's
  // blocks added in the same order, so all three agree bit for bit.
  constexpr SpForm kForms[] = {SpForm::kDispatched, SpForm::kDispatched, SpForm::kThreeWarpgroups};
  constexpr const char* kNames[] = {"as dispatched", "as dispatched, again", "three warpgroups"};
  const Stream stream;
  const DeviceInputs dev(in);
  std::vector<Outputs> outs;
  outs.reserve(std::size(kForms));
  for (SpForm form : kForms) {
    run_poisoned(c, dev, stream.get(),
                 [form](const Problem& prob, CUstream_st* s) { return run_single_pass(prob, form, s); }, outs);
    ASSERT_FALSE(HasFatalFailure()) << kNames[outs.size() - 1];
  }
  expect_close_to_cpu(c, in, outs, kNames);
  for (size_t f = 0; f < outs.size(); ++f) {
    SCOPED_TRACE(kNames[f]);
    EXPECT_TRUE(bitwise_equal(outs[0].dq, outs[f].dq)) << "dq";
    EXPECT_TRUE(bitwise_equal(outs[0].dk, outs[f].dk)) << "dk";
  }
}

// Tiles of 1, 2 and 16 steps, more tiles than SMs (and 768 tiles of 2 steps: 5 or more per CTA on 132 SMs, so
// that each K buffer is loaded at least twice and its barriers' both phases reused), grouped query heads, cut
// blocks (causal, keys past Sk, rows past Sq), a single row and a negative scale, a tile's blocks split unevenly
// between the consumers (3 blocks a tile). Every row of dP is 16-byte aligned (Sk a multiple of
// 8), as TMA needs: dispatch.cu sends other rows elsewhere.
std::vector<Case> variant_cases() {
  const int64_t wide = small_shapes() ? 40 : 150;
  return {{.B = 2, .Hq = wide, .Hk = wide, .Sq = 128, .Sk = 128, .D = 128},
          {.B = 2, .Hq = wide, .Hk = wide, .Sq = 64, .Sk = 64, .D = 128, .mask = Mask::kNone},
          {.B = 2, .Hq = 8, .Hk = 1, .Sq = 128, .Sk = 128, .D = 128},
          {.B = 8, .Hq = 96, .Hk = 96, .Sq = 128, .Sk = 128, .D = 128},
          {.B = 1, .Hq = 2, .Hk = 1, .Sq = 1000, .Sk = 120, .D = 128},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 40, .Sk = 96, .D = 128, .mask = Mask::kNone},
          {.B = 3, .Hq = 4, .Hk = 2, .Sq = 65, .Sk = 8, .D = 128},
          {.B = 1, .Hq = 3, .Hk = 3, .Sq = 1, .Sk = 72, .D = 128, .mask = Mask::kNone, .scale = -0.3},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 192, .Sk = 128, .D = 128, .mask = Mask::kNone}};
}

INSTANTIATE_TEST_SUITE_P(Edges, GpuSpVariants, ::testing::ValuesIn(variant_cases()), param_name);

// The pingpong single pass in clusters (src/cuda/sm90/sp_pp_exchange.cuh): C = Sk / 128 CTAs (rounded up) of 128
// keys each, every row block's statistics combined over the CTAs whose keys it sees, dQ added by each into dQ
// cleared before where CTAs share the block, stored by the CTA of key block 0 where it alone sees it (causal: rows
// before 128); C = 1, one CTA as dispatched.
// Against the CPU backend; run twice, dK bit for bit (each CTA's own keys, a fixed order) and, in one CTA or
// clusters of two, dQ too (stored once, or two partials added into zero: the same in either order).
void check_cluster(const Case& c, const Inputs& in) {
  const int cluster = int((c.Sk + 127) / 128);
  constexpr const char* kNames[] = {"first run", "second run"};
  const Stream stream;
  const DeviceInputs dev(in);
  std::vector<Outputs> outs;
  outs.reserve(std::size(kNames));
  for (size_t run = 0; run < std::size(kNames); ++run) {
    run_poisoned(c, dev, stream.get(),
                 [cluster](const Problem& prob, CUstream_st* s) { return run_single_pass_cluster(prob, cluster, s); },
                 outs);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << kNames[run];
  }
  expect_close_to_cpu(c, in, outs, kNames);
  EXPECT_TRUE(bitwise_equal(outs[0].dk, outs[1].dk)) << "dk";
  if (cluster <= 2) {
    EXPECT_TRUE(bitwise_equal(outs[0].dq, outs[1].dq)) << "dq";
  }
}

class GpuSpCluster : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuSpCluster, AgainstCpuAndItself) { check_cluster(GetParam(), make_inputs(GetParam(), test_seed())); }

// The inputs of case c with every row of dP close to its D: dP = level + 2^-5 · N(0, 1), the level of each row
// uniform in [2, 6), NaN in the masked positions as make_inputs plants them. dS = P ∘ (dP − D) is then a small
// difference of large values, which the fp32 bracket of dS takes exactly and one computed in fewer bits would lose.
Inputs inputs_with_dp_close_to_d(const Case& c, uint64_t seed) {
  constexpr double kLow = 2.0, kHigh = 6.0, kSpread = 0x1p-5;
  Inputs in = make_inputs(c, seed);
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::uniform_real_distribution<double> level(kLow, kHigh);
  std::normal_distribution<double> noise(0.0, 1.0);
  double row_level = 0.0;
  for (int64_t i = 0; i < in.dp.numel(); ++i) {
    if (i % c.Sk == 0) row_level = level(rng);
    in.dp.set(i, row_level + kSpread * noise(rng));
  }
  plant_nan_in_masked(in.dp, c.mask);
  return in;
}

class GpuSpDpCloseToD : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuSpDpCloseToD, AgainstCpuAndItself) {
  check_cluster(GetParam(), inputs_with_dp_close_to_d(GetParam(), test_seed()));
}

// Clusters of 2, 4 and 8, causal and not, bf16 and fp16 (fp16's dS without the scale: KbFinish), grouped query heads
// and causal heads in mirrored pairs.
INSTANTIATE_TEST_SUITE_P(Edges, GpuSpDpCloseToD,
                         ::testing::Values(Case{.B = 2, .Hq = 4, .Hk = 2, .Sq = 256, .Sk = 256, .D = 128},
                                           Case{.B = 1, .Hq = 2, .Hk = 2, .Sq = 512, .Sk = 512, .D = 128,
                                                .mask = Mask::kNone},
                                           Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 1024, .Sk = 1024, .D = 128},
                                           Case{.B = 1, .Hq = 2, .Hk = 2, .Sq = 1024, .Sk = 1024, .D = 128,
                                                .dtype = DType::kFloat16},
                                           Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 1024, .Sk = 1024, .D = 128,
                                                .dtype = DType::kFloat16},
                                           Case{.B = 1, .Hq = 2, .Hk = 2, .Sq = 1024, .Sk = 1024, .D = 128},
                                           Case{.B = 2, .Hq = 4, .Hk = 2, .Sq = 256, .Sk = 256, .D = 128,
                                                .dtype = DType::kFloat16}),
                         param_name);

// Clusters of 2, 4 and 8: square causal and unmasked heads, grouped query heads, more heads than clusters fit at
// once (each CTA several tiles, both K buffers and every statistics slot reused), rows that see none of the last
// CTAs' keys (Sq < Sk, causal), an odd number of row blocks, keys past Sk in the last CTA, rows past Sq. Causal
// heads go in mirrored pairs (KbTileOrder::pair_heads): an odd number of heads (a last one alone), pairs where a
// CTA has no rows in one head of the pair (300 rows of 448 keys, two query heads a key head), an odd number of row
// blocks that every CTA sees (960), and heads one at a time where pairs would split the consumers' parity (300
// rows of 448 keys, one query head a key head; 63 rows of 1024). fp16 (its own instances) in clusters of 8, causal
// pairs, and of 4, unmasked.
std::vector<Case> cluster_cases() {
  const int64_t wide = small_shapes() ? 40 : 150;
  return {{.B = 2, .Hq = 4, .Hk = 2, .Sq = 256, .Sk = 256, .D = 128},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 200, .Sk = 200, .D = 128, .mask = Mask::kNone},
          {.B = 1, .Hq = 2, .Hk = 1, .Sq = 100, .Sk = 256, .D = 128},
          {.B = 2, .Hq = 2, .Hk = 2, .Sq = 300, .Sk = 136, .D = 128, .mask = Mask::kNone},
          {.B = 2, .Hq = wide, .Hk = wide, .Sq = 256, .Sk = 256, .D = 128},
          {.B = 1, .Hq = 4, .Hk = 2, .Sq = 512, .Sk = 512, .D = 128},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 300, .Sk = 448, .D = 128},
          {.B = 2, .Hq = 2, .Hk = 2, .Sq = 504, .Sk = 504, .D = 128, .mask = Mask::kNone},
          {.B = 1, .Hq = wide, .Hk = wide, .Sq = 512, .Sk = 512, .D = 128},
          {.B = 1, .Hq = 2, .Hk = 1, .Sq = 1024, .Sk = 1024, .D = 128},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 1000, .Sk = 1000, .D = 128, .mask = Mask::kNone},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 63, .Sk = 1024, .D = 128},
          {.B = 1, .Hq = 3, .Hk = 3, .Sq = 1024, .Sk = 1024, .D = 128},
          {.B = 3, .Hq = 1, .Hk = 1, .Sq = 256, .Sk = 256, .D = 128},
          {.B = 1, .Hq = 4, .Hk = 2, .Sq = 300, .Sk = 448, .D = 128},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 960, .Sk = 960, .D = 128},
          {.B = 2, .Hq = 3, .Hk = 3, .Sq = 512, .Sk = 512, .D = 128},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 1024, .Sk = 1024, .D = 128, .dtype = DType::kFloat16},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 512, .Sk = 512, .D = 128, .dtype = DType::kFloat16, .mask = Mask::kNone}};
}

INSTANTIATE_TEST_SUITE_P(Edges, GpuSpCluster, ::testing::ValuesIn(cluster_cases()), param_name);

// dK out of TMA's reach (rows padded by an odd number of elements): the dK warpgroup stores dK from its registers
// instead of staging it in K's buffer for the dK store thread's TMA. Against the CPU backend, and bit for bit
// against dK in TMA's reach (the same rounding of the same sums), in one CTA and in clusters of two (dQ then bit
// for bit too) and four.
class GpuSpDkOutOfTmaReach : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuSpDkOutOfTmaReach, SameAsByTma) {
  const Case& c = GetParam();
  const int cluster = int((c.Sk + 127) / 128);
  const auto launch = [cluster](const Problem& prob, CUstream_st* s) {
    return cluster == 1 ? run_single_pass(prob, SpForm::kDispatched, s) : run_single_pass_cluster(prob, cluster, s);
  };
  const Inputs in = make_inputs(c, test_seed());
  constexpr const char* kNames[] = {"dK by TMA", "dK from registers"};
  const Stream stream;
  const DeviceInputs dev(in);
  std::vector<Outputs> outs;
  outs.reserve(std::size(kNames));
  run_poisoned(c, dev, stream.get(), launch, outs);
  ASSERT_FALSE(HasFatalFailure()) << kNames[0];
  run_poisoned(c, dev, stream.get(), launch, outs, Layout::kOddPaddedRows);
  ASSERT_FALSE(HasFatalFailure()) << kNames[1];
  expect_close_to_cpu(c, in, outs, kNames);
  int64_t differ = 0;
  for (int64_t i = 0; i < outs[0].dk.numel(); ++i) differ += outs[0].dk.get(i) != outs[1].dk.get(i);
  EXPECT_EQ(differ, 0) << "dK values that differ between the two stores";
  if (cluster <= 2) {
    EXPECT_TRUE(bitwise_equal(outs[0].dq, outs[1].dq)) << "dq";
  }
}

// One CTA (a tile's keys past Sk, grouped heads; 400 tiles, three or more a CTA on up to 132 SMs, so that both K
// buffers come back to the load thread), causal pairs in clusters of two, and unmasked rows in clusters of four
// with keys past Sk.
INSTANTIATE_TEST_SUITE_P(Edges, GpuSpDkOutOfTmaReach,
                         ::testing::Values(Case{.B = 2, .Hq = 4, .Hk = 2, .Sq = 128, .Sk = 120, .D = 128},
                                           Case{.B = 4, .Hq = 100, .Hk = 100, .Sq = 128, .Sk = 128, .D = 128},
                                           Case{.B = 1, .Hq = 2, .Hk = 2, .Sq = 256, .Sk = 256, .D = 128},
                                           Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 200, .Sk = 456, .D = 128,
                                                .mask = Mask::kNone}),
                         param_name);

// Saved-P (P given, NaN in its masked positions as in dP's): P read into the block's dS buffer, D = Σ P · dP over
// the cluster's keys. One CTA and clusters of 2, 4 and 8 through check_cluster:
// causal and unmasked, grouped query heads, cut blocks (keys past Sk, rows past Sq, Sq < Sk), a negative scale
// (dS carries the signed scale in bf16), more tiles than SMs (every dS buffer and dP slot reused), fp16; and dP close
// to D, where D's sum over the cluster must be exact to the fp32 bracket.
class GpuSpSavedP : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuSpSavedP, AgainstCpuAndItself) { check_cluster(GetParam(), make_inputs(GetParam(), test_seed())); }

std::vector<Case> saved_p_cases() {
  const int64_t wide = small_shapes() ? 40 : 150;
  constexpr Variant kP = Variant::kSavedP;
  return {{.B = 2, .Hq = wide, .Hk = wide, .Sq = 128, .Sk = 128, .D = 128, .variant = kP},
          {.B = 2, .Hq = 8, .Hk = 1, .Sq = 128, .Sk = 128, .D = 128, .variant = kP},
          {.B = 3, .Hq = 4, .Hk = 2, .Sq = 65, .Sk = 8, .D = 128, .variant = kP},
          {.B = 1, .Hq = 3, .Hk = 3, .Sq = 1, .Sk = 72, .D = 128, .mask = Mask::kNone, .variant = kP, .scale = -0.3},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 192, .Sk = 128, .D = 128, .dtype = DType::kFloat16, .mask = Mask::kNone,
           .variant = kP},
          {.B = 2, .Hq = 4, .Hk = 2, .Sq = 256, .Sk = 256, .D = 128, .variant = kP},
          {.B = 1, .Hq = 2, .Hk = 1, .Sq = 100, .Sk = 256, .D = 128, .variant = kP, .scale = -0.2},
          {.B = 2, .Hq = wide, .Hk = wide, .Sq = 256, .Sk = 256, .D = 128, .variant = kP},
          {.B = 2, .Hq = 2, .Hk = 2, .Sq = 504, .Sk = 504, .D = 128, .mask = Mask::kNone, .variant = kP},
          {.B = 1, .Hq = 4, .Hk = 2, .Sq = 300, .Sk = 448, .D = 128, .variant = kP},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 512, .Sk = 512, .D = 128, .dtype = DType::kFloat16, .variant = kP},
          {.B = 1, .Hq = 2, .Hk = 1, .Sq = 1024, .Sk = 1024, .D = 128, .variant = kP},
          {.B = 1, .Hq = 3, .Hk = 3, .Sq = 1024, .Sk = 1024, .D = 128, .variant = kP},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 1000, .Sk = 1000, .D = 128, .mask = Mask::kNone, .variant = kP},
          {.B = 1, .Hq = 2, .Hk = 2, .Sq = 1024, .Sk = 1024, .D = 128, .dtype = DType::kFloat16, .variant = kP}};
}

INSTANTIATE_TEST_SUITE_P(Edges, GpuSpSavedP, ::testing::ValuesIn(saved_p_cases()), param_name);

class GpuSpSavedPDpCloseToD : public GpuTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuSpSavedPDpCloseToD, AgainstCpuAndItself) {
  check_cluster(GetParam(), inputs_with_dp_close_to_d(GetParam(), test_seed()));
}

INSTANTIATE_TEST_SUITE_P(Edges, GpuSpSavedPDpCloseToD,
                         ::testing::Values(Case{.B = 1, .Hq = 2, .Hk = 1, .Sq = 1024, .Sk = 1024, .D = 128,
                                                .variant = Variant::kSavedP},
                                           Case{.B = 1, .Hq = 2, .Hk = 2, .Sq = 512, .Sk = 512, .D = 128,
                                                .dtype = DType::kFloat16, .mask = Mask::kNone,
                                                .variant = Variant::kSavedP}),
                         param_name);

}  // namespace
}  // namespace qksoftmax::test
