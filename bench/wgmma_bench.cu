// qksoftmax-wgmma: at what share of the cuBLAS bf16 rate per SM (measured in the same run) does one SM run the
// products of a backward step, by their shape, with their operands resident in shared memory? The question
// behind a step's design (docs/DESIGN.md, "The key-block pass, measured"): a 64-row step's products are
// m64nNk16 wgmma batches over K = 128, with N = 64 (a consumer's 64-key or 64-dimension slice), 128 or 256;
// the A operand from shared memory (SS) or from registers (RS); issued by one, two or three warpgroups; and
// with or without a concurrent stream of shared-memory loads (the element-wise work's ldmatrix, a dQ
// staging buffer's stores) from another warpgroup. SS products at N = 64 read 4 KB of operands per 32 cycles
// of the tensor pipe: the shared memory's whole 128 bytes per cycle.
//
// One CTA per SM (kSmemBytes asked for), as many as SMs; each issuing warpgroup runs kBatches batches of
// K / 16 wgmma into one accumulator, a wait after each (a warpgroup alone leaves the pipe idle while its
// batch drains; a second one fills that). The noise warpgroup, where asked, streams 16-byte loads over its
// own 32 KB of shared memory until the issuers are done ("loads alone": the stream without products, its own
// ceiling). Time per CTA by the global timer and in SM cycles; the rate per SM is the mean over CTAs, the
// median over kRuns launches, against cuBLAS's rate and, per cycle, against the pipe's 4096 FLOP. The operands
// are zeros, which draw less power than cuBLAS's random data: the clock may run higher here.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include <cute/tensor.hpp>
// (after cute/tensor.hpp, which they need)
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cutlass/numeric_types.h>

#include "cuda_check.h"
#include "gpu.h"
#include "micro.h"
#include "results.h"
#include "timing.h"

namespace qkbench {
namespace {

using namespace cute;
using Element = cutlass::bfloat16_t;

constexpr int kKilo = 1024;
constexpr int kM = 64;                    // a warpgroup's rows (the wgmma's M)
constexpr int kK = 128;                   // the head dimension or a 128-key block: a batch is K / 16 wgmma
constexpr int kWarpgroupThreads = 128;
constexpr int kMaxN = 256;
constexpr int kNoiseBytes = 32 * kKilo;   // the noise warpgroup's own shared memory
constexpr int kNoiseUnroll = 4;           // independent 16-byte loads in flight per thread
constexpr int kSmemBytes = 200 * kKilo;   // one CTA per SM: a per-CTA rate is a per-SM rate
constexpr int kBatches = 4096;
constexpr int kLoadsAlone = 1 << 16;      // rounds of the load stream alone (a few ms)
constexpr double kPeakFlopsPerCycle = 4096;  // dense bf16 per SM: 4 tensor cores × 512 FMA per cycle
constexpr int kWarmup = 2;
constexpr int kRuns = 5;
constexpr double kFlopsPerTflop = 1e12;
constexpr double kNsPerS = 1e9;

template <int kN, bool kRs>
struct Product {
  using BN = Int<kN>;
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<Int<kM>, Int<kK>>{}));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, cute::Shape<BN, Int<kK>>{}));
  using Tile = cute::Shape<Int<kM>, BN, Int<kK>>;
  using Op = std::conditional_t<
      kRs, decltype(GMMA::rs_op_selector<Element, Element, float, Tile, GMMA::Major::K, GMMA::Major::K>()),
      decltype(GMMA::ss_op_selector<Element, Element, float, Tile, GMMA::Major::K, GMMA::Major::K>())>;
  using Mma = decltype(make_tiled_mma(Op{}));
};

struct Shared {
  alignas(1024) Element a[kM * kK];
  alignas(1024) Element b[kMaxN * kK];
  alignas(1024) uint4 noise[kNoiseBytes / sizeof(uint4)];
  int done;  // issuing warpgroups finished
};
static_assert(sizeof(Shared) <= kSmemBytes, "fits the shared memory asked for");

__device__ inline unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Per CTA: its time in ns and in SM cycles, what its noise warpgroup loaded; sink: never written (the values are
// zeros) unless the compiler could prove otherwise.
struct Args {
  unsigned long long* ns;
  unsigned long long* cycles;
  unsigned long long* noise_bytes;
  float* sink;
};

// kIssuers = 0 with kNoise: the load stream alone, for kLoadsAlone rounds.
template <int kN, bool kRs, int kIssuers, bool kNoise>
__global__ void __launch_bounds__(kWarpgroupThreads * (kIssuers + 1), 1) wgmma_kernel(Args args) {
  using P = Product<kN, kRs>;
  extern __shared__ __align__(1024) unsigned char smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  for (int i = int(threadIdx.x); i < int(sizeof(Shared) / sizeof(uint4)); i += int(blockDim.x)) {
    reinterpret_cast<uint4*>(&sh)[i] = make_uint4(0, 0, 0, 0);
  }
  __syncthreads();
  const int warpgroup = int(threadIdx.x) / kWarpgroupThreads, tid = int(threadIdx.x) % kWarpgroupThreads;
  const unsigned long long t0 = global_ns();
  const long long c0 = clock64();
  if (warpgroup < kIssuers) {
    Tensor sA = make_tensor(make_smem_ptr(sh.a), typename P::SmemLayoutA{});  // (M, K)
    Tensor sB = make_tensor(make_smem_ptr(sh.b), typename P::SmemLayoutB{});  // (N, K)
    typename P::Mma mma;
    auto thr = mma.get_thread_slice(tid);
    Tensor tCrA = thr.partition_fragment_A(sA);                    // (MMA, 1, K/16): registers (RS) or descriptors
    Tensor tCrB = thr.partition_fragment_B(sB);                    // (MMA, 1, K/16) descriptors
    Tensor tCrC = partition_fragment_C(mma, cute::Shape<Int<kM>, Int<kN>>{});  // (MMA, 1, 1) fp32
    if constexpr (kRs) clear(tCrA);
    clear(tCrC);
    mma.accumulate_ = GMMA::ScaleOut::One;
    for (int batch = 0; batch < kBatches; ++batch) {
      warpgroup_fence_operand(tCrC);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) gemm(mma, tCrA(_, _, kb), tCrB(_, _, kb), tCrC);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tCrC);
    }
    if (tCrC(0) != 0.0f) *args.sink = tCrC(0);
    __syncwarp();
    if (tid == 0) atomicAdd(&sh.done, 1);
  } else if (kNoise) {
    constexpr int kVectors = kNoiseBytes / int(sizeof(uint4));
    uint4 x = make_uint4(0, 0, 0, 0);
    unsigned long long loads = 0;
    const volatile int* done = &sh.done;
    int i = tid;
    // (the flag is read in every round, the stream alone too: the same loop either way)
    for (int round = 0; kIssuers > 0 ? *done < kIssuers : (*done, round < kLoadsAlone); ++round) {
      CUTE_UNROLL
      for (int u = 0; u < kNoiseUnroll; ++u) {
        const uint4 v = sh.noise[(i + u * kWarpgroupThreads) % kVectors];
        x.x ^= v.x, x.y ^= v.y, x.z ^= v.z, x.w ^= v.w;
      }
      loads += kNoiseUnroll;
      i = (i + kNoiseUnroll * kWarpgroupThreads) % kVectors;
    }
    if (x.x | x.y | x.z | x.w) *args.sink = float(x.x);
    atomicAdd(args.noise_bytes + blockIdx.x, loads * sizeof(uint4));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    args.ns[blockIdx.x] = global_ns() - t0;
    args.cycles[blockIdx.x] = static_cast<unsigned long long>(clock64() - c0);
  }
}

struct Config {
  const char* name;
  int n, issuers;
  bool rs, noise;
  void (*kernel)(Args);
  double tflops_per_sm = 0, share = 0, flops_per_cycle = 0, noise_gbps = 0;
};

template <int kN, bool kRs, int kIssuers, bool kNoise>
Config config(const char* name) {
  return {name, kN, kIssuers, kRs, kNoise, wgmma_kernel<kN, kRs, kIssuers, kNoise>};
}

Result run_config(cudaStream_t stream, int sms, double cublas_per_sm, Config* c) {
  const int threads = kWarpgroupThreads * (c->issuers + 1);
  QKB_CUDA(cudaFuncSetAttribute(c->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  DeviceBuffer ns, cycles, noise, sink;
  const size_t per_cta = size_t(sms) * sizeof(unsigned long long);
  QKB_TRY(ns.allocate(per_cta));
  QKB_TRY(cycles.allocate(per_cta));
  QKB_TRY(noise.allocate(per_cta));
  QKB_TRY(sink.allocate(sizeof(float)));
  const Args args{static_cast<unsigned long long*>(ns.get()), static_cast<unsigned long long*>(cycles.get()),
                  static_cast<unsigned long long*>(noise.get()), static_cast<float*>(sink.get())};
  const double flops = double(c->issuers) * kBatches * 2.0 * kM * c->n * kK;
  std::vector<double> rates, per_cycle, noise_rates;
  for (int l = 0; l < kWarmup + kRuns; ++l) {
    QKB_CUDA(cudaMemsetAsync(noise.get(), 0, noise.bytes(), stream));
    c->kernel<<<sms, threads, kSmemBytes, stream>>>(args);
    QKB_TRY(launch_result("wgmma_kernel"));
    std::vector<unsigned long long> t(static_cast<size_t>(sms)), clk(static_cast<size_t>(sms)),
        bytes(static_cast<size_t>(sms));
    QKB_CUDA(cudaMemcpyAsync(t.data(), ns.get(), per_cta, cudaMemcpyDeviceToHost, stream));
    QKB_CUDA(cudaMemcpyAsync(clk.data(), cycles.get(), per_cta, cudaMemcpyDeviceToHost, stream));
    QKB_CUDA(cudaMemcpyAsync(bytes.data(), noise.get(), per_cta, cudaMemcpyDeviceToHost, stream));
    QKB_CUDA(cudaStreamSynchronize(stream));
    if (l < kWarmup) continue;
    double rate = 0, flop_cycles = 0, noise_rate = 0;
    for (size_t cta = 0; cta < t.size(); ++cta) {
      rate += flops / double(t[cta]) * kNsPerS / kFlopsPerTflop;
      flop_cycles += flops / double(clk[cta]);
      noise_rate += double(bytes[cta]) / double(t[cta]);
    }
    rates.push_back(rate / sms);
    per_cycle.push_back(flop_cycles / sms);
    noise_rates.push_back(noise_rate / sms);
  }
  c->flops_per_cycle = median(per_cycle);
  c->tflops_per_sm = median(rates);
  c->share = c->tflops_per_sm / cublas_per_sm;
  c->noise_gbps = median(noise_rates);
  return {};
}

Result run(const std::string& json_path) {
  MicroRun micro;
  QKB_TRY(start_micro(&micro));
  const double cublas_per_sm = micro.ceilings.bf16_TFLOPs / micro.info.sms;
  std::vector<Config> configs = {
      config<64, false, 1, false>("SS n64 x1"),   config<64, false, 2, false>("SS n64 x2"),
      config<64, false, 3, false>("SS n64 x3"),   config<64, false, 2, true>("SS n64 x2 +loads"),
      config<64, true, 1, false>("RS n64 x1"),    config<64, true, 2, false>("RS n64 x2"),
      config<64, true, 2, true>("RS n64 x2 +loads"),
      config<128, false, 1, false>("SS n128 x1"), config<128, false, 2, false>("SS n128 x2"),
      config<128, false, 2, true>("SS n128 x2 +loads"),
      config<128, true, 1, false>("RS n128 x1"),  config<128, true, 2, false>("RS n128 x2"),
      config<128, true, 2, true>("RS n128 x2 +loads"),
      config<256, false, 2, false>("SS n256 x2"), config<256, false, 2, true>("SS n256 x2 +loads"),
      config<kMaxN, false, 0, true>("loads alone"),
  };
  std::printf("GPU %s, %d SMs, one CTA per SM, %d batches of K = %d per warpgroup; cuBLAS bf16 %.0f TFLOP/s = "
              "%.3f per SM\n", micro.info.name.c_str(), micro.info.sms, kBatches, kK, micro.ceilings.bf16_TFLOPs,
              cublas_per_sm);
  std::printf("%-20s %14s %9s %11s %16s\n", "product", "TFLOP/s/SM", "of cuBLAS", "of peak/clk", "loads GB/s/SM");
  for (Config& c : configs) {
    QKB_TRY(run_config(micro.stream.get(), micro.info.sms, cublas_per_sm, &c));
    std::printf("%-20s %14.3f %8.1f%% %10.1f%% %16.1f\n", c.name, c.tflops_per_sm, 100 * c.share,
                100 * c.flops_per_cycle / kPeakFlopsPerCycle, c.noise_gbps);
  }
  if (!json_path.empty()) {
    std::FILE* f = nullptr;
    QKB_TRY(open_micro_json(json_path, micro, &f));
    std::fprintf(f, ", \"sms\": %d, \"batches\": %d, \"k\": %d", micro.info.sms, kBatches, kK);
    write_json_list(f, "products", configs.size(), [&](std::FILE* out, size_t i) {
      const Config& c = configs[i];
      std::fprintf(out, "{\"name\": \"%s\", \"n\": %d, \"a_from_registers\": %s, \"warpgroups\": %d, "
                   "\"loads\": %s, \"TFLOPs_per_SM\": %.4f, \"share_of_cublas\": %.4f, \"flops_per_cycle\": %.1f, "
                   "\"loads_GBps_per_SM\": %.2f}",
                   c.name, c.n, c.rs ? "true" : "false", c.issuers, c.noise ? "true" : "false", c.tflops_per_sm,
                   c.share, c.flops_per_cycle, c.noise_gbps);
    });
    std::fprintf(f, "}\n");
    std::fclose(f);
  }
  return {};
}

}  // namespace
}  // namespace qkbench

// qksoftmax-wgmma [results.json]
int main(int argc, char** argv) {
  return qkbench::micro_exit("qksoftmax-wgmma", qkbench::run(argc > 1 ? argv[1] : ""));
}
