// The single pass's kernel (sp_config.h): the key-block pass's producer (one thread: the tiles and every TMA
// load), two consumer warpgroups that compute the row statistics themselves (sp_mainloop.cuh) and, with
// kDqWarpgroup, a warpgroup that owns the dQ product (sp_dq.cuh), with setmaxnreg; the stage pipeline (CUTLASS
// PipelineTmaAsync), the tile ring (PipelineAsync), K's barriers and the statistics barriers (one per step
// parity, every consumer thread arriving). Persistent: one CTA per SM, or one per tile where there are fewer,
// its tiles dealt statically.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/kb_producer.cuh"
#include "cuda/sm90/sp_config.h"
#include "cuda/sm90/sp_dq.cuh"
#include "cuda/sm90/sp_mainloop.cuh"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    sp_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using StagePipeline = typename Cfg::StagePipeline;
  using TilePipeline = typename Cfg::TilePipeline;
  extern __shared__ __align__(1024) char sp_smem[];  // the swizzled tiles need a 1024-byte-aligned base
  auto& st = *reinterpret_cast<typename Cfg::Storage*>(sp_smem);

  const int warpgroup = cutlass::canonical_warp_group_idx();
  const int warp = cutlass::canonical_warp_idx_sync() % (Cfg::kWarpgroupThreads / 32);
  const int lane = int(threadIdx.x) % 32;
  const bool leader = threadIdx.x == 0;  // the load thread

  typename StagePipeline::Params stage_params;
  stage_params.transaction_bytes = Cfg::kStageBytes;
  stage_params.role = warpgroup == 0 ? StagePipeline::ThreadCategory::Producer : StagePipeline::ThreadCategory::Consumer;
  stage_params.is_leader = leader;
  stage_params.num_consumers = Cfg::kConsumerThreads;
  StagePipeline stage_pipe(st.stage_pipe, stage_params, Shape<_1, _1, _1>{});

  typename TilePipeline::Params tile_params;
  tile_params.role = leader           ? TilePipeline::ThreadCategory::Producer
                     : warpgroup > 0 ? TilePipeline::ThreadCategory::Consumer
                                     : TilePipeline::ThreadCategory::NonParticipant;
  tile_params.producer_arv_count = 1;  // the load thread
  tile_params.consumer_arv_count = Cfg::kTileReaders;
  TilePipeline tile_pipe(st.tile_pipe, tile_params);  // (initialises the barriers; the roles build their own views)

  if (leader) {
    for (int b = 0; b < Cfg::kKBuffers; ++b) {
      Cfg::TxBarrier::init(&st.k_full[b], 1);
      cutlass::arch::ClusterBarrier::init(&st.k_empty[b], Cfg::kKReaders);
    }
    for (int b = 0; b < Cfg::kStatBuffers; ++b) {
      cutlass::arch::ClusterBarrier::init(&st.stats_full[b], Cfg::kConsumerThreads);
    }
    if constexpr (Cfg::kDqWarpgroup) {
      for (int b = 0; b < Cfg::kBuffers; ++b) {
        cutlass::arch::ClusterBarrier::init(&st.dq.ds_empty[b], Cfg::kWarpgroupThreads);
      }
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();  // every barrier initialised before any use

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (warp == Cfg::kLoadWarp && lane == 0) KbProducer<Cfg>{params, st}.run(stage_pipe);
  } else if (warpgroup < Cfg::kDqWarpgroupIndex) {
    cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    SpMainloop<Cfg>{params, st, warpgroup - 1}.run(stage_pipe);
  } else if constexpr (Cfg::kDqWarpgroup) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kDqRegs>();
    SpDqWarpgroup<Cfg>{params, st}.run();
  }
}

}  // namespace qksoftmax::cuda::sm90
