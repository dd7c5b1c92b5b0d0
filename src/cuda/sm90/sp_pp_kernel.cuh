// The pingpong single pass's kernel (sp_pp_config.h): two or three producer threads (sp_pp_producer.cuh), two consumer
// warpgroups that take alternate row blocks in turns (sp_pp_mainloop.cuh) and, with kDkWarpgroup, a warpgroup that
// owns dK (sp_pp_dk.cuh), with setmaxnreg; the Q and dP rings (CUTLASS PipelineTmaAsync), the tile ring
// (PipelineAsync), K's barriers (with dK staged in K's buffer) and the dS buffers' barriers. Persistent: one CTA per SM, or one per tile where
// there are fewer, its tiles dealt statically; in clusters of C CTAs (rows of up to 128·C keys), a cluster per
// (batch, key head) (causal: per pair of them, KbTileOrder::pair_heads), each CTA taking one key block.
#pragma once

#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/sp_pp_config.h"
#include "cuda/sm90/sp_pp_dk.cuh"
#include "cuda/sm90/sp_pp_mainloop.cuh"
#include "cuda/sm90/sp_pp_producer.cuh"

namespace qksoftmax::cuda::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kCtasPerSm)
    sp_pp_kernel(CUTE_GRID_CONSTANT const typename Cfg::Params params) {
  using QPipeline = typename Cfg::QPipeline;
  using PPipeline = typename Cfg::PPipeline;
  using TilePipeline = typename Cfg::TilePipeline;
  extern __shared__ __align__(1024) char sp_pp_smem[];  // the swizzled tiles need a 1024-byte-aligned base
  auto& st = *reinterpret_cast<typename Cfg::Storage*>(sp_pp_smem);

  const int warpgroup = cutlass::canonical_warp_group_idx();
  const int warp = cutlass::canonical_warp_idx_sync() % (Cfg::kWarpgroupThreads / 32);
  const int lane = int(threadIdx.x) % 32;
  const bool q_thread = warpgroup == 0 && warp == Cfg::kLoadWarp && lane == 0;
  const bool dp_thread = warpgroup == 0 && warp == Cfg::kDpWarp && lane == 0;
  const bool dk_thread = Cfg::kDkWarpgroup && warpgroup == 0 && warp == Cfg::kDkStoreWarp && lane == 0;
  const auto role = warpgroup == 0 ? QPipeline::ThreadCategory::Producer : QPipeline::ThreadCategory::Consumer;

  typename QPipeline::Params q_params;
  q_params.transaction_bytes = Cfg::kQBytes;
  q_params.role = role;
  q_params.is_leader = q_thread;
  q_params.num_consumers = Cfg::kQReleasers;
  QPipeline q_pipe(st.q_pipe, q_params, Shape<_1, _1, _1>{});
  typename PPipeline::Params p_params;
  p_params.transaction_bytes = Cfg::kPSlotBytes;  // (dP, and in saved-P P)
  p_params.role = warpgroup == 0 ? PPipeline::ThreadCategory::Producer : PPipeline::ThreadCategory::Consumer;
  p_params.is_leader = dp_thread;
  p_params.num_consumers = Cfg::kWarpgroupThreads;  // a dP slot's owner alone
  PPipeline p_pipe(st.p_pipe, p_params, Shape<_1, _1, _1>{});

  typename TilePipeline::Params tile_params;
  tile_params.role = q_thread                    ? TilePipeline::ThreadCategory::Producer
                     : warpgroup > 0 || dp_thread || dk_thread ? TilePipeline::ThreadCategory::Consumer
                                                  : TilePipeline::ThreadCategory::NonParticipant;
  tile_params.producer_arv_count = 1;  // the load thread
  tile_params.consumer_arv_count = Cfg::kTileReaders;
  TilePipeline tile_pipe(st.tile_pipe, tile_params);  // (initialises the barriers; the roles build their own views)

  if (threadIdx.x == 0) {
    for (int b = 0; b < Cfg::kKBuffers; ++b) {
      Cfg::TxBarrier::init(&st.k_full[b], 1);
      cutlass::arch::ClusterBarrier::init(&st.k_empty[b], Cfg::kDkWarpgroup ? 1 : Cfg::kConsumerThreads);
      if constexpr (Cfg::kDkWarpgroup) {
        cutlass::arch::ClusterBarrier::init(&st.k_read[b], Cfg::kConsumerThreads);
        cutlass::arch::ClusterBarrier::init(&st.dk_full[b], Cfg::kWarpgroupThreads);
      }
    }
    for (int b = 0; b < Cfg::kDsBuffers; ++b) {
      cutlass::arch::ClusterBarrier::init(&st.ds_free[b], Cfg::kDsReaders);
      if constexpr (Cfg::kDkWarpgroup) cutlass::arch::ClusterBarrier::init(&st.ds_full[b], Cfg::kWarpgroupThreads);
    }
    if constexpr (Cfg::kCluster > 1) {
      for (auto& full : st.stats_full) Cfg::TxBarrier::init(&full, 1);  // (its consumer's arming arrival)
    }
    cutlass::arch::fence_barrier_init();
  }
  if constexpr (Cfg::kCluster > 1) {
    cute::cluster_arrive_relaxed();  // every barrier of the cluster initialised before another CTA pushes
    cute::cluster_wait();
  } else {
    __syncthreads();  // every barrier initialised before any use
  }

  // In a cluster each CTA awaits every push into it, its shared memory kept until the other CTAs are done too. Each
  // role ends with that barrier, so that no code follows the roles' branches: with the barrier after them, ptxas
  // (CUDA 13.0) serialised every wgmma of the kernel (C7518, a warpgroup dependency in a divergent path).
  const auto finish = [] {
    if constexpr (Cfg::kCluster > 1) cute::cluster_sync();
  };
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Cfg::kProducerRegs>();
    if (q_thread) SpPpProducer<Cfg>{params, st}.load_q(q_pipe);
    if (dp_thread) SpPpProducer<Cfg>{params, st}.load_dp(p_pipe);
    if constexpr (Cfg::kDkWarpgroup) {
      if (dk_thread) SpPpProducer<Cfg>{params, st}.store_dk();
    }
    __syncwarp();  // the load threads' warps whole again for the aligned cluster barrier
    finish();
  } else if (warpgroup < Cfg::kDkWarpgroupIndex) {
    cutlass::arch::warpgroup_reg_alloc<Cfg::kConsumerRegs>();
    SpPpMainloop<Cfg>{params, st, warpgroup - 1}.run(q_pipe, p_pipe);
    finish();
  } else if constexpr (Cfg::kDkWarpgroup) {
    cutlass::arch::warpgroup_reg_alloc<Cfg::kDkRegs>();
    SpPpDkWarpgroup<Cfg>{params, st}.run(q_pipe);
    finish();
  }
}

}  // namespace qksoftmax::cuda::sm90
