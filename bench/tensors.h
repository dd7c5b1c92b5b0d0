// The tensors of one case: which a mode reads and writes, their sizes, and their qksoftmax descriptors.
// A TensorSet holds one pointer per role (device or host memory); all tensors are contiguous.
// Included by CUDA sources, which the project compiles as C++17: keep this header free of C++20.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model.h"
#include "qksoftmax/qksoftmax.h"

struct CUstream_st;

namespace qkbench {

struct CaseSpec {
  Shape shape;
  DType dtype = DType::kBFloat16;
  Mask mask = Mask::kCausal;
  Mode mode = Mode::kRecompute;
};

enum class Role : uint8_t { kQ, kK, kDp, kP, kLse, kDq, kDk, kCount };

inline constexpr size_t kRoleCount = size_t(Role::kCount);

const char* role_name(Role role);                        // "Q", "K", "dP", "P", "LSE", "dQ", "dK"
DType role_dtype(Role role, DType dtype);                // LSE is float32, the rest dtype
int64_t role_elements_per_head(Role role, const Shape& shape);
inline int64_t role_elements(Role role, const Shape& shape) {
  return role_elements_per_head(role, shape) * shape.heads();
}
size_t role_bytes_per_head(Role role, const CaseSpec& spec);
inline size_t role_bytes(Role role, const CaseSpec& spec) {
  return role_bytes_per_head(role, spec) * size_t(spec.shape.heads());
}

// Every tensor a call of the mode touches; forward: Q, K → P (dense), LSE. Backward: Q, K, dP (+ P for
// saved_p, + LSE for recompute_lse) → dQ, dK.
std::vector<Role> set_roles(Mode mode);
std::vector<Role> output_roles(Mode mode);
std::vector<Role> input_roles(Mode mode);
std::vector<Role> random_roles(Mode mode);  // inputs drawn from N(0, 1): Q, K, and dP for a backward
std::vector<Role> saved_roles(Mode mode);   // inputs a forward produces: P (saved_p) or LSE (recompute_lse)

struct TensorSet {
  std::array<void*, kRoleCount> ptr{};

  void* operator[](Role role) const { return ptr[size_t(role)]; }
  void*& operator[](Role role) { return ptr[size_t(role)]; }
};

// Bytes of one set of the mode's tensors (each aligned to kWorkspaceAlignment) and the pointers of a set
// laid out from base.
size_t set_bytes(const CaseSpec& spec);
TensorSet carve_set(const CaseSpec& spec, void* base);

// Saved inputs (P for saved_p, LSE for recompute_lse) come from a forward on the set's Q, K: the same spec in
// mode kForward, on forward_set(set, p_scratch), which writes P into the set's P, or into p_scratch when the
// set keeps only LSE (p_scratch_bytes(spec) of dense P; 0 when none is needed).
CaseSpec as_forward(CaseSpec spec);
TensorSet forward_set(const TensorSet& set, void* p_scratch);
size_t p_scratch_bytes(const CaseSpec& spec);

// Descriptors and calls of the qksoftmax API on a set (device: kCUDA on device memory, kCPU on host).
// deterministic: options.deterministic (bitwise-reproducible kernels; the generic path today).
qksoftmax::Options library_options(const CaseSpec& spec, bool deterministic = false);
qksoftmax::ForwardArgs forward_args(const CaseSpec& spec, const TensorSet& set, qksoftmax::Device device);
qksoftmax::BackwardArgs backward_args(const CaseSpec& spec, const TensorSet& set, qksoftmax::Device device);

// A null pointer in a set describes an absent tensor. A forward (spec.mode kForward) writes P and, where
// the set has one, LSE; a backward reads P or LSE where the set has them.
qksoftmax::Status library_workspace_bytes(const CaseSpec& spec, const TensorSet& set, qksoftmax::Device device,
                                          size_t* bytes, bool deterministic = false);
qksoftmax::Status library_call(const CaseSpec& spec, const TensorSet& set, qksoftmax::Device device,
                               void* workspace, size_t workspace_bytes, CUstream_st* stream,
                               bool deterministic = false);

}  // namespace qkbench
