// qksoftmax-step: the step micro-benchmarks of the Hopper backward's two kernels, data in L2, so that the time
// per step is the step's own (tensor products, element-wise work, exchange or reduce-adds), without DRAM.
// The single pass: every resident cluster walks the same (batch, key head) `repeat` times: its Q, K and dP stay
// in L2. Non-causal rows of 128·C keys keep every chunk of every CTA live. Printed per mode and cluster size: µs
// per 64-row step and SM, and the tensor pipe's share: the step's products at the cuBLAS bf16 rate measured in
// the same run, over the time.
// The key-block pass (kb_step.h: its shape, and how its inputs alias to stay in L2), after the single pass's
// cases in every run rather than behind an option: it is the default backward for rows past 128 keys, its
// four cases add 18 launches each of 64 steps per SM, and the results file, gpu-check's summary and a
// revision A/B (REVS_STEP) then carry both kernels' steps. Printed per mode and dQ target (16-bit into dQ, the default; fp32 into the
// accumulator): µs per launch, µs per 64 × 128 step and SM, products per step, the tensor share, the bytes.
// With --trace, each case of either kernel runs once more through a build of the kernel that reads the SM clock
// at every phase boundary (src/cuda/sm90/trace.h, phase_trace.cuh) and prints each role's cycles per step by
// phase.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "cuda/sm90/bwd_launch.cuh"
#include "cuda/sm90_instances.h"
#include "cuda_check.h"
#include "gpu.h"
#include "kb_step.h"
#include "micro.h"
#include "phase_trace.cuh"
#include "timing.h"

namespace qkbench {
namespace {

constexpr int kHeadDim = 128;
constexpr int kBlockM = 64;       // rows per step
constexpr int kKeysPerCta = 128;  // keys per CTA
constexpr int kClusterSizes[] = {1, 2, 4, 8};
constexpr int kRepeat = 24;
constexpr int kWarmup = 3;
constexpr int kRuns = 15;

struct StepResult {
  std::string mode;
  int cluster = 0;
  double us = 0;            // one launch
  double step_us = 0;       // per 64-row step of one CTA
  double tensor_share = 0;  // of the measured bf16 GEMM rate
};


using Recompute = qksoftmax::cuda::sm90::BwdConfig<cutlass::bfloat16_t, kHeadDim, false>;
using SavedP = qksoftmax::cuda::sm90::BwdConfig<cutlass::bfloat16_t, kHeadDim, true>;

// The traced build (phase_trace.cuh): the same config, its roles reading the SM clock.
using qksoftmax::cuda::sm90::TracePhase;
using qksoftmax::cuda::sm90::TraceRole;
constexpr int kPhases = int(TracePhase::kCount);
template <bool kSavedP>
struct Traced : qksoftmax::cuda::sm90::BwdConfig<cutlass::bfloat16_t, kHeadDim, kSavedP> {
  using Trace = PhaseTrace;
};
// Names of each role's phases (trace.h), in the order of the enum.
constexpr const char* kConsumerPhases[] = {"stage wait", "issue S", "stats wait", "combine", "dS",
                                           "dS barrier", "issue dK dQ", "wait S", "front",
                                           "push stats", "wait dK dQ", "dQ empty", "send dQ", "item"};
constexpr const char* kReducerPhases[] = {"dQ full wait", "reduce"};
constexpr const char* kProducerPhases[] = {"acquire", "issue loads"};
static_assert(int(std::size(kConsumerPhases)) == kPhases, "a name per consumer phase");

// One launch of the traced build; each role's cycles per step (of one CTA) by phase.
Result trace_case(cudaStream_t stream, const qksoftmax::Problem& prob, bool saved_p, double steps) {
  QKB_TRY(clear_trace(stream));
  const qksoftmax::Status s = saved_p ? qksoftmax::cuda::run_sm90_bwd<Traced<true>>(prob, stream, kRepeat)
                                      : qksoftmax::cuda::run_sm90_bwd<Traced<false>>(prob, stream, kRepeat);
  QKB_TRY(library_result(s, "traced single-pass backward"));
  PhaseCycles c;
  QKB_TRY(read_trace(stream, &c));
  print_consumer_trace(c, int(TraceRole::kConsumer0), int(TraceRole::kConsumer1), kConsumerPhases, kPhases, steps);
  for (int ph = 0; ph < int(std::size(kReducerPhases)); ++ph) {
    std::printf("  reducer %-14s %7.0f   producer %-12s %7.0f\n", kReducerPhases[ph],
                c.per_step(int(TraceRole::kReducer), ph, steps), kProducerPhases[ph],
                c.per_step(int(TraceRole::kProducer), ph, steps));
  }
  return {};
}

Result run_case(cudaStream_t stream, bool saved_p, int cluster, int clusters, double gemm_tflops, bool trace,
                StepResult* out) {
  using qksoftmax::cuda::run_sm90_bwd;
  const int64_t seq = int64_t(kKeysPerCta) * cluster, heads = clusters;
  DeviceBuffer q, k, dp, p, dq, dk;
  QKB_TRY(q.allocate(size_t(heads * seq * kHeadDim) * 2));
  QKB_TRY(k.allocate(size_t(heads * seq * kHeadDim) * 2));
  QKB_TRY(dp.allocate(size_t(heads * seq * seq) * 2));
  QKB_TRY(p.allocate(size_t(heads * seq * seq) * 2));
  QKB_TRY(dq.allocate(size_t(heads * seq * kHeadDim) * 2));
  QKB_TRY(dk.allocate(size_t(heads * seq * kHeadDim) * 2));
  for (const DeviceBuffer* b : {&q, &k, &dp, &p}) {
    QKB_TRY(fill_value(b->get(), b->bytes() / sizeof(kBf16One), kBf16One, stream));
  }

  qksoftmax::Problem prob;
  prob.pass = qksoftmax::Pass::kBackward;
  prob.B = 1, prob.Hq = heads, prob.Hk = heads, prob.Sq = seq, prob.Sk = seq, prob.D = kHeadDim;
  prob.dtype = qksoftmax::DType::kBFloat16;
  prob.device = qksoftmax::Device::kCUDA;
  prob.mask = qksoftmax::Mask::kNone;
  prob.mode = saved_p ? qksoftmax::BackwardMode::kSavedP : qksoftmax::BackwardMode::kRecompute;
  prob.scale = 1.0f / std::sqrt(float(kHeadDim));
  prob.q = heads_operand(q.get(), heads, seq, kHeadDim);
  prob.k = heads_operand(k.get(), heads, seq, kHeadDim);
  prob.dp = heads_operand(dp.get(), heads, seq, seq);
  if (saved_p) prob.p = heads_operand(p.get(), heads, seq, seq);
  prob.dq = heads_operand(dq.get(), heads, seq, kHeadDim);
  prob.dk = heads_operand(dk.get(), heads, seq, kHeadDim);

  double us = 0;
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) {
    const qksoftmax::Status s = saved_p ? run_sm90_bwd<SavedP>(prob, stream, kRepeat)
                                        : run_sm90_bwd<Recompute>(prob, stream, kRepeat);
    return library_result(s, "single-pass backward");
  }, &us));
  const double steps_per_cta = double(kRepeat) * double(seq / kBlockM);
  const double products = saved_p ? 2 : 3;
  const double flops_per_step = products * 2.0 * kBlockM * kKeysPerCta * kHeadDim;
  const double ctas = double(clusters) * cluster;
  out->mode = saved_p ? "saved_p" : "recompute";
  out->cluster = cluster;
  out->us = us;
  out->step_us = us / steps_per_cta;
  out->tensor_share = flops_per_step * steps_per_cta * ctas / (us * kMicro) / (gemm_tflops * kTera);
  if (trace) {
    std::printf("%s, cluster %d: %.3f us per step\n", out->mode.c_str(), cluster, out->step_us);
    QKB_TRY(trace_case(stream, prob, saved_p, steps_per_cta * ctas));
  }
  return {};
}

Result run(const std::string& json_path, bool trace) {
  MicroRun micro;
  QKB_TRY(start_micro(&micro));
  const DeviceInfo& info = micro.info;
  const Ceilings& ceilings = micro.ceilings;
  cudaStream_t stream = micro.stream.get();
  std::printf("GPU %s, %d SMs; cuBLAS bf16 %.0f TFLOP/s (%.2f per SM)\n", info.name.c_str(), info.sms,
              ceilings.bf16_TFLOPs, ceilings.bf16_TFLOPs / info.sms);
  std::printf("%-10s %7s %9s %12s %8s\n", "mode", "cluster", "launch_us", "step_us/SM", "tensor");
  std::vector<StepResult> results;
  for (bool saved_p : {false, true}) {
    for (int cluster : kClusterSizes) {
      // One head per cluster the device holds at once (the persistent grid's size).
      const int clusters = saved_p ? qksoftmax::cuda::sm90_bwd_resident_clusters<SavedP>(cluster)
                                   : qksoftmax::cuda::sm90_bwd_resident_clusters<Recompute>(cluster);
      if (clusters <= 0) return Result("no cluster of " + std::to_string(cluster) + " CTAs fits the device");
      StepResult r;
      QKB_TRY(run_case(stream, saved_p, cluster, clusters, ceilings.bf16_TFLOPs, trace, &r));
      std::printf("%-10s %7d %9.1f %12.3f %7.1f%%\n", r.mode.c_str(), r.cluster, r.us, r.step_us,
                  100.0 * r.tensor_share);
      results.push_back(r);
    }
  }
  KbStepShape kb_shape;
  std::vector<KbStepResult> kb_results;
  // Where the key-block cases fail, the single pass's results are still written; the failure is the exit status.
  const Result kb = run_kb_steps(micro, trace, &kb_shape, &kb_results);
  if (json_path.empty()) return kb;
  std::FILE* f = nullptr;
  QKB_TRY(open_micro_json(json_path, micro, &f));
  std::fprintf(f, ", \"repeat\": %d", kRepeat);
  write_json_list(f, "steps", results.size(), [&](std::FILE* out, size_t i) {
    const StepResult& r = results[i];
    std::fprintf(out, "{\"mode\": \"%s\", \"cluster\": %d, \"launch_us\": %.2f, \"step_us\": %.4f, \"tensor_share\": %.4f}",
                 r.mode.c_str(), r.cluster, r.us, r.step_us, r.tensor_share);
  });
  if (kb.ok()) write_kb_json(f, kb_shape, kb_results);
  std::fprintf(f, "}\n");
  std::fclose(f);
  return kb;
}

}  // namespace
}  // namespace qkbench

// qksoftmax-step [--trace] [results.json]
int main(int argc, char** argv) {
  std::string json;
  bool trace = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--trace") {
      trace = true;
    } else {
      json = arg;
    }
  }
  return qkbench::micro_exit("qksoftmax-step", qkbench::run(json, trace));
}
