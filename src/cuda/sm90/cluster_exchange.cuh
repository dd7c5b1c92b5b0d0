// Distributed shared memory between the CTAs of a cluster, as the single-pass backward exchanges row
// statistics and dQ pieces: a sender pushes 16-byte vectors into the receiver's shared memory with st.async,
// each completing bytes on the receiver's transaction barrier (the receiver waits on its own barrier at CTA
// scope); the receiver, done reading, arrives on the sender's "empty" barrier with cluster-scope release.
// CUTLASS's barrier classes provide the barriers; the pushes and the remote arrival are spelled out here.
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

// An arrival on the barrier at local address `barrier` of CTA `rank`, releasing this thread's earlier
// accesses at cluster scope (the reads of a slot that the other CTA may overwrite next).
__device__ inline void arrive_remote(uint32_t barrier, uint32_t rank) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];"
               :
               : "r"(cluster_addr(barrier, rank))
               : "memory");
}

// CTAs in this cluster (read from the hardware: a value the compiler recomputes rather than keeps).
__device__ inline int cluster_ctas() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return int(n);
}

__device__ inline float4 load_shared_f4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}

__device__ inline float4 add_f4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

}  // namespace qksoftmax::cuda::sm90
