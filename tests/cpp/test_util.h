// What the C++ tests share: host tensors of several layouts, test cases, random inputs, error measures.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "accuracy.h"
#include "dtype.h"
#include "qksoftmax/qksoftmax.h"

namespace qksoftmax::test {

// 0xFF bytes are a NaN in every dtype: what outputs hold before a run (the GPU tests poison the same way).
constexpr std::byte kPoisonByte{0xFF};
// Row padding, in elements: a multiple of 8 keeps rows 16-byte aligned; an odd one misaligns them.
constexpr int64_t kAlignedRowPadding = 8;
constexpr int64_t kOddRowPadding = 3;
constexpr int64_t kWideStride = 2;
constexpr int64_t kRowAlignment = 8;  // elements: rows of kAlignedRows start 16-byte aligned (16-bit dtypes)

enum class Layout : uint8_t {
  kContiguous,
  kHeadsTransposed,  // a (B, S, H, X) buffer viewed as (B, H, S, X) (rank 4 only; rank 3 stays contiguous)
  kPaddedRows,       // row-major with kAlignedRowPadding unused elements after every row
  kOddPaddedRows,    // the same with kOddRowPadding
  kWideLastDim,      // row-major over every other element: last-dimension stride kWideStride
  kAlignedRows,      // row-major, every row stride rounded up to kRowAlignment elements (TMA-ready at any size)
};

inline const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous: return "contiguous";
    case Layout::kHeadsTransposed: return "heads_transposed";
    case Layout::kPaddedRows: return "padded_rows";
    case Layout::kOddPaddedRows: return "odd_padded_rows";
    case Layout::kWideLastDim: return "wide_last_dim";
    case Layout::kAlignedRows: return "aligned_rows";
  }
  return "?";
}

inline std::vector<int64_t> strides_for(const std::vector<int64_t>& shape, Layout layout) {
  const size_t rank = shape.size();
  std::vector<int64_t> strides(rank);
  if (layout == Layout::kHeadsTransposed && rank == kMaxRank) {
    strides[3] = 1;
    strides[1] = shape[3];
    strides[2] = shape[1] * shape[3];
    strides[0] = shape[2] * strides[2];
    return strides;
  }
  const int64_t step = layout == Layout::kWideLastDim ? kWideStride : 1;
  const int64_t pad = layout == Layout::kPaddedRows      ? kAlignedRowPadding
                      : layout == Layout::kOddPaddedRows ? kOddRowPadding
                                                         : 0;
  strides[rank - 1] = step;
  strides[rank - 2] = layout == Layout::kAlignedRows
                          ? (shape[rank - 1] + kRowAlignment - 1) / kRowAlignment * kRowAlignment
                          : shape[rank - 1] * step + pad;
  for (size_t d = rank - 2; d-- > 0;) strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

// A strided tensor in host memory that owns its storage. Storage starts poisoned (kPoisonByte), so
// elements outside the view (padding, gaps) stay poisoned unless something writes where it must not.
class HostTensor {
 public:
  HostTensor(DType dtype, std::vector<int64_t> shape, Layout layout = Layout::kContiguous)
      : dtype_(dtype), shape_(std::move(shape)), strides_(strides_for(shape_, layout)) {
    int64_t last = 0;
    for (size_t d = 0; d < shape_.size(); ++d) last += (shape_[d] - 1) * strides_[d];
    storage_.assign((last + 1) * dtype_size(dtype_), kPoisonByte);
  }

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  std::vector<std::byte>& storage() { return storage_; }
  const std::vector<std::byte>& storage() const { return storage_; }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return n;
  }
  // Storage element of the element with row-major index `flat`.
  int64_t offset(int64_t flat) const {
    int64_t off = 0;
    for (size_t d = shape_.size(); d-- > 0;) {
      off += flat % shape_[d] * strides_[d];
      flat /= shape_[d];
    }
    return off;
  }
  double get(int64_t flat) const { return load_as_double(storage_.data(), offset(flat), dtype_); }
  void set(int64_t flat, double v) { store_from_double(storage_.data(), offset(flat), dtype_, v); }

  std::vector<double> values() const {
    std::vector<double> out(numel());
    for (int64_t i = 0; i < numel(); ++i) out[i] = get(i);
    return out;
  }

  // The view as the API takes it; data defaults to this tensor's own storage.
  TensorDesc desc(void* data = nullptr, Device device = Device::kCPU) const {
    TensorDesc t;
    t.data = data ? data : const_cast<std::byte*>(storage_.data());
    t.dtype = dtype_;
    t.device = device;
    t.rank = int(shape_.size());
    for (int d = 0; d < t.rank; ++d) {
      t.shape[d] = shape_[d];
      t.stride[d] = strides_[d];
    }
    return t;
  }

  // A contiguous copy in another dtype (exact when widening).
  HostTensor converted(DType dtype) const {
    HostTensor out(dtype, shape_);
    for (int64_t i = 0; i < numel(); ++i) out.set(i, get(i));
    return out;
  }

  // True if no byte outside the view was written.
  bool padding_untouched() const {
    const size_t elem = dtype_size(dtype_);
    std::vector<bool> in_view(storage_.size() / elem, false);
    for (int64_t i = 0; i < numel(); ++i) in_view[offset(i)] = true;
    for (size_t e = 0; e < in_view.size(); ++e) {
      for (size_t b = 0; b < elem && !in_view[e]; ++b) {
        if (storage_[e * elem + b] != kPoisonByte) return false;
      }
    }
    return true;
  }

 private:
  DType dtype_;
  std::vector<int64_t> shape_, strides_;
  std::vector<std::byte> storage_;
};

enum class Variant : uint8_t { kRecompute, kRecomputeLse, kSavedP };

inline const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kRecompute: return "recompute";
    case Variant::kRecomputeLse: return "recompute_lse";
    case Variant::kSavedP: return "saved_p";
  }
  return "?";
}

// The test-name suffix of a suite parameterised by Variant.
inline std::string variant_param_name(const ::testing::TestParamInfo<Variant>& info) {
  return variant_name(info.param);
}

constexpr DType kAllDTypes[] = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};
constexpr Mask kAllMasks[] = {Mask::kNone, Mask::kCausal};
constexpr Variant kAllVariants[] = {Variant::kRecompute, Variant::kRecomputeLse, Variant::kSavedP};

// One forward + backward problem: shapes, dtype, options, layout of every tensor.
struct Case {
  int64_t B = 1, Hq = 1, Hk = 1, Sq = 1, Sk = 1, D = 64;
  DType dtype = DType::kBFloat16;
  Mask mask = Mask::kCausal;
  Variant variant = Variant::kRecompute;
  Layout layout = Layout::kContiguous;
  std::optional<double> scale = std::nullopt;
  bool deterministic = false;
  std::optional<Layout> out_layout = std::nullopt;  // the outputs' layout where it differs from the inputs'

  Layout output_layout() const { return out_layout.value_or(layout); }

  std::vector<int64_t> q_shape() const { return {B, Hq, Sq, D}; }
  std::vector<int64_t> k_shape() const { return {B, Hk, Sk, D}; }
  std::vector<int64_t> probs_shape() const { return {B, Hq, Sq, Sk}; }
  std::vector<int64_t> lse_shape() const { return {B, Hq, Sq}; }
  Options options() const {
    Options o;
    o.scale = scale;
    o.mask = mask;
    o.mode = variant == Variant::kSavedP ? BackwardMode::kSavedP : BackwardMode::kRecompute;
    o.deterministic = deterministic;
    return o;
  }
};

// A GoogleTest parameter name: letters, digits and underscores only.
inline std::string case_name(const Case& c) {
  std::string name = std::string(dtype_name(c.dtype)) + (c.mask == Mask::kCausal ? "_causal_" : "_full_") +
                     variant_name(c.variant) + "_B" + std::to_string(c.B) + "_H" + std::to_string(c.Hq) + "x" +
                     std::to_string(c.Hk) + "_S" + std::to_string(c.Sq) + "x" + std::to_string(c.Sk) + "_D" +
                     std::to_string(c.D) + "_" + layout_name(c.layout);
  if (c.scale) name += std::string(*c.scale < 0 ? "_scale_minus" : "_scale") + std::to_string(int(std::abs(*c.scale) * 1000));
  if (c.deterministic) name += "_deterministic";
  if (c.out_layout) name += std::string("_out_") + layout_name(*c.out_layout);
  return name;
}

inline std::string param_name(const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); }

// How GoogleTest prints a failing case's parameter.
inline void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

// A seed that differs per test and is stable from run to run (FNV-1a of the test's full name).
inline uint64_t test_seed() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char ch : name) hash = (hash ^ ch) * 1099511628211ull;
  return hash;
}

// Position (i, j) of a (…, Sq, Sk) tensor is masked: never read, written as 0 in P.
inline bool is_masked(Mask mask, int64_t i, int64_t j) { return mask == Mask::kCausal && j > i; }

template <class Visit>
void for_each_masked(const HostTensor& t, Mask mask, const Visit& visit) {
  const int64_t rows = t.shape()[2], cols = t.shape()[3];
  for (int64_t flat = 0; flat < t.numel(); ++flat) {
    if (is_masked(mask, flat / cols % rows, flat % cols)) visit(flat);
  }
}

inline void plant_nan_in_masked(HostTensor& t, Mask mask) {
  for_each_masked(t, mask, [&](int64_t flat) { t.set(flat, std::numeric_limits<double>::quiet_NaN()); });
}

inline void fill_normal(HostTensor& t, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
}

// Backward arguments from tensors of one kind (host tensors, or their device twins).
template <class Tensor>
BackwardArgs make_backward_args(const Tensor& q, const Tensor& k, const Tensor& dp, const std::optional<Tensor>& p,
                                const std::optional<Tensor>& lse, const TensorDesc& dq, const TensorDesc& dk) {
  BackwardArgs args;
  args.q = q.desc();
  args.k = k.desc();
  args.dp = dp.desc();
  if (p) args.p = p->desc();
  if (lse) args.lse = lse->desc();
  args.dq = dq;
  args.dk = dk;
  return args;
}

// The inputs of a case: q, k, dp ~ N(0, 1) (rounded to the dtype), NaN planted in dp's masked positions;
// P (saved-P) and LSE (recompute with lse) from the CPU backend's forward.
struct Inputs {
  HostTensor q, k, dp;
  std::optional<HostTensor> p, lse;

  Inputs converted(DType dtype) const {
    Inputs out{q.converted(dtype), k.converted(dtype), dp.converted(dtype), std::nullopt, std::nullopt};
    if (p) out.p = p->converted(dtype);
    if (lse) out.lse = lse->converted(DType::kFloat32);
    return out;
  }
  BackwardArgs backward_args(const TensorDesc& dq, const TensorDesc& dk) const {
    return make_backward_args(q, k, dp, p, lse, dq, dk);
  }
};

// The outputs of a case, poisoned: P and LSE of the forward, dQ and dK of the backward.
struct Outputs {
  HostTensor p, lse, dq, dk;

  Outputs(const Case& c, DType dtype, Layout layout)
      : p(dtype, c.probs_shape(), layout),
        lse(DType::kFloat32, c.lse_shape(), layout),
        dq(dtype, c.q_shape(), layout),
        dk(dtype, c.k_shape(), layout) {}
};

inline Status cpu_forward(const Case& c, const HostTensor& q, const HostTensor& k, Outputs& out) {
  const ForwardArgs args{q.desc(), k.desc(), out.p.desc(), out.lse.desc()};
  return forward(args, c.options(), nullptr, 0, nullptr);
}

// Forward into out.p / out.lse, then backward into out.dq / out.dk, on the CPU backend.
inline Status cpu_run(const Case& c, const Inputs& in, Outputs& out) {
  if (Status s = cpu_forward(c, in.q, in.k, out); !s.ok()) return s;
  return backward(in.backward_args(out.dq.desc(), out.dk.desc()), c.options(), nullptr, 0, nullptr);
}

inline Inputs make_inputs(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in{HostTensor(c.dtype, c.q_shape(), c.layout), HostTensor(c.dtype, c.k_shape(), c.layout),
            HostTensor(c.dtype, c.probs_shape(), c.layout), std::nullopt, std::nullopt};
  fill_normal(in.q, rng);
  fill_normal(in.k, rng);
  fill_normal(in.dp, rng);
  plant_nan_in_masked(in.dp, c.mask);
  if (c.variant != Variant::kRecompute) {
    Outputs fwd(c, c.dtype, c.layout);
    const Status s = cpu_forward(c, in.q, in.k, fwd);
    EXPECT_TRUE(s.ok()) << "forward for the inputs: " << s.message();
    if (c.variant == Variant::kSavedP) {
      plant_nan_in_masked(fwd.p, c.mask);
      in.p = std::move(fwd.p);
    } else {
      in.lse = std::move(fwd.lse);
    }
  }
  return in;
}

// ‖out − ref‖ / ‖ref‖ (the measure of accuracy.h; ‖out − ref‖ when ref is all zero). Infinite when out has
// a NaN or an infinity that ref does not have at the same place.
inline double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isfinite(ref[i])) norm += ref[i] * ref[i];
    if (out[i] == ref[i]) continue;  // equal infinities included
    if (!std::isfinite(out[i]) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    diff += (out[i] - ref[i]) * (out[i] - ref[i]);
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// What an fp64 computation rounded once to the output dtype can be off by: twice the unit roundoff
// (the CPU backend rounds through float32 first).
inline double rounding_tolerance(DType t) {
  constexpr int kBf16Mantissa = 8, kFp16Mantissa = 11, kFp32Mantissa = 24, kFp64Mantissa = 53;
  const int bits = t == DType::kBFloat16  ? kBf16Mantissa
                   : t == DType::kFloat16 ? kFp16Mantissa
                   : t == DType::kFloat32 ? kFp32Mantissa
                                          : kFp64Mantissa;
  return 2 * std::ldexp(1.0, -bits);
}

// Where out is furthest from ref: the element (its index in each dimension), its two values, and how many
// elements are off by more than `bound` times ref's largest magnitude; a failure's message, to tell a wrong block
// from noise spread over a tensor.
inline std::string worst_elements(const HostTensor& out, const std::vector<double>& values,
                                  const std::vector<double>& ref, double bound) {
  double scale = 0, worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isfinite(ref[i])) scale = std::max(scale, std::abs(ref[i]));
  }
  int64_t off = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = values[i] == ref[i] ? 0.0 : std::isfinite(values[i] - ref[i]) ? std::abs(values[i] - ref[i])
                                                                                    : HUGE_VAL;
    if (d > bound * scale) ++off;
    if (d > worst) worst = d, at = i;
  }
  std::string where;
  int64_t flat = int64_t(at);
  for (size_t d = out.shape().size(); d-- > 0;) {
    where = std::to_string(flat % out.shape()[d]) + (where.empty() ? "" : ", ") + where;
    flat /= out.shape()[d];
  }
  return "; furthest at (" + where + "): " + std::to_string(values[at]) + " against " + std::to_string(ref[at]) +
         "; " + std::to_string(off) + " of " + std::to_string(ref.size()) + " elements off by more than " +
         std::to_string(bound) + " of the largest magnitude";
}

inline void expect_close(const char* name, const HostTensor& out, const std::vector<double>& ref, double bound) {
  const std::vector<double> values = out.values();
  const double err = relative_error(values, ref);
  EXPECT_LE(err, bound) << name << ": relative error " << err << " above " << bound
                        << (err > bound ? worst_elements(out, values, ref, bound) : "");
  EXPECT_TRUE(out.padding_untouched()) << name << ": written outside its view";
}

// Where every query row sees exactly one key, P is 1 and dS = P ∘ (dP − D) vanishes in exact arithmetic, so
// dQ and dK are rounding noise (with a given LSE, P = exp(S − LSE) is only nearly 1) and a relative error
// means nothing. There they are checked in absolute terms: the inputs are O(1).
inline bool gradients_vanish(const Case& c) { return c.Sk == 1 || (c.mask == Mask::kCausal && c.Sq == 1); }

inline void expect_gradient_close(const Case& c, const char* name, const HostTensor& out,
                                  const std::vector<double>& ref, double bound) {
  if (!gradients_vanish(c)) return expect_close(name, out, ref, bound);
  const std::vector<double> values = out.values();
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(values[i] - ref[i]);
    if (!(d <= worst)) worst = d;  // a NaN (an unwritten, poisoned output) sticks: fmax would drop it
  }
  EXPECT_TRUE(std::isfinite(worst) && worst <= bound) << name << ": absolute error " << worst << " above " << bound;
  EXPECT_TRUE(out.padding_untouched()) << name << ": written outside its view";
}

inline void expect_masked_zero(const HostTensor& p, Mask mask) {
  int64_t nonzero = 0;
  for_each_masked(p, mask, [&](int64_t flat) { nonzero += p.get(flat) != 0.0; });
  EXPECT_EQ(nonzero, 0) << "masked positions of p must be written as 0";
}

inline bool bitwise_equal(const HostTensor& a, const HostTensor& b) { return a.storage() == b.storage(); }

inline void expect_bitwise_equal(const Outputs& a, const Outputs& b) {
  EXPECT_TRUE(bitwise_equal(a.p, b.p)) << "p";
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(bitwise_equal(a.dq, b.dq)) << "dq";
  EXPECT_TRUE(bitwise_equal(a.dk, b.dk)) << "dk";
}

}  // namespace qksoftmax::test
