// The phase clocks of qksoftmax-step --trace (src/cuda/sm90/trace.h), shared by the single pass's cases
// (step_bench.cu) and the key-block pass's (kb_step.cu): the sink of a traced build, cycles summed over every CTA
// by role and phase, and the host's side: counters cleared before a traced launch, read after it, the consumers'
// table printed. The counters are the including translation unit's own (an unnamed namespace: without relocatable
// device code a __device__ variable belongs to its translation unit), which its traced kernels add to.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "cuda/sm90/trace.h"
#include "cuda_check.h"
#include "result.h"

namespace qkbench {

// Room for the roles and phases of every kernel.
inline constexpr int kTraceRoles = std::max(int(qksoftmax::cuda::sm90::TraceRole::kCount),
                                            int(qksoftmax::cuda::sm90::KbTraceRole::kCount));
inline constexpr int kTracePhases = std::max({int(qksoftmax::cuda::sm90::TracePhase::kCount),
                                              int(qksoftmax::cuda::sm90::KbTracePhase::kCount),
                                              int(qksoftmax::cuda::sm90::PpTracePhase::kCount)});

// Cycles by role and phase, summed over every CTA of a traced launch.
struct PhaseCycles {
  unsigned long long sums[kTraceRoles][kTracePhases];

  // Cycles per step of one CTA, over `steps` steps of all CTAs.
  double per_step(int role, int phase, double steps) const { return double(sums[role][phase]) / steps; }
};

namespace {

__device__ PhaseCycles g_trace;

struct TraceSink {
  __device__ static void add(int role, int phase, uint32_t cycles) {
    atomicAdd(&g_trace.sums[role][phase], static_cast<unsigned long long>(cycles));
  }
};

// What a traced config names as its Trace.
using PhaseTrace = qksoftmax::cuda::sm90::ClockTrace<TraceSink>;

// The counters zeroed, before a traced launch on `stream`.
Result clear_trace(cudaStream_t stream) {
  const PhaseCycles zero = {};
  return cuda_result(cudaMemcpyToSymbolAsync(g_trace, &zero, sizeof zero, 0, cudaMemcpyHostToDevice, stream),
                     "cudaMemcpyToSymbolAsync");
}

// The counters once the launch is done.
Result read_trace(cudaStream_t stream, PhaseCycles* out) {
  QKB_TRY(cuda_result(cudaMemcpyFromSymbolAsync(out, g_trace, sizeof *out, 0, cudaMemcpyDeviceToHost, stream),
                      "cudaMemcpyFromSymbolAsync"));
  return cuda_result(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// The two consumer warpgroups' cycles per step by phase (names in the order of the phase enum) and their totals,
// as scripts/trace_table.py reads them.
void print_consumer_trace(const PhaseCycles& c, int consumer0, int consumer1, const char* const* names, int phases,
                          double steps) {
  double total[2] = {0, 0};
  std::printf("  %-12s %9s %9s   cycles per step\n", "consumer", "wg 1", "wg 2");
  for (int ph = 0; ph < phases; ++ph) {
    const double c0 = c.per_step(consumer0, ph, steps), c1 = c.per_step(consumer1, ph, steps);
    total[0] += c0, total[1] += c1;
    std::printf("  %-12s %9.0f %9.0f\n", names[ph], c0, c1);
  }
  std::printf("  %-12s %9.0f %9.0f\n", "total", total[0], total[1]);
}

}  // namespace
}  // namespace qkbench
