#include "validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "counters.h"
#include "dtype.h"

namespace qksoftmax {
namespace {

constexpr int kOperandRank = 4;  // (b, h, row, col)
constexpr int kLseRank = 3;      // (b, h, row)
constexpr int kRowDim = 2;
constexpr int kColDim = 3;
// Sequence lengths and the head dimension are indexed with 32-bit integers inside a head.
constexpr int64_t kMaxExtent = std::numeric_limits<int32_t>::max();
constexpr size_t kLseElementBytes = sizeof(float);

// What a tensor argument is, which fixes its rank, dimension names, dtype rule and expected shape.
enum class Kind : uint8_t { kQ, kK, kProbs, kLse, kDq, kDk };
enum class Role : uint8_t { kInput, kOutput };

struct Arg {
  const char* name;
  const TensorDesc* desc;
  Kind kind;
  Role role;
};

// The tensors of one call, in place (validation allocates nothing on the heap: it runs on every call).
constexpr size_t kMaxArgs = 7;  // backward: q, k, dp, p, lse, dq, dk
class ArgList {
 public:
  ArgList(std::initializer_list<Arg> args) {
    for (const Arg& arg : args) push_back(arg);
  }
  void push_back(const Arg& arg) { items_[count_++] = arg; }
  operator std::span<const Arg>() const { return {items_.data(), count_}; }

 private:
  std::array<Arg, kMaxArgs> items_{};
  size_t count_ = 0;
};

int rank_of(Kind kind) { return kind == Kind::kLse ? kLseRank : kOperandRank; }

const char* dims_of(Kind kind) {
  switch (kind) {
    case Kind::kQ:
    case Kind::kDq: return "(B, Hq, Sq, D)";
    case Kind::kK:
    case Kind::kDk: return "(B, Hk, Sk, D)";
    case Kind::kProbs: return "(B, Hq, Sq, Sk)";
    case Kind::kLse: return "(B, Hq, Sq)";
  }
  return "?";
}

size_t element_bytes(const Arg& arg) {
  return arg.kind == Kind::kLse ? kLseElementBytes : dtype_size(arg.desc->dtype);
}

Status invalid(const std::string& name, const std::string& what) {
  return {Code::kInvalidArgument, name + ": " + what};
}

// A double as "%g" prints it, the non-finite ones spelt out (no iostream on the validation path).
std::string number_str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

std::string tuple_str(const int64_t* values, int count) {
  std::string out = "(";
  for (int i = 0; i < count; ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + ")";
}

std::string shape_str(const TensorDesc& t) { return tuple_str(t.shape, t.rank); }
std::string strides_str(const TensorDesc& t) { return tuple_str(t.stride, t.rank); }

bool valid_dtype(DType t) {
  return t == DType::kBFloat16 || t == DType::kFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}
bool valid_device(Device d) { return d == Device::kCPU || d == Device::kCUDA; }
const char* device_name(Device d) { return d == Device::kCUDA ? "cuda" : "cpu"; }

// Rank, enum values, sizes, signs of strides and element alignment: what one tensor must satisfy alone.
Status check_alone(const Arg& arg) {
  const TensorDesc& t = *arg.desc;
  const int rank = rank_of(arg.kind);
  if (t.rank != rank) {
    return invalid(arg.name, "expected rank " + std::to_string(rank) + " " + dims_of(arg.kind) + ", got rank " +
                                 std::to_string(t.rank));
  }
  if (!valid_dtype(t.dtype)) {
    return invalid(arg.name, "expected dtype bfloat16, float16, float32 or float64, got DType value " +
                                 std::to_string(int(t.dtype)));
  }
  if (!valid_device(t.device)) {
    return invalid(arg.name, "expected device Device::kCPU or Device::kCUDA, got Device value " +
                                 std::to_string(int(t.device)));
  }
  if (std::any_of(t.shape, t.shape + rank, [](int64_t n) { return n < 1; })) {
    return invalid(arg.name, std::string("expected every dimension of ") + dims_of(arg.kind) +
                                 " to be >= 1, got shape " + shape_str(t));
  }
  if (std::any_of(t.stride, t.stride + rank, [](int64_t s) { return s < 0; })) {
    return invalid(arg.name, "expected non-negative strides, got " + strides_str(t));
  }
  const size_t align = element_bytes(arg);
  if (reinterpret_cast<uintptr_t>(t.data) % align != 0) {
    return invalid(arg.name, "expected data aligned to " + std::to_string(align) + " bytes (one element), got " +
                                 "an address " + std::to_string(reinterpret_cast<uintptr_t>(t.data) % align) +
                                 " bytes past that");
  }
  return {};
}

// q and k agree on the batch and head dimension, and k's heads divide q's.
Status check_q_k(const TensorDesc& q, const TensorDesc& k) {
  if (k.shape[0] != q.shape[0] || k.shape[kColDim] != q.shape[kColDim]) {
    return invalid("k", "expected shape (B, Hk, Sk, D) with B = " + std::to_string(q.shape[0]) + " and D = " +
                            std::to_string(q.shape[kColDim]) + " like q " + shape_str(q) + ", got " + shape_str(k));
  }
  if (q.shape[1] % k.shape[1] != 0) {
    return invalid("k", "expected a head count Hk that divides q's Hq = " + std::to_string(q.shape[1]) +
                            ", got shape " + shape_str(k));
  }
  struct Extent {
    const char* arg;
    const char* label;
    int64_t value;
  };
  for (const Extent& e : {Extent{"q", "Sq", q.shape[kRowDim]}, Extent{"k", "Sk", k.shape[kRowDim]},
                          Extent{"q", "D", q.shape[kColDim]}}) {
    if (e.value > kMaxExtent) {
      return invalid(e.arg, std::string("expected ") + e.label + " <= " + std::to_string(kMaxExtent) + ", got " +
                                std::to_string(e.value));
    }
  }
  return {};
}

// The shape an argument must have given q and k, and how to say where it comes from.
std::pair<std::array<int64_t, kMaxRank>, const char*> expected_shape(Kind kind, const TensorDesc& q,
                                                                     const TensorDesc& k) {
  const int64_t batch = q.shape[0], q_heads = q.shape[1], q_len = q.shape[kRowDim];
  switch (kind) {
    case Kind::kQ:
    case Kind::kDq: return {{q.shape[0], q.shape[1], q.shape[2], q.shape[3]}, "like q"};
    case Kind::kK:
    case Kind::kDk: return {{k.shape[0], k.shape[1], k.shape[2], k.shape[3]}, "like k"};
    case Kind::kProbs: return {{batch, q_heads, q_len, k.shape[kRowDim]}, "= (B, Hq, Sq, Sk) of q and k"};
    case Kind::kLse: return {{batch, q_heads, q_len, 0}, "= (B, Hq, Sq) of q"};
  }
  return {};
}

Status check_shape(const Arg& arg, const TensorDesc& q, const TensorDesc& k) {
  const auto [shape, origin] = expected_shape(arg.kind, q, k);
  const int rank = rank_of(arg.kind);
  if (!std::equal(shape.begin(), shape.begin() + rank, arg.desc->shape)) {
    return invalid(arg.name, "expected shape " + tuple_str(shape.data(), rank) + " " + origin + ", got " +
                                 shape_str(*arg.desc));
  }
  return {};
}

Status check_dtype_and_device(const Arg& arg, const TensorDesc& q) {
  const TensorDesc& t = *arg.desc;
  if (arg.kind == Kind::kLse && t.dtype != DType::kFloat32) {
    return invalid(arg.name, std::string("expected dtype float32, got ") + dtype_name(t.dtype));
  }
  if (arg.kind != Kind::kLse && t.dtype != q.dtype) {
    return invalid(arg.name, std::string("expected dtype ") + dtype_name(q.dtype) + " like q, got " +
                                 dtype_name(t.dtype));
  }
  if (t.device != q.device) {
    return invalid(arg.name, std::string("expected device ") + device_name(q.device) + " like q, got " +
                                 device_name(t.device));
  }
  if (t.device == Device::kCUDA) {
    const int last = rank_of(arg.kind) - 1;
    if (t.shape[last] > 1 && t.stride[last] != 1) {
      return invalid(arg.name, "expected stride 1 in the last dimension on the CUDA device (contiguous rows; " +
                                   std::string("copy the tensor first), got strides ") + strides_str(t));
    }
  }
  return {};
}

// CUDA tensors that declare their device (TensorDesc::device_index >= 0) declare the same one.
Status check_device_indices(std::span<const Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& arg : args) {
    if (arg.desc->device != Device::kCUDA || arg.desc->device_index < 0) continue;
    if (first == nullptr) {
      first = &arg;
    } else if (arg.desc->device_index != first->desc->device_index) {
      return invalid(arg.name, "expected device cuda:" + std::to_string(first->desc->device_index) + " like " +
                                   first->name + ", got cuda:" + std::to_string(arg.desc->device_index) +
                                   " (the tensors of a call must be on one device)");
    }
  }
  return {};
}

// Inclusive byte range [first, last] that a tensor's elements occupy.
struct ByteSpan {
  uintptr_t first = 0, last = 0;
  bool intersects(const ByteSpan& o) const { return first <= o.last && o.first <= last; }
};

std::optional<ByteSpan> byte_span(const Arg& arg) {
  const TensorDesc& t = *arg.desc;
  int64_t last_element = 0;
  for (int d = 0; d < t.rank; ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &reach) ||
        __builtin_add_overflow(last_element, reach, &last_element)) {
      return std::nullopt;
    }
  }
  int64_t elements = 0, bytes = 0;
  uintptr_t last = 0;
  if (__builtin_add_overflow(last_element, 1, &elements) ||
      __builtin_mul_overflow(elements, int64_t(element_bytes(arg)), &bytes) ||
      __builtin_add_overflow(reinterpret_cast<uintptr_t>(t.data), uintptr_t(bytes - 1), &last)) {
    return std::nullopt;
  }
  return ByteSpan{reinterpret_cast<uintptr_t>(t.data), last};
}

// Conservative: sorted by stride, every dimension of size > 1 must step over all the elements that the
// smaller-strided dimensions reach. Strided views that interleave without colliding are rejected too.
bool may_overlap_itself(const TensorDesc& t) {
  std::array<std::pair<int64_t, int64_t>, kMaxRank> dims;  // (stride, size)
  size_t count = 0;
  for (int d = 0; d < t.rank; ++d) {
    if (t.shape[d] > 1) dims[count++] = {t.stride[d], t.shape[d]};
  }
  for (size_t i = 1; i < count; ++i) {  // insertion sort: at most kMaxRank entries
    for (size_t j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  int64_t min_stride = 1;
  for (const auto& [stride, size] : std::span(dims.data(), count)) {
    if (stride < min_stride) return true;
    if (__builtin_mul_overflow(stride, size, &min_stride)) min_stride = std::numeric_limits<int64_t>::max();
  }
  return false;
}

Status check_memory(std::span<const Arg> args) {
  std::array<ByteSpan, kMaxArgs> spans;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::optional<ByteSpan> span = byte_span(args[i]);
    if (!span) {
      return invalid(args[i].name, "expected shape and strides that address less than 2^63 bytes, got shape " +
                                       shape_str(*args[i].desc) + " strides " + strides_str(*args[i].desc));
    }
    spans[i] = *span;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].role != Role::kOutput) continue;
    if (may_overlap_itself(*args[i].desc)) {
      return invalid(args[i].name, "expected an output whose elements do not overlap each other, got shape " +
                                       shape_str(*args[i].desc) + " strides " + strides_str(*args[i].desc));
    }
    for (size_t j = 0; j < args.size(); ++j) {
      if (j != i && spans[i].intersects(spans[j])) {
        return invalid(args[i].name, std::string("expected an output whose memory does not overlap ") +
                                         args[j].name + "'s, but their byte ranges intersect");
      }
    }
  }
  return {};
}

// args[0] is q and args[1] is k; every argument listed is present.
Status check_args(std::span<const Arg> args) {
  for (const Arg& arg : args) {
    if (Status s = check_alone(arg); !s.ok()) return s;
  }
  const TensorDesc& q = *args[0].desc;
  const TensorDesc& k = *args[1].desc;
  if (Status s = check_q_k(q, k); !s.ok()) return s;
  for (const Arg& arg : args) {
    if (Status s = check_shape(arg, q, k); !s.ok()) return s;
    if (Status s = check_dtype_and_device(arg, q); !s.ok()) return s;
  }
  if (Status s = check_device_indices(args); !s.ok()) return s;
  if (Status s = check_memory(args); !s.ok()) return s;
  // Valid, but only the CPU backend implements fp64; every other tensor has q's dtype and device by now.
  if (q.dtype == DType::kFloat64 && q.device == Device::kCUDA) {
    return {Code::kUnsupported, std::string(args[0].name) + ": float64 runs on the CPU backend only"};
  }
  return {};
}

// A tensor the call needs, and what it is.
struct Required {
  const char* name;
  const TensorDesc* desc;
  const char* what;
};

Status check_present(std::initializer_list<Required> required) {
  for (const Required& r : required) {
    if (!r.desc->present()) {
      return invalid(r.name, std::string("expected a tensor ") + r.what + ", got none (data is null)");
    }
  }
  return {};
}

Status check_mask(Mask mask) {
  if (mask == Mask::kNone || mask == Mask::kCausal) return {};
  return invalid("options.mask",
                 "expected Mask::kNone or Mask::kCausal, got Mask value " + std::to_string(int(mask)));
}

Status resolve_scale(const Options& options, int64_t head_dim, double* scale) {
  if (!options.scale) {
    *scale = 1.0 / std::sqrt(double(head_dim));
    return {};
  }
  const double value = *options.scale;
  // A finite double beyond float's range would become infinite in the float32 kernels.
  if (!std::isfinite(value) || std::fabs(value) > std::numeric_limits<float>::max()) {
    return invalid("options.scale", "expected a finite value within float32 range, got " + number_str(value));
  }
  *scale = value;
  return {};
}

Operand operand_of(const TensorDesc& t) {
  if (!t.present()) return {};
  if (t.rank == kLseRank) return {t.data, t.stride[0], t.stride[1], t.stride[2], 0};
  return {t.data, t.stride[0], t.stride[1], t.stride[2], t.stride[3]};
}

// The fields common to both passes, from validated q, k, options and every tensor of the call.
Status fill_common(const TensorDesc& q, const TensorDesc& k, std::initializer_list<const TensorDesc*> tensors,
                   const Options& options, Problem* problem) {
  double scale = 0;
  if (Status s = resolve_scale(options, q.shape[kColDim], &scale); !s.ok()) return s;
  problem->B = q.shape[0];
  problem->Hq = q.shape[1];
  problem->Hk = k.shape[1];
  problem->Sq = q.shape[kRowDim];
  problem->Sk = k.shape[kRowDim];
  problem->D = q.shape[kColDim];
  problem->dtype = q.dtype;
  problem->device = q.device;
  problem->device_index = -1;
  problem->devices_declared = true;
  if (q.device == Device::kCUDA) {
    for (const TensorDesc* t : tensors) {
      if (!t->present()) continue;
      if (t->device_index < 0) {
        problem->devices_declared = false;
      } else {
        problem->device_index = t->device_index;  // all declared indices agree (check_device_indices)
      }
    }
  }
  problem->mask = options.mask;
  problem->deterministic = options.deterministic;
  problem->scale = float(scale);
  problem->scale_f64 = scale;
  problem->q = operand_of(q);
  problem->k = operand_of(k);
  return {};
}

}  // namespace

Status make_problem(const ForwardArgs& args, const Options& options, Problem* problem) {
  detail::count(detail::call_counters().validations);
  if (Status s = check_mask(options.mask); !s.ok()) return s;
  if (Status s = check_present({{"q", &args.q, "(B, Hq, Sq, D)"},
                                 {"k", &args.k, "(B, Hk, Sk, D)"},
                                 {"p", &args.p, "(B, Hq, Sq, Sk) for the output probabilities"}});
      !s.ok()) {
    return s;
  }
  ArgList list = {{"q", &args.q, Kind::kQ, Role::kInput},
                  {"k", &args.k, Kind::kK, Role::kInput},
                  {"p", &args.p, Kind::kProbs, Role::kOutput}};
  if (args.lse.present()) list.push_back({"lse", &args.lse, Kind::kLse, Role::kOutput});
  if (Status s = check_args(list); !s.ok()) return s;

  Problem result;
  if (Status s = fill_common(args.q, args.k, {&args.q, &args.k, &args.p, &args.lse}, options, &result); !s.ok()) {
    return s;
  }
  result.pass = Pass::kForward;
  result.out_p = operand_of(args.p);
  result.out_lse = operand_of(args.lse);
  *problem = result;
  return {};
}

Status make_problem(const BackwardArgs& args, const Options& options, Problem* problem) {
  detail::count(detail::call_counters().validations);
  if (Status s = check_mask(options.mask); !s.ok()) return s;
  if (options.mode != BackwardMode::kRecompute && options.mode != BackwardMode::kSavedP) {
    return invalid("options.mode", "expected BackwardMode::kRecompute or BackwardMode::kSavedP, got "
                                   "BackwardMode value " + std::to_string(int(options.mode)));
  }
  const bool saved_p = options.mode == BackwardMode::kSavedP;
  if (Status s = check_present({{"q", &args.q, "(B, Hq, Sq, D)"},
                                 {"k", &args.k, "(B, Hk, Sk, D)"},
                                 {"dp", &args.dp, "(B, Hq, Sq, Sk)"},
                                 {"dq", &args.dq, "(B, Hq, Sq, D) for the output dq"},
                                 {"dk", &args.dk, "(B, Hk, Sk, D) for the output dk"}});
      !s.ok()) {
    return s;
  }
  if (saved_p) {
    if (Status s = check_present({{"p", &args.p, "(B, Hq, Sq, Sk) in saved-P mode (BackwardMode::kSavedP)"}});
        !s.ok()) {
      return s;
    }
  } else if (args.p.present()) {
    return invalid("p", "expected no tensor in recompute mode (BackwardMode::kRecompute), got one; set "
                        "options.mode = BackwardMode::kSavedP to use it");
  }
  ArgList list = {{"q", &args.q, Kind::kQ, Role::kInput},
                  {"k", &args.k, Kind::kK, Role::kInput},
                  {"dp", &args.dp, Kind::kProbs, Role::kInput}};
  if (args.p.present()) list.push_back({"p", &args.p, Kind::kProbs, Role::kInput});
  if (args.lse.present()) list.push_back({"lse", &args.lse, Kind::kLse, Role::kInput});
  list.push_back({"dq", &args.dq, Kind::kDq, Role::kOutput});
  list.push_back({"dk", &args.dk, Kind::kDk, Role::kOutput});
  if (Status s = check_args(list); !s.ok()) return s;

  Problem result;
  if (Status s = fill_common(args.q, args.k, {&args.q, &args.k, &args.dp, &args.p, &args.lse, &args.dq, &args.dk},
                             options, &result);
      !s.ok()) {
    return s;
  }
  result.pass = Pass::kBackward;
  result.mode = options.mode;
  result.dp = operand_of(args.dp);
  result.p = operand_of(args.p);
  // Saved-P mode does not need the statistics: a given lse is checked (here and where the CUDA backend
  // locates the tensors' memory) but not used.
  result.lse = saved_p ? Operand{} : operand_of(args.lse);
  result.unread_lse = saved_p ? operand_of(args.lse) : Operand{};
  result.dq = operand_of(args.dq);
  result.dk = operand_of(args.dk);
  *problem = result;
  return {};
}

}  // namespace qksoftmax
