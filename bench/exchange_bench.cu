// qksoftmax-exchange: can one SM push fp32 data to the other CTA of its cluster through distributed shared
// memory and, at the same time, reduce-add fp32 data into an L2-resident global accumulator with the 1-D bulk
// reduce, each at nearly its rate alone? The key-block pass of docs/DESIGN.md ("The next design", item 2)
// needs both per CTA-step, under the step's products: 16 KB pushed (a dQ partial to the partner, which sums
// it with its own) and 16 KB reduce-added (the summed piece into the fp32 accumulator), every step; a step's
// time is its products at the cuBLAS bf16 rate per SM measured in the same run (~1.06 µs on an H200).
//
// Clusters of two CTAs, one CTA per SM (200 KB of shared memory asked for), as many as are resident; every CTA
// walks kIterations pieces of 16 KB through two slots per stream:
//   push:   warps 0-7 (the two consumer warpgroups of that design) push a piece into the partner's slot by
//           st.async (push_f4, cluster_exchange.cuh), completing bytes on the partner's full barrier; the
//           partner's receiver warp waits on it at CTA scope, checks one value of the piece and frees the slot
//           on the sender's empty barrier, as the single pass's dQ exchange does.
//   reduce: one lane of warp 9 reduce-adds a 16 KB slot into its CTA's 64 KB region of global memory by
//           cp.reduce.async.bulk...add.f32, one bulk group per piece; a slot is reused only after its group
//           has read it (wait_group.read: the slot would be refilled there).
// Modes: each stream alone, then both at once (on different warps of the same CTAs). The launch is timed by
// CUDA events (medians of kRuns after kWarmup); each stream's rate comes from its own duration per CTA (the
// global timer: the push stream at the receiver, until its last piece arrived; the reduce stream until its
// last group completed), so in "both" a faster stream is not charged the slower one's time.
// Checks: every received piece's tag (one value per slot, at a position that moves); the regions' sums on the
// host after each reducing mode (launches × pieces per element × kReduceValue, exact in fp32).
#include <cuda_runtime.h>

#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include <cute/tensor.hpp>  // before the project's Hopper headers, as the library's sources include them
#include <cutlass/arch/barrier.h>

#include "cuda/sm90/cluster_exchange.cuh"
#include "cuda_check.h"
#include "gpu.h"
#include "micro.h"
#include "results.h"
#include "timing.h"

namespace qkbench {
namespace {

using qksoftmax::cuda::sm90::cluster_addr;
using qksoftmax::cuda::sm90::load_shared_f4;
using qksoftmax::cuda::sm90::push_f4;
using qksoftmax::cuda::sm90::smem_addr;
using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
using Barrier = cutlass::arch::ClusterBarrier;

constexpr int kKilo = 1024;
constexpr int kClusterCtas = 2;
constexpr int kPieceBytes = 16 * kKilo;  // a 64 × 64 fp32 dQ partial: one CTA-step of either stream
constexpr int kPieceVectors = kPieceBytes / int(sizeof(float4));
constexpr int kPieceFloats = kPieceBytes / int(sizeof(float));
constexpr int kSlots = 2;               // per stream: double-buffered
constexpr int kRegionPieces = 4;        // a CTA's accumulator region: 64 KB, stays in L2
constexpr int kWarpThreads = 32;
constexpr int kPushWarps = 8;           // two warpgroups, as the consumers that would push
constexpr int kPushThreads = kPushWarps * kWarpThreads;
constexpr int kReceiverWarp = kPushWarps;
constexpr int kReducerWarp = kPushWarps + 1;
constexpr int kThreads = (kPushWarps + 2) * kWarpThreads;
constexpr int kVectorsPerPusher = kPieceVectors / kPushThreads;
constexpr int kCheckStride = 97;        // the checked vector moves by this much per piece (odd: visits all)
constexpr int kSmemBytes = 200 * kKilo;  // one CTA per SM: a "per CTA" rate is a per SM rate
constexpr int kIterations = 4096;       // pieces per stream and CTA in one launch (a few ms)
constexpr int kWarmup = 3;
constexpr int kRuns = 10;
constexpr int kLaunches = kWarmup + kRuns;
constexpr float kReduceValue = 0.5f;    // sums up to launches × kIterations / kRegionPieces × 0.5: exact
// The key-block pass's products per CTA-step (DESIGN.md): Sᵀ, dK and dQ over 64 rows × 128 keys × 128 dims.
constexpr double kStepFlops = 3.0 * 2 * 64 * 128 * 128;
constexpr double kFlopsPerTflop = 1e12;
constexpr double kNsPerS = 1e9;
constexpr double kNsPerUs = 1e3;
constexpr int kPushStream = 0, kReduceStream = 1, kStreams = 2;
static_assert(kPieceVectors % kPushThreads == 0, "whole vectors per pusher");
static_assert(kIterations % kRegionPieces == 0, "every region element gets as many adds");

struct Shared {
  alignas(128) float4 push[kSlots][kPieceVectors];    // pushed into by the partner
  alignas(128) float4 reduce[kSlots][kPieceVectors];  // the bulk reduce-adds' sources
  alignas(8) uint64_t full[kSlots];                   // this CTA's slot of push received (bytes)
  alignas(8) uint64_t empty[kSlots];                  // the partner freed this CTA's pushed slot
};
static_assert(sizeof(Shared) <= kSmemBytes, "fits the shared memory asked for");

struct Args {
  float* regions;                // kRegionPieces pieces per CTA
  unsigned long long* ns;        // this launch's stream durations, [cta][stream]
  unsigned int* mismatches;      // received pieces whose checked value was wrong
  int push, reduce;              // the streams that run
};

__device__ inline unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ inline void bulk_reduce_add(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               :
               : "l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
__device__ inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int kPending>
__device__ inline void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" : : "n"(kPending) : "memory");
}
__device__ inline void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

__global__ void __launch_bounds__(kThreads, 1) exchange_kernel(Args args) {
  extern __shared__ __align__(128) unsigned char smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  const int warp = int(threadIdx.x) / kWarpThreads, lane = int(threadIdx.x) % kWarpThreads;
  const uint32_t partner = cute::block_rank_in_cluster() ^ 1u;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      TxBarrier::init(&sh.full[s], 1);  // the receiver's arrival (with the bytes expected)
      Barrier::init(&sh.empty[s], 1);   // the partner's receiver
    }
    cutlass::arch::fence_barrier_init();
  }
  const float4 source = make_float4(kReduceValue, kReduceValue, kReduceValue, kReduceValue);
  for (int i = int(threadIdx.x); i < kSlots * kPieceVectors; i += kThreads)
    sh.reduce[i / kPieceVectors][i % kPieceVectors] = source;
  cutlass::arch::fence_view_async_shared();  // the bulk reduce-adds read the sources through the async proxy
  cute::cluster_sync();  // barriers initialised, sources written, in both CTAs

  unsigned long long* ns = args.ns + size_t(blockIdx.x) * kStreams;
  if (args.push && warp < kPushWarps) {
    const uint32_t remote = cluster_addr(smem_addr(&sh.push[0][threadIdx.x]), partner);
    const uint32_t remote_full = cluster_addr(smem_addr(&sh.full[0]), partner);
    for (int g = 0; g < kIterations; ++g) {
      const int buf = g % kSlots;
      if (g >= kSlots) Barrier::wait(&sh.empty[buf], uint32_t((g / kSlots - 1) & 1));
      const float tag = float(g);
      for (int v = 0; v < kVectorsPerPusher; ++v) {
        push_f4(remote + uint32_t(buf * kPieceBytes + v * kPushThreads * int(sizeof(float4))),
                make_float4(tag, tag, tag, tag), remote_full + uint32_t(buf * sizeof(uint64_t)));
      }
    }
  } else if (args.push && warp == kReceiverWarp) {
    const unsigned long long t0 = global_ns();
    unsigned int wrong = 0;
    for (int g = 0; g < kIterations; ++g) {
      const int buf = g % kSlots;
      if (lane == 0) TxBarrier::arrive_and_expect_tx(&sh.full[buf], kPieceBytes);
      TxBarrier::wait(&sh.full[buf], uint32_t((g / kSlots) & 1));
      if (lane == 0) {
        const int checked = int((unsigned(g) * kCheckStride) % kPieceVectors);
        wrong += load_shared_f4(smem_addr(&sh.push[buf][checked])).x != float(g);
      }
      __syncwarp();  // the slot is read: free it in the sender
      Barrier::arrive(&sh.empty[buf], partner, lane == 0);
    }
    if (lane == 0) {
      ns[kPushStream] = global_ns() - t0;
      if (wrong) atomicAdd(args.mismatches, wrong);
    }
  } else if (args.reduce && warp == kReducerWarp && lane == 0) {
    const unsigned long long t0 = global_ns();
    float* region = args.regions + size_t(blockIdx.x) * kRegionPieces * kPieceFloats;
    for (int g = 0; g < kIterations; ++g) {
      const int buf = g % kSlots;
      if (g >= kSlots) bulk_wait_read<kSlots - 1>();  // the slot's last reduce-add has read it
      bulk_reduce_add(region + (g % kRegionPieces) * kPieceFloats, smem_addr(&sh.reduce[buf][0]), kPieceBytes);
      bulk_commit();
    }
    bulk_wait_all();
    ns[kReduceStream] = global_ns() - t0;
  }
  // No CTA leaves while its partner may still push into its shared memory or arrive on its barriers.
  __syncwarp();
  cute::cluster_sync();
}

// A launch of `clusters` clusters of two CTAs on stream (the attribute lives with the configuration).
struct Launch {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute cluster{};
  Launch(int clusters, cudaStream_t stream) {
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = kClusterCtas, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    config.gridDim = dim3(unsigned(clusters * kClusterCtas));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmemBytes;
    config.stream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  Launch(const Launch&) = delete;  // config.attrs points into this object
  Launch& operator=(const Launch&) = delete;
};

struct Mode {
  const char* name;
  bool push, reduce;
  double launch_us = 0;
  double gbps[kStreams] = {0, 0};  // per SM, from the streams' own durations
};

struct Buffers {
  DeviceBuffer regions, ns, mismatches;
};

Result run_mode(cudaStream_t stream, int ctas, const Buffers& b, Mode* m, unsigned int* wrong) {
  const size_t region_floats = size_t(ctas) * kRegionPieces * kPieceFloats;
  QKB_CUDA(cudaMemsetAsync(b.regions.get(), 0, b.regions.bytes(), stream));
  QKB_CUDA(cudaMemsetAsync(b.ns.get(), 0, b.ns.bytes(), stream));
  QKB_CUDA(cudaMemsetAsync(b.mismatches.get(), 0, b.mismatches.bytes(), stream));
  Launch launch(ctas / kClusterCtas, stream);
  int index = 0;
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) -> Result {
    Args args{static_cast<float*>(b.regions.get()),
              static_cast<unsigned long long*>(b.ns.get()) + size_t(index++) * ctas * kStreams,
              static_cast<unsigned int*>(b.mismatches.get()), m->push, m->reduce};
    QKB_CUDA(cudaLaunchKernelEx(&launch.config, exchange_kernel, args));
    return launch_result("exchange_kernel");
  }, &m->launch_us));
  std::vector<unsigned long long> ns(size_t(kLaunches) * ctas * kStreams);
  QKB_CUDA(cudaMemcpy(ns.data(), b.ns.get(), ns.size() * sizeof(ns[0]), cudaMemcpyDeviceToHost));
  QKB_CUDA(cudaMemcpy(wrong, b.mismatches.get(), sizeof *wrong, cudaMemcpyDeviceToHost));
  for (int s = 0; s < kStreams; ++s) {
    if (!(s == kPushStream ? m->push : m->reduce)) continue;
    std::vector<double> mean_ns;  // per timed launch, over the CTAs
    for (int l = kWarmup; l < kLaunches; ++l) {
      double sum = 0;
      for (int c = 0; c < ctas; ++c) sum += double(ns[(size_t(l) * ctas + c) * kStreams + s]);
      mean_ns.push_back(sum / ctas);
    }
    m->gbps[s] = double(kIterations) * kPieceBytes / median(std::move(mean_ns));
  }
  if (m->reduce) {  // every element of every region: launches × its pieces' adds
    std::vector<float> sums(region_floats);
    QKB_CUDA(cudaMemcpy(sums.data(), b.regions.get(), b.regions.bytes(), cudaMemcpyDeviceToHost));
    const float expected = kReduceValue * float(kLaunches * (kIterations / kRegionPieces));
    for (float x : sums) *wrong += x != expected;
  }
  return {};
}

Result run(const std::string& json_path) {
  MicroRun micro;
  QKB_TRY(start_micro(&micro));
  const DeviceInfo& info = micro.info;
  const Ceilings& ceilings = micro.ceilings;
  cudaStream_t stream = micro.stream.get();
  const double step_ns = kStepFlops / (ceilings.bf16_TFLOPs * kFlopsPerTflop / info.sms) * kNsPerS;
  const double budget_gbps = kPieceBytes / step_ns;  // bytes per ns = GB/s
  QKB_CUDA(cudaFuncSetAttribute(exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  int clusters = 0;
  const Launch probe(1, stream);
  QKB_CUDA(cudaOccupancyMaxActiveClusters(&clusters, exchange_kernel, &probe.config));
  if (clusters <= 0) {
    return Result("no cluster of two CTAs with " + std::to_string(kSmemBytes / kKilo) + " KB of shared memory fits");
  }
  const int ctas = clusters * kClusterCtas;
  Buffers b;
  QKB_TRY(b.regions.allocate(size_t(ctas) * kRegionPieces * kPieceBytes));
  QKB_TRY(b.ns.allocate(size_t(kLaunches) * ctas * kStreams * sizeof(unsigned long long)));
  QKB_TRY(b.mismatches.allocate(sizeof(unsigned int)));
  std::printf("GPU %s, %d SMs: %d clusters of %d CTAs, %d pieces of %d KB per stream and CTA; cuBLAS bf16 %.0f "
              "TFLOP/s\n", info.name.c_str(), info.sms, clusters, kClusterCtas, kIterations, kPieceBytes / kKilo,
              ceilings.bf16_TFLOPs);
  std::printf("%-7s %10s %13s %15s %9s %9s\n", "mode", "launch_us", "push_GB/s/SM", "reduce_GB/s/SM", "sum", "checks");
  Mode modes[] = {{"push", true, false}, {"reduce", false, true}, {"both", true, true}};
  bool checks_ok = true;
  for (Mode& m : modes) {
    unsigned int wrong = 0;
    QKB_TRY(run_mode(stream, ctas, b, &m, &wrong));
    checks_ok = checks_ok && wrong == 0;
    std::printf("%-7s %10.1f %13.2f %15.2f %9.2f %9s\n", m.name, m.launch_us, m.gbps[kPushStream],
                m.gbps[kReduceStream], m.gbps[kPushStream] + m.gbps[kReduceStream],
                wrong ? (std::to_string(wrong) + " wrong").c_str() : "ok");
  }
  const Mode &push = modes[0], &reduce = modes[1], &both = modes[2];
  const double push_ratio = both.gbps[kPushStream] / push.gbps[kPushStream];
  const double reduce_ratio = both.gbps[kReduceStream] / reduce.gbps[kReduceStream];
  const bool clears = both.gbps[kPushStream] >= budget_gbps && both.gbps[kReduceStream] >= budget_gbps;
  std::printf("budget: %d KB push + %d KB reduce per %.2f us per SM = %.1f GB/s each\n", kPieceBytes / kKilo,
              kPieceBytes / kKilo, step_ns / kNsPerUs, budget_gbps);
  std::printf("exchange: at once push %.1f (%.2f of alone), reduce %.1f (%.2f of alone) GB/s per SM; budget %.1f "
              "each: %s\n", both.gbps[kPushStream], push_ratio, both.gbps[kReduceStream], reduce_ratio, budget_gbps,
              clears ? "clears" : "below");
  if (!json_path.empty()) {
    std::FILE* f = nullptr;
    QKB_TRY(open_micro_json(json_path, micro, &f));
    std::fprintf(f, ", \"clusters\": %d, \"iterations\": %d, \"piece_bytes\": %d, \"step_us\": %.3f, "
                 "\"budget_GBps\": %.2f", clusters, kIterations, kPieceBytes, step_ns / kNsPerUs, budget_gbps);
    write_json_list(f, "modes", std::size(modes), [&](std::FILE* out, size_t i) {
      const Mode& m = modes[i];
      std::fprintf(out, "{\"mode\": \"%s\", \"launch_us\": %.2f, \"push_GBps\": %.3f, \"reduce_GBps\": %.3f}",
                   m.name, m.launch_us, m.gbps[kPushStream], m.gbps[kReduceStream]);
    });
    std::fprintf(f, ", \"push_ratio\": %.4f, \"reduce_ratio\": %.4f, \"clears_budget\": %s, \"checks_ok\": %s}\n",
                 push_ratio, reduce_ratio, clears ? "true" : "false", checks_ok ? "true" : "false");
    std::fclose(f);
  }
  if (!checks_ok) return Result("a check failed: the pushed tags or the reduced sums are wrong");
  return {};
}

}  // namespace
}  // namespace qkbench

// qksoftmax-exchange [results.json]
int main(int argc, char** argv) {
  return qkbench::micro_exit("qksoftmax-exchange", qkbench::run(argc > 1 ? argv[1] : ""));
}
