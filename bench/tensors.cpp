#include "tensors.h"

#include <algorithm>

#include "dtype.h"

namespace qkbench {
namespace {

using qksoftmax::Device;
using qksoftmax::TensorDesc;

constexpr int kMatrixRank = 4;  // (B, H, rows, cols)
constexpr int kLseRank = 3;     // (B, H, rows)

size_t aligned(size_t bytes) {
  constexpr size_t a = qksoftmax::kWorkspaceAlignment;
  return (bytes + a - 1) / a * a;
}

TensorDesc describe(const CaseSpec& spec, const TensorSet& set, Role role, Device device) {
  const Shape& s = spec.shape;
  TensorDesc d;
  d.data = set[role];
  d.dtype = role_dtype(role, spec.dtype);
  d.device = device;
  if (role == Role::kLse) {
    d.rank = kLseRank;
    const int64_t shape[kLseRank] = {s.B, s.H, s.S};
    const int64_t stride[kLseRank] = {s.H * s.S, s.S, 1};
    std::copy(shape, shape + kLseRank, d.shape);
    std::copy(stride, stride + kLseRank, d.stride);
    return d;
  }
  const int64_t cols = role_elements_per_head(role, s) / s.S;
  d.rank = kMatrixRank;
  const int64_t shape[kMatrixRank] = {s.B, s.H, s.S, cols};
  const int64_t stride[kMatrixRank] = {s.H * s.S * cols, s.S * cols, cols, 1};
  std::copy(shape, shape + kMatrixRank, d.shape);
  std::copy(stride, stride + kMatrixRank, d.stride);
  return d;
}

}  // namespace

const char* role_name(Role role) {
  switch (role) {
    case Role::kQ: return "Q";
    case Role::kK: return "K";
    case Role::kDp: return "dP";
    case Role::kP: return "P";
    case Role::kLse: return "LSE";
    case Role::kDq: return "dQ";
    case Role::kDk: return "dK";
    case Role::kCount: break;
  }
  return "?";
}

DType role_dtype(Role role, DType dtype) { return role == Role::kLse ? DType::kFloat32 : dtype; }

int64_t role_elements_per_head(Role role, const Shape& shape) {
  switch (role) {
    case Role::kQ:
    case Role::kK:
    case Role::kDq:
    case Role::kDk: return shape.S * shape.D;
    case Role::kDp:
    case Role::kP: return shape.S * shape.S;
    case Role::kLse: return shape.S;
    case Role::kCount: break;
  }
  return 0;
}

size_t role_bytes_per_head(Role role, const CaseSpec& spec) {
  return size_t(role_elements_per_head(role, spec.shape)) * qksoftmax::dtype_size(role_dtype(role, spec.dtype));
}

std::vector<Role> output_roles(Mode mode) {
  if (!is_backward(mode)) return {Role::kP, Role::kLse};
  return {Role::kDq, Role::kDk};
}

std::vector<Role> random_roles(Mode mode) {
  if (!is_backward(mode)) return {Role::kQ, Role::kK};
  return {Role::kQ, Role::kK, Role::kDp};
}

std::vector<Role> saved_roles(Mode mode) {
  if (reads_saved_p(mode)) return {Role::kP};
  if (reads_lse(mode)) return {Role::kLse};
  return {};
}

std::vector<Role> input_roles(Mode mode) {
  std::vector<Role> roles = random_roles(mode);
  for (Role r : saved_roles(mode)) roles.push_back(r);
  return roles;
}

std::vector<Role> set_roles(Mode mode) {
  std::vector<Role> roles = input_roles(mode);
  for (Role r : output_roles(mode)) roles.push_back(r);
  return roles;
}

size_t set_bytes(const CaseSpec& spec) {
  size_t total = 0;
  for (Role r : set_roles(spec.mode)) total += aligned(role_bytes(r, spec));
  return total;
}

TensorSet carve_set(const CaseSpec& spec, void* base) {
  TensorSet set;
  auto* cursor = static_cast<std::byte*>(base);
  for (Role r : set_roles(spec.mode)) {
    set[r] = cursor;
    cursor += aligned(role_bytes(r, spec));
  }
  return set;
}

CaseSpec as_forward(CaseSpec spec) {
  spec.mode = Mode::kForward;
  return spec;
}

TensorSet forward_set(const TensorSet& set, void* p_scratch) {
  TensorSet f = set;
  if (!f[Role::kP]) f[Role::kP] = p_scratch;
  return f;
}

size_t p_scratch_bytes(const CaseSpec& spec) {
  if (!reads_lse(spec.mode)) return 0;
  return role_bytes(Role::kP, spec);
}

qksoftmax::Options library_options(const CaseSpec& spec, bool deterministic) {
  qksoftmax::Options o;
  o.deterministic = deterministic;
  o.mask = spec.mask;
  o.mode = reads_saved_p(spec.mode) ? qksoftmax::BackwardMode::kSavedP : qksoftmax::BackwardMode::kRecompute;
  return o;
}

qksoftmax::ForwardArgs forward_args(const CaseSpec& spec, const TensorSet& set, Device device) {
  auto d = [&](Role r) { return describe(spec, set, r, device); };
  return {.q = d(Role::kQ), .k = d(Role::kK), .p = d(Role::kP), .lse = d(Role::kLse)};
}

qksoftmax::BackwardArgs backward_args(const CaseSpec& spec, const TensorSet& set, Device device) {
  auto d = [&](Role r) { return describe(spec, set, r, device); };
  return {.q = d(Role::kQ), .k = d(Role::kK), .dp = d(Role::kDp), .p = d(Role::kP), .lse = d(Role::kLse),
          .dq = d(Role::kDq), .dk = d(Role::kDk)};
}

qksoftmax::Status library_workspace_bytes(const CaseSpec& spec, const TensorSet& set, Device device,
                                          size_t* bytes, bool deterministic) {
  const qksoftmax::Options options = library_options(spec, deterministic);
  if (!is_backward(spec.mode))
    return qksoftmax::forward_workspace_size(forward_args(spec, set, device), options, bytes);
  return qksoftmax::backward_workspace_size(backward_args(spec, set, device), options, bytes);
}

qksoftmax::Status library_call(const CaseSpec& spec, const TensorSet& set, Device device, void* workspace,
                               size_t workspace_bytes, CUstream_st* stream, bool deterministic) {
  const qksoftmax::Options options = library_options(spec, deterministic);
  if (!is_backward(spec.mode))
    return qksoftmax::forward(forward_args(spec, set, device), options, workspace, workspace_bytes, stream);
  return qksoftmax::backward(backward_args(spec, set, device), options, workspace, workspace_bytes, stream);
}

}  // namespace qkbench
