// Host side of the Hopper fused forward: TMA descriptors (loads of Q and K, stores of P) and the launch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/generic_launch.cuh"
#include "cuda/sm90_backward_launch.cuh"
#include "cuda/sm90_forward.cuh"

namespace qksoftmax::cuda {

template <class Cfg>
Status run_sm90_forward(const Problem& prob, CUstream_st* stream) {
  using namespace cute;
  using Element = typename Cfg::Element;
  using HD = typename Cfg::HD;
  constexpr const char* kName = "sm90 fused forward";

  const auto q = sm90::tma_view<Element>(prob.q, prob.Sq, HD{}, prob.Hq, prob.B);
  const auto k = sm90::tma_view<Element>(prob.k, prob.Sk, HD{}, prob.Hk, prob.B);
  const auto p = make_tensor(make_gmem_ptr(static_cast<Element*>(prob.out_p.ptr)),
                             make_shape(int32_t(prob.Sq), int32_t(prob.Sk), int32_t(prob.Hq), int32_t(prob.B)),
                             make_stride(prob.out_p.sr, _1{}, prob.out_p.sh, prob.out_p.sb));
  const typename Cfg::Params params{prob, make_tma_copy(SM90_TMA_LOAD{}, q, typename Cfg::SmemLayoutQ{}),
                                    make_tma_copy(SM90_TMA_LOAD{}, k, typename Cfg::SmemLayoutK{}(_, _, 0)),
                                    make_tma_copy(SM90_TMA_STORE{}, p, typename Cfg::SmemLayoutP{}(_, _, 0))};
  const int64_t blocks = (prob.Sq + Cfg::kBlockM - 1) / Cfg::kBlockM * prob.Hq * prob.B;
  return launch<Cfg>(sm90::forward_kernel<Cfg>, kName, blocks, params, stream);
}

}  // namespace qksoftmax::cuda
