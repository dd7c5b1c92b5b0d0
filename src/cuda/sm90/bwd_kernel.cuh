// The single-pass backward kernel: roles by warpgroup (producer and dQ reducers, two consumers) with
// setmaxnreg, the stage and K pipelines (CUTLASS PipelineTmaAsync, released across the cluster), the exchange
// barriers, and the cluster synchronisations that bracket every access to another CTA's shared memory.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/bwd_config.h"
#include "cuda/sm90/bwd_epilogue.cuh"
#include "cuda/sm90/bwd_mainloop.cuh"
#include "cuda/sm90/bwd_producer.cuh"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) bwd_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using StagePipeline = typename Cfg::StagePipeline;
  using KPipeline = typename Cfg::KPipeline;
  extern __shared__ __align__(1024) char bwd_smem[];  // the swizzled tiles need a 1024-byte-aligned base
  auto& st = *reinterpret_cast<typename Cfg::Storage*>(bwd_smem);

  const int warpgroup = cutlass::canonical_warp_group_idx();
  const int cluster = params.cluster;
  const typename Cfg::Mask mask{params.prob.keys(), cluster, int(cute::block_rank_in_cluster()),
                                 __ffs(cluster) - 1};
  const auto cluster_shape = make_shape(cluster, 1, 1);
  const bool leader = threadIdx.x == 0;  // the producer's thread

  typename StagePipeline::Params stage_params;
  stage_params.transaction_bytes = Cfg::kQBytes;  // a live chunk's dP (and P) bytes are added per step
  stage_params.role = warpgroup == 0 ? StagePipeline::ThreadCategory::Producer : StagePipeline::ThreadCategory::Consumer;
  stage_params.is_leader = leader;
  stage_params.num_consumers = Cfg::kConsumerThreads;
  StagePipeline stage_pipe(st.stage_pipe, stage_params, cluster_shape);

  typename KPipeline::Params k_params;
  k_params.transaction_bytes = Cfg::kKBytes;
  k_params.role = warpgroup == 0 ? KPipeline::ThreadCategory::Producer : KPipeline::ThreadCategory::Consumer;
  k_params.is_leader = leader;
  k_params.num_consumers = Cfg::kConsumerThreads;
  KPipeline k_pipe(st.k_pipe, k_params, cluster_shape);

  if (leader) {
    for (int b = 0; b < Cfg::kBuffers; ++b) {
      Cfg::TxBarrier::init(&st.stats_full[b], 1);
      Cfg::TxBarrier::init(&st.dq_full[b], 1);
      Cfg::Barrier::init(&st.dq_empty[b], Cfg::kReducerWarps * cluster);  // each reducer warp of each owner
    }
    cutlass::arch::fence_barrier_init();
  }
  cute::cluster_arrive_relaxed();  // every barrier of the cluster initialised before any remote access
  cute::cluster_wait();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    const int warp = cutlass::canonical_warp_idx_sync();
    if (leader) {
      BwdProducer<Cfg>{params, st}.run(stage_pipe, k_pipe, mask);
    } else if (warp > 0 && cluster > 1) {
      BwdDqReducer<Cfg>{params, st}.run(int(threadIdx.x) - 32, mask);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    BwdMainloop<Cfg>{params, st, warpgroup - 1}.run(stage_pipe, k_pipe, mask);
  }
  // No CTA leaves while another may still push into its shared memory or arrive on its barriers.
  __syncwarp();
  cute::cluster_sync();
}

}  // namespace qksoftmax::cuda::sm90
