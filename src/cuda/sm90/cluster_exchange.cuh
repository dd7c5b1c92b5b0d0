// Distributed shared memory between the CTAs of a cluster, as the single-pass backward exchanges row
// statistics and dQ pieces: a sender pushes 16-byte vectors into the receiver's shared memory with st.async,
// each completing bytes on the receiver's transaction barrier (the receiver waits on its own barrier at CTA
// scope); the receiver, done reading (the values used), arrives on the sender's "empty" barrier through
// CUTLASS's ClusterBarrier, as CUTLASS's multicast pipelines free a stage. An arrival with cluster-scope
// release semantics would compile to a GPU-wide memory barrier per arrival, µs apiece.
#pragma once

#include <cstdint>

#include "cuda/sm90_config.h"

namespace qksoftmax::cuda::sm90 {

// v into the shared memory of another CTA (remote address from cluster_addr), completing 16 bytes on the
// transaction barrier at remote_barrier (same CTA).
__device__ inline void push_f4(uint32_t remote, float4 v, uint32_t remote_barrier) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
      :
      : "r"(remote), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(remote_barrier)
      : "memory");
}

// The same for 8 bytes.
__device__ inline void push_f2(uint32_t remote, float2 v, uint32_t remote_barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
               :
               : "r"(remote), "f"(v.x), "f"(v.y), "r"(remote_barrier)
               : "memory");
}

// CTAs in this cluster (read from the hardware: a value the compiler recomputes rather than keeps).
__device__ inline int cluster_ctas() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return int(n);
}

__device__ inline float4 add_f4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

}  // namespace qksoftmax::cuda::sm90
