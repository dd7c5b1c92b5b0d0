// The pingpong single pass's forms (src/cuda/sm90/sp_pp_config.h: as dispatched, with a dK warpgroup, and
// with dK held by the two consumers)
// instantiated for the kernel tests (test_sm90_sp_variants.cpp), behind a plain function: the library's CUDA code
// builds as C++17, the tests as C++20.
#include "cuda/sm90/sp_launch.cuh"
#include "cuda/sm90_instances.h"
#include "sp_variants.h"

#include <string>

namespace qksoftmax::test {

Status run_single_pass(const Problem& prob, SpForm form, CUstream_st* stream) {
  using cuda::sm90::SpPpConfig;
  const bool saved_p = prob.mode == BackwardMode::kSavedP;
  if (saved_p && form != SpForm::kDispatched) return {Code::kInternal, "saved-P: the dispatched form only"};
  switch (form) {
    case SpForm::kDispatched:
      return run_single_pass_cluster(prob, 1, stream);
    case SpForm::kThreeWarpgroups:
      return cuda::run_sm90_single_pass<SpPpConfig<cutlass::bfloat16_t, 128, false>>(prob, stream);
  }
  return {Code::kInternal, "unknown single-pass form"};
}

// The library's instance of clusters of kCluster CTAs (1: one CTA) for element type T (sm90_instances.h), in
// prob's mode.
template <class T, int kCluster>
Status mode_instance(const Problem& prob, CUstream_st* stream) {
  using cuda::sm90::SpPpConfig;
  return prob.mode == BackwardMode::kSavedP
             ? cuda::run_sm90_single_pass<SpPpConfig<T, 128, true, kCluster, true>>(prob, stream)
             : cuda::run_sm90_single_pass<SpPpConfig<T, 128, true, kCluster>>(prob, stream);
}

template <class T>
Status cluster_instance(const Problem& prob, int cluster, CUstream_st* stream) {
  switch (cluster) {
    case 1:
      return mode_instance<T, 1>(prob, stream);
    case 2:
      return mode_instance<T, 2>(prob, stream);
    case 4:
      return mode_instance<T, 4>(prob, stream);
    case 8:
      return mode_instance<T, 8>(prob, stream);
  }
  return {Code::kInternal, "no single pass in clusters of " + std::to_string(cluster)};
}

Status run_single_pass_cluster(const Problem& prob, int cluster, CUstream_st* stream) {
  switch (prob.dtype) {
    case DType::kBFloat16:
      return cluster_instance<cutlass::bfloat16_t>(prob, cluster, stream);
    case DType::kFloat16:
      return cluster_instance<cutlass::half_t>(prob, cluster, stream);
    default:
      return {Code::kInternal, "no single pass in clusters for this dtype"};
  }
}

}  // namespace qksoftmax::test
