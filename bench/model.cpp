#include "model.h"

#include <algorithm>

#include "dtype.h"

namespace qkbench {
namespace {

constexpr double kLseBytesPerRow = 4;  // float32
constexpr double kFlopsPerGemmElement = 2;  // one multiply-add per live element and head-dimension column
constexpr double kGiga = 1e9;
constexpr double kTera = 1e12;
constexpr double kMicro = 1e6;

constexpr int64_t kSeedHeads = 128;
constexpr int64_t kSeedHeadDim = 128;
constexpr int64_t kSeedBatches[] = {1, 2, 4, 8};
constexpr int64_t kSeedLengths[] = {128, 256, 512, 1024};
constexpr int64_t kLongBatch = 1;
constexpr int64_t kLongHeads = 16;
constexpr int64_t kLongHeadDim = 128;
constexpr int64_t kLongLengths[] = {2048, 4096, 8192, 16384, 32768};

// The value among values whose name_of(value) is name.
template <typename T, size_t N>
std::optional<T> find_named(const T (&values)[N], const char* (*name_of)(T), std::string_view name) {
  for (T v : values)
    if (name == name_of(v)) return v;
  return std::nullopt;
}

Suite seed16() {
  Suite suite{"seed16", {}};
  for (int64_t b : kSeedBatches)
    for (int64_t s : kSeedLengths) suite.shapes.push_back({b, kSeedHeads, s, kSeedHeadDim});
  return suite;
}

Suite long_suite() {
  Suite suite{"long", {}};
  for (int64_t s : kLongLengths) suite.shapes.push_back({kLongBatch, kLongHeads, s, kLongHeadDim});
  return suite;
}

}  // namespace

const char* mode_name(Mode mode) {
  switch (mode) {
    case Mode::kForward: return "forward";
    case Mode::kRecompute: return "recompute";
    case Mode::kRecomputeLse: return "recompute_lse";
    case Mode::kSavedP: return "saved_p";
  }
  return "?";
}

std::optional<Mode> parse_mode(std::string_view name) { return find_named(kAllModes, mode_name, name); }

const char* dtype_short_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
    case DType::kFloat32: return "fp32";
    case DType::kFloat64: return "fp64";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) { return find_named(kAllDTypes, dtype_short_name, name); }

std::vector<Suite> suites_named(std::string_view name) {
  if (name == "seed16") return {seed16()};
  if (name == "long") return {long_suite()};
  if (name == "all") return {seed16(), long_suite()};
  return {};
}

double live_elements(const Shape& shape, Mask mask) {
  const double s = double(shape.S);
  const double per_head = mask == Mask::kCausal ? s * (s + 1) / 2 : s * s;
  return per_head * double(shape.heads());
}

Cost sol_cost(const Shape& shape, Mode mode, DType dtype, Mask mask) {
  const double e = double(qksoftmax::dtype_size(dtype));
  const double live = live_elements(shape, mask);
  const double qk_bytes = double(shape.qk_elements()) * e;  // one of q, k, dq, dk
  const double lse_bytes = double(shape.lse_elements()) * kLseBytesPerRow;
  const double gemm_flops = kFlopsPerGemmElement * double(shape.D) * live;
  switch (mode) {
    case Mode::kForward:
      return {2 * qk_bytes + double(shape.p_elements()) * e + lse_bytes, gemm_flops};
    case Mode::kRecompute:
      return {live * e + 4 * qk_bytes, 3 * gemm_flops};
    case Mode::kRecomputeLse:
      return {live * e + 4 * qk_bytes + lse_bytes, 3 * gemm_flops};
    case Mode::kSavedP:
      return {2 * live * e + 4 * qk_bytes, 2 * gemm_flops};
  }
  return {};
}

double gemm_flops_per_s(DType dtype, const Ceilings& ceilings) {
  switch (dtype) {
    case DType::kBFloat16: return ceilings.bf16_TFLOPs * kTera;
    case DType::kFloat16: return ceilings.fp16_TFLOPs * kTera;
    case DType::kFloat32: return ceilings.tf32_TFLOPs * kTera;
    case DType::kFloat64: break;  // the CPU backend's dtype only: never benchmarked on the GPU
  }
  return 0;
}

double sol_us(const Cost& cost, DType dtype, const Ceilings& ceilings) {
  const double memory_s = cost.bytes / (ceilings.copy_GBps * kGiga);
  const double math_s = cost.flops / gemm_flops_per_s(dtype, ceilings);
  return std::max(memory_s, math_s) * kMicro;
}

}  // namespace qkbench
