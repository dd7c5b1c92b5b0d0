// The key-block pass's kernel: roles by warpgroup (producer warpgroup: loads, rows, dQ reduce-adds; two
// consumers) with setmaxnreg, the stage pipeline (CUTLASS PipelineTmaAsync: Q, dP[, P] by TMA), the rows
// pipeline (PipelineAsync: LSE·log2e and D of a step's rows), the tile ring (PipelineAsync: the index of each
// tile the load thread takes, for the other roles) and K's barriers (full: a transaction barrier per K buffer;
// empty: the consumers' hand-back). Persistent, not a cluster: each CTA (one per SM, or one per tile where there
// are fewer: kb_launch.cuh) takes tiles from the tile counter until it is past the last (kb_scheduler.h);
// barriers are initialised once and their phases, like the pipelines' states, run on across tiles.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/kb_config.h"
#include "cuda/sm90/kb_epilogue.cuh"
#include "cuda/sm90/kb_mainloop.cuh"
#include "cuda/sm90/kb_producer.cuh"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    kb_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using StagePipeline = typename Cfg::StagePipeline;
  using RowsPipeline = typename Cfg::RowsPipeline;
  using TilePipeline = typename Cfg::TilePipeline;
  extern __shared__ __align__(1024) char kb_smem[];  // the swizzled tiles need a 1024-byte-aligned base
  auto& st = *reinterpret_cast<typename Cfg::Storage*>(kb_smem);

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

  typename RowsPipeline::Params rows_params;
  rows_params.role = warpgroup == 0 ? (warp == Cfg::kRowsWarp ? RowsPipeline::ThreadCategory::Producer
                                                               : RowsPipeline::ThreadCategory::NonParticipant)
                                    : RowsPipeline::ThreadCategory::Consumer;
  rows_params.producer_arv_count = 32;  // every lane of the rows warp
  rows_params.consumer_arv_count = Cfg::kConsumerThreads;
  RowsPipeline rows_pipe(st.rows_pipe, rows_params);

  typename TilePipeline::Params tile_params;
  const bool tile_reader = warpgroup > 0 || warp == Cfg::kRowsWarp || warp == Cfg::kDqWarp;
  tile_params.role = leader        ? TilePipeline::ThreadCategory::Producer
                     : tile_reader ? TilePipeline::ThreadCategory::Consumer
                                   : TilePipeline::ThreadCategory::NonParticipant;
  tile_params.producer_arv_count = 1;  // the load thread
  tile_params.consumer_arv_count = Cfg::kTileReaders;
  TilePipeline tile_pipe(st.tile_pipe, tile_params);  // (initialises the barriers; the roles build their own views)

  if (leader) {
    for (int b = 0; b < Cfg::kKBuffers; ++b) {
      Cfg::TxBarrier::init(&st.k_full[b], 1);
      cutlass::arch::ClusterBarrier::init(&st.k_empty[b], Cfg::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();  // every barrier initialised before any use

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (warp == Cfg::kLoadWarp) {
      if (lane == 0) KbProducer<Cfg>{params, st}.run(stage_pipe);
    } else if (warp == Cfg::kRowsWarp) {
      KbRows<Cfg>{params, st}.run(rows_pipe, lane);
    } else if (warp == Cfg::kDqWarp) {
      KbDqWriter<Cfg>{params, st}.run(lane);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    KbMainloop<Cfg>{params, st, warpgroup - 1}.run(stage_pipe, rows_pipe);
  }
}

}  // namespace qksoftmax::cuda::sm90
