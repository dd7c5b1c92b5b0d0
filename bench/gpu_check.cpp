#include "gpu_check.h"

#include <cuda_runtime.h>

#include <array>

#include "check.h"
#include "cuda_check.h"
#include "dtype.h"
#include "host_buffer.h"

namespace qkbench {
namespace {

// The bytes of head `head` of a role's device tensor, copied to the host.
Result copy_head(const CaseSpec& spec, const TensorSet& set, Role role, int64_t head, HostBuffer* out) {
  const size_t bytes = role_bytes_per_head(role, spec);
  *out = HostBuffer(bytes);
  const auto* src = static_cast<const std::byte*>(set[role]) + size_t(head) * bytes;
  return cuda_result(cudaMemcpy(out->get(), src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy of the checked head");
}

}  // namespace

Result check_last_head(const CaseSpec& spec, const TensorSet& device_set, std::vector<OutputError>* errors) {
  const int64_t head = spec.shape.heads() - 1;
  CaseSpec ref_spec = spec;
  ref_spec.shape.B = ref_spec.shape.H = 1;
  ref_spec.dtype = DType::kFloat32;

  std::array<std::vector<float>, kRoleCount> ref_data;
  TensorSet ref_set;
  for (Role r : input_roles(spec.mode)) {
    HostBuffer raw;
    QKB_TRY(copy_head(spec, device_set, r, head, &raw));
    ref_data[size_t(r)] = to_floats(raw.get(), role_dtype(r, spec.dtype), role_elements_per_head(r, spec.shape));
    ref_set[r] = ref_data[size_t(r)].data();
  }
  for (Role r : output_roles(spec.mode)) {
    ref_data[size_t(r)].resize(size_t(role_elements_per_head(r, spec.shape)));
    ref_set[r] = ref_data[size_t(r)].data();
  }

  size_t workspace_bytes = 0;
  QKB_TRY(library_result(library_workspace_bytes(ref_spec, ref_set, qksoftmax::Device::kCPU, &workspace_bytes),
                         "CPU reference workspace size"));
  HostBuffer workspace(workspace_bytes);
  QKB_TRY(library_result(
      library_call(ref_spec, ref_set, qksoftmax::Device::kCPU, workspace.get(), workspace.bytes(), nullptr),
      "CPU reference"));

  errors->clear();
  for (Role r : output_roles(spec.mode)) {
    HostBuffer raw;
    QKB_TRY(copy_head(spec, device_set, r, head, &raw));
    errors->push_back({role_name(r), relative_error(raw.get(), role_dtype(r, spec.dtype), ref_data[size_t(r)].data(),
                                                    role_elements_per_head(r, spec.shape))});
  }
  return {};
}

}  // namespace qkbench
