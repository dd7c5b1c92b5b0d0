// The key-block pass's cases of qksoftmax-step (kb_step.h): the pass launched through its internal entry point,
// run_sm90_keyblock, with the row statistics' outputs (LSE, D) and a cleared dQ target provided here, so that
// the inputs can alias (a Problem that the public API would route elsewhere). With --trace, each case runs once
// more through a traced build of the pass (TracedKb) and prints each role's cycles per step by phase.
#include "kb_step.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <string>
#include <utility>

#include "cuda/sm90/kb_launch.cuh"
#include "cuda/sm90/sp_launch.cuh"
#include "cuda_check.h"
#include "gpu.h"
#include "phase_trace.cuh"
#include "timing.h"

namespace qkbench {
namespace {

using Element = cutlass::bfloat16_t;
template <bool kSavedP, bool kDirectDq>
using Kb = qksoftmax::cuda::sm90::KbConfig<Element, int(kKbHeadDim), kSavedP, kDirectDq>;
static_assert(Kb<false, true>::kBlockM == kKbBlockM && Kb<false, true>::kBlockN == kKbBlockN,
              "kb_step.h's step is the pass's");
static_assert(sizeof(Element) == kKbElementBytes, "kb_step.h's element size is bf16's");
// The traced build of a case (phase_trace.cuh): the same config, its roles reading the SM clock.
template <bool kSavedP, bool kDirectDq>
struct TracedKb : Kb<kSavedP, kDirectDq> {
  using Trace = PhaseTrace;
};

// kb_step_shape by hand on an H200 (132 SMs): 16 key heads × 8 key blocks = 128 CTAs, 64 steps each; K and dK
// 16 · 1024 · 128 · 2 B = 4 MiB each, dQ 128 · 512 · 128 · 2 B = 16 MiB, Q 639 · 128 · 2 B = 163 584 B, dP (and
// P) 639 · 1024 · 2 B = 1 308 672 B, LSE and D 2 KiB each.
constexpr int64_t kH200Sms = 132;
constexpr int64_t kMiB = int64_t(1) << 20;
constexpr KbStepShape kH200Recompute = kb_step_shape(kH200Sms, false, sizeof(Element));
static_assert(kH200Recompute.key_heads == 16 && kH200Recompute.query_heads == 128 && kH200Recompute.ctas == 128 &&
                  kH200Recompute.steps_per_cta == 64 && kH200Recompute.shared_rows == 639,
              "the H200 shape");
static_assert(kH200Recompute.bytes == 24 * kMiB + 163584 + 1308672 + 4096, "the H200 recompute bytes");
static_assert(kb_step_shape(kH200Sms, true, sizeof(Element)).bytes == kH200Recompute.bytes + 1308672,
              "saved-P reads P too");
static_assert(kb_step_shape(kH200Sms, false, sizeof(float)).bytes == kH200Recompute.bytes + 16 * kMiB,
              "the fp32 accumulator is twice dQ's size");

constexpr int kWarmup = 3;  // launches that bring the data into L2
constexpr int kRuns = 15;
constexpr double kBytesPerMiB = double(kMiB);
constexpr int kFlopsPerMac = 2;
// Sᵀ, dK, dQ (kb_mainloop.cuh; its last step also issues an Sᵀ that nothing reads, 1 in 64 not counted).
constexpr int kProductsRecompute = 3;
constexpr int kProductsSavedP = 2;     // dK, dQ: P is read, not recomputed
// D of every row: not the true Σ P ∘ dP of these all-ones inputs (1), which would make every dS zero.
constexpr float kDelta = 0.5f;

using Launch = qksoftmax::Status (*)(const qksoftmax::Problem&, const qksoftmax::cuda::generic::Params&,
                                     const qksoftmax::cuda::sm90::DqTarget&, int*, CUstream_st*);

// The launch of a case's config, Cfg<kSavedP, kDirectDq>: Kb or TracedKb.
template <template <bool, bool> class Cfg>
Launch kb_launch(bool saved_p, bool direct_dq) {
  using qksoftmax::cuda::run_sm90_keyblock;
  if (saved_p) return direct_dq ? &run_sm90_keyblock<Cfg<true, true>> : &run_sm90_keyblock<Cfg<true, false>>;
  return direct_dq ? &run_sm90_keyblock<Cfg<false, true>> : &run_sm90_keyblock<Cfg<false, false>>;
}

// Names of each role's phases (trace.h's KbTracePhase), in the order of the enum.
using qksoftmax::cuda::sm90::KbTracePhase;
using qksoftmax::cuda::sm90::KbTraceRole;
constexpr const char* kKbConsumerPhases[] = {"stage wait", "dP ldmatrix", "rows wait", "dS",
                                             "dS stmatrix", "wait dQ", "issue S", "issue dK",
                                             "write dQ", "dS barrier", "issue dQ", "wait S dK",
                                             "tile start", "tile end"};
constexpr const char* kKbLoadPhases[] = {"acquire", "issue loads"};
constexpr const char* kKbRowsPhases[] = {"acquire", "write"};
constexpr const char* kKbDqPhases[] = {"full wait", "reduce-add"};
static_assert(int(std::size(kKbConsumerPhases)) == int(KbTracePhase::kCount), "a name per consumer phase");
static_assert(std::size(kKbLoadPhases) == std::size(kKbRowsPhases) &&
                  std::size(kKbRowsPhases) == std::size(kKbDqPhases),
              "a line per phase of the load thread, the rows warp and the dQ warp");

// Every case's buffers, allocated once at their largest.
struct KbBuffers {
  DeviceBuffer q, k, dp, p, rows, dq, dq_accum, dk, tile_counter;

  Result allocate(const KbStepShape& s, cudaStream_t stream) {
    const size_t e = size_t(kKbElementBytes);
    QKB_TRY(q.allocate(size_t(s.shared_rows * kKbHeadDim) * e));
    QKB_TRY(dp.allocate(size_t(s.shared_rows * kKbKeys) * e));
    QKB_TRY(p.allocate(dp.bytes()));
    QKB_TRY(k.allocate(size_t(s.key_heads * kKbKeys * kKbHeadDim) * e));
    QKB_TRY(dk.allocate(k.bytes()));
    QKB_TRY(dq.allocate(size_t(s.query_heads * kKbRows * kKbHeadDim) * e));
    QKB_TRY(dq_accum.allocate(size_t(s.query_heads * kKbRows * kKbHeadDim) * sizeof(float)));
    QKB_TRY(rows.allocate(2 * size_t(kKbRows) * sizeof(float)));  // LSE, then D
    QKB_TRY(tile_counter.allocate(sizeof(int)));
    for (const DeviceBuffer* b : {&q, &k, &dp, &p}) {
      QKB_TRY(fill_value(b->get(), b->bytes() / sizeof(kBf16One), kBf16One, stream));
    }
    return {};
  }
  float* lse() const { return static_cast<float*>(rows.get()); }
  float* delta() const { return lse() + kKbRows; }
};

// A block of `rows` rows whose head h starts at row h (kb_step.h): head stride one row.
qksoftmax::Operand shared_rows(void* ptr, int64_t rows, int64_t cols) { return {ptr, rows * cols, cols, cols, 1}; }

qksoftmax::Problem kb_problem(const KbStepShape& s, bool saved_p, const KbBuffers& b, int device) {
  qksoftmax::Problem prob;
  prob.pass = qksoftmax::Pass::kBackward;
  prob.B = 1, prob.Hq = s.query_heads, prob.Hk = s.key_heads, prob.Sq = kKbRows, prob.Sk = kKbKeys;
  prob.D = kKbHeadDim;
  prob.dtype = qksoftmax::DType::kBFloat16;
  prob.device = qksoftmax::Device::kCUDA;
  prob.device_index = device;  // what the public API resolves from the pointers
  prob.mask = qksoftmax::Mask::kNone;
  prob.mode = saved_p ? qksoftmax::BackwardMode::kSavedP : qksoftmax::BackwardMode::kRecompute;
  prob.scale = 1.0f / std::sqrt(float(kKbHeadDim));
  prob.q = shared_rows(b.q.get(), s.shared_rows, kKbHeadDim);
  prob.dp = shared_rows(b.dp.get(), s.shared_rows, kKbKeys);
  if (saved_p) prob.p = shared_rows(b.p.get(), s.shared_rows, kKbKeys);
  prob.k = heads_operand(b.k.get(), s.key_heads, kKbKeys, kKbHeadDim);
  prob.dk = heads_operand(b.dk.get(), s.key_heads, kKbKeys, kKbHeadDim);
  prob.dq = heads_operand(b.dq.get(), s.query_heads, kKbRows, kKbHeadDim);
  return prob;
}

// One launch of the case's traced build (its inputs and dQ target as the timed launches left them); each role's
// cycles per step (of one CTA) by phase, over `steps` steps of all CTAs.
Result trace_case(cudaStream_t stream, const qksoftmax::Problem& prob, const qksoftmax::cuda::generic::Params& rows,
                  const qksoftmax::cuda::sm90::DqTarget& target, int* counter, bool saved_p, bool direct_dq,
                  double steps) {
  QKB_TRY(clear_trace(stream));
  QKB_CUDA(cudaMemsetAsync(counter, 0, sizeof(int), stream));
  QKB_TRY(library_result(kb_launch<TracedKb>(saved_p, direct_dq)(prob, rows, target, counter, stream),
                         "traced key-block pass"));
  PhaseCycles c;
  QKB_TRY(read_trace(stream, &c));
  print_consumer_trace(c, int(KbTraceRole::kConsumer0), int(KbTraceRole::kConsumer1), kKbConsumerPhases,
                       int(KbTracePhase::kCount), steps);
  for (int ph = 0; ph < int(std::size(kKbLoadPhases)); ++ph) {
    std::printf("  load %-12s %7.0f   rows %-10s %7.0f   dq %-12s %7.0f\n", kKbLoadPhases[ph],
                c.per_step(int(KbTraceRole::kLoad), ph, steps), kKbRowsPhases[ph],
                c.per_step(int(KbTraceRole::kRows), ph, steps), kKbDqPhases[ph],
                c.per_step(int(KbTraceRole::kDq), ph, steps));
  }
  return {};
}

Result run_case(const MicroRun& micro, const KbStepShape& s, const KbBuffers& b, bool saved_p, bool direct_dq,
                bool trace, KbStepResult* out) {
  namespace qc = qksoftmax::cuda;
  cudaStream_t stream = micro.stream.get();
  int device = 0;
  QKB_CUDA(cudaGetDevice(&device));
  const qksoftmax::Problem prob = kb_problem(s, saved_p, b, device);
  // The statistics pass's outputs, one vector for every head: the true LSE of these all-ones rows (every score
  // D · scale, over Sk keys), so that recompute's P = 1/Sk; D = kDelta.
  const float lse = float(kKbHeadDim) * prob.scale + std::log(float(kKbKeys));
  QKB_TRY(fill_value(b.lse(), size_t(kKbRows), lse, stream));
  QKB_TRY(fill_value(b.delta(), size_t(kKbRows), kDelta, stream));
  const qc::generic::RowVec lse_rows{b.lse(), 0, 0, 1}, delta_rows{b.delta(), 0, 0, 1};
  const qc::generic::Params rows{prob, lse_rows, delta_rows, false};
  // What the statistics pass clears: cleared once, the launches then add into it (finite: dS is small).
  const qc::sm90::DqTarget target =
      qc::dq_target<Element>(prob, direct_dq, static_cast<float*>(b.dq_accum.get()));
  const DeviceBuffer& cleared = direct_dq ? b.dq : b.dq_accum;
  QKB_CUDA(cudaMemsetAsync(cleared.get(), 0, cleared.bytes(), stream));

  const Launch launch = kb_launch<Kb>(saved_p, direct_dq);
  double us = 0;
  // The pass's tile counter, which the row statistics set to 0 before it: here a 4-byte memset before each
  // launch, inside the timed interval (~1 % of a launch).
  int* const counter = static_cast<int*>(b.tile_counter.get());
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) {
    QKB_CUDA(cudaMemsetAsync(counter, 0, sizeof(int), stream));
    return library_result(launch(prob, rows, target, counter, stream), "key-block pass");
  }, &us));
  const int64_t dq_element_bytes = direct_dq ? kKbElementBytes : int64_t(sizeof(float));
  const double total_steps = double(s.ctas) * double(s.steps_per_cta);
  const double active_sms = double(std::min<int64_t>(s.ctas, micro.info.sms));
  out->mode = saved_p ? "saved_p" : "recompute";
  out->dq = direct_dq ? "bf16" : "fp32";
  out->products = saved_p ? kProductsSavedP : kProductsRecompute;
  out->bytes = kb_step_shape(micro.info.sms, saved_p, dq_element_bytes).bytes;
  out->us = us;
  out->step_us = us / double(out->rounds * s.steps_per_cta);
  const double flops = double(out->products) * kFlopsPerMac * kKbBlockM * kKbBlockN * kKbHeadDim * total_steps;
  out->tensor_share = flops / (us * kMicro) / (micro.ceilings.bf16_TFLOPs * kTera);
  if (trace) {
    std::printf("kb %s, dq %s: %.3f us per step\n", out->mode.c_str(), out->dq.c_str(), out->step_us);
    QKB_TRY(trace_case(stream, prob, rows, target, counter, saved_p, direct_dq, total_steps));
  }
  return {};
}

// The pingpong single pass (src/cuda/sm90/sp_pp_config.h): the same step with the row statistics computed in the
// pass instead of read, on rows of kSpKeys keys, so that one CTA holds a row, each consumer warpgroup every
// other row block. As many key heads as the key-block cases have CTAs, one CTA each, kKbGroup query heads per key
// head of kKbRows rows: the same 64 steps per CTA. Q, dP and dQ are one block of rows read (written) by every
// query head (head stride one row, as kb_step.h's Q and dP): the dQ stores of different CTAs land on the same
// rows, which only a timing may do. dP ~ N(0, 1), so that dS is not zero.
constexpr int64_t kSpKeys = 128;
// As dispatched (with a dK warpgroup), with dK held by the consumers (sp_pp_config.h's kDkWarpgroup = false), and
// in clusters of 2, 4 and 8 (rows of 256, 512, 1024 keys, each CTA 128 of them: the same steps per CTA, each
// block's statistics exchanged with every other CTA of the cluster; dQ added into rows that nobody clears, which
// only a timing may do). Clusters of 4 and 8 are timed without a trace (their traced builds would double the
// bench's compile): QKSOFTMAX_STEP_TRACED_MAX_CLUSTER=8, an A/B build's knob, traces them too, for the exchange
// with 3 and 7 peers. Saved-P (SpPpConfig's kSavedP) in one CTA and in clusters of 8, unmasked and causal: P read
// as dP is (N(0, 1) values: a timing), its trace's "wait S dP" the wait for P and dP.
using Sp = qksoftmax::cuda::sm90::SpPpConfig<Element, int(kKbHeadDim)>;
using Sp3 = qksoftmax::cuda::sm90::SpPpConfig<Element, int(kKbHeadDim), false>;
using Sp2 = qksoftmax::cuda::sm90::SpPpConfig<Element, int(kKbHeadDim), true, 2>;
using Sp4 = qksoftmax::cuda::sm90::SpPpConfig<Element, int(kKbHeadDim), true, 4>;
using Sp8 = qksoftmax::cuda::sm90::SpPpConfig<Element, int(kKbHeadDim), true, 8>;
using SpP = qksoftmax::cuda::sm90::SpPpConfig<Element, int(kKbHeadDim), true, 1, true>;
using SpP8 = qksoftmax::cuda::sm90::SpPpConfig<Element, int(kKbHeadDim), true, 8, true>;
#ifdef QKSOFTMAX_STEP_TRACED_MAX_CLUSTER
constexpr int kSpTracedMaxCluster = QKSOFTMAX_STEP_TRACED_MAX_CLUSTER;
#else
constexpr int kSpTracedMaxCluster = 2;
#endif
template <class Cfg>
struct TracedSp : Cfg {
  using Trace = PhaseTrace;
};
using qksoftmax::cuda::sm90::PpTracePhase;
constexpr const char* kSpConsumerPhases[] = {"wait S dP", "sums",       "push",      "exchange",   "combine",
                                             "dS",        "dS free",
                                             "dS store",  "turn wait",  "issue",     "wait dK dQ", "store dQ",
                                             "tile start", "tile end",  "tile read", "tile K"};
static_assert(int(std::size(kSpConsumerPhases)) == int(PpTracePhase::kCount), "a name per phase");
using qksoftmax::cuda::sm90::PpDkTracePhase;
constexpr const char* kSpDkPhases[] = {"dS wait", "product", "tile end"};
static_assert(int(std::size(kSpDkPhases)) == int(PpDkTracePhase::kCount), "a name per phase");
static_assert(Sp::kMaxSk == kSpKeys && Sp::kBlockM == kKbBlockM, "the single pass's block is the key-block step");
static_assert(Sp2::kMaxSk == Sp2::kCluster * kSpKeys && Sp8::kMaxSk == kKbKeys, "a cluster's CTA holds kSpKeys keys");

// Causal cases (`causal`): square rows of 128·C keys, one query head per key head, in clusters of C with heads in
// mirrored pairs (KbTileOrder::pair_heads), kCausalPairRounds pairs per resident cluster: each CTA's 2C + 2 steps a
// pair make tiles of 2 to 2C blocks, so that a head's start and end weigh on the step as in seed16 (the unmasked
// cases' tiles hold every block of kKbRows rows for each query head of a group).
constexpr int64_t kCausalPairRounds = 8;
constexpr uint64_t kDpSeed = 1, kPSeed = 2;  // the single-pass cases' random dP and (saved-P) P

template <class Cfg>
Result run_sp_case(const MicroRun& micro, const KbStepShape& s, bool causal, bool trace, KbStepResult* out) {
  cudaStream_t stream = micro.stream.get();
  int device = 0;
  QKB_CUDA(cudaGetDevice(&device));
  constexpr int64_t kKeys = Cfg::kMaxSk;  // a row's, over the cluster's CTAs
  constexpr int64_t kC = Cfg::kCluster;
  // The clusters resident at once (at most one per head in the unmasked cases).
  int64_t resident = micro.info.sms / kC;
  if constexpr (kC > 1) {
    resident = qksoftmax::cuda::sm90_single_pass_resident_clusters<Cfg>();
    if (resident <= 0) return Result("no cluster of " + std::to_string(kC) + " CTAs fits the device");
  }
  const int64_t key_heads = causal ? 2 * resident * kCausalPairRounds : s.ctas / kC;
  const int64_t group = causal ? 1 : kKbGroup, query_heads = key_heads * group;
  const int64_t sq = causal ? kKeys : kKbRows;
  const int64_t rows = sq + query_heads - 1;
  const size_t e = size_t(kKbElementBytes);
  DeviceBuffer q, k, dp, p, dq, dk;  // (p: saved-P)
  QKB_TRY(q.allocate(size_t(rows * kKbHeadDim) * e));
  QKB_TRY(dq.allocate(q.bytes()));
  QKB_TRY(dp.allocate(size_t(rows * kKeys) * e));
  if constexpr (Cfg::kSavedP) {
    QKB_TRY(p.allocate(dp.bytes()));
    QKB_TRY(fill_normal(p.get(), qksoftmax::DType::kBFloat16, int64_t(p.bytes() / e), kPSeed, stream));
  }
  QKB_TRY(k.allocate(size_t(key_heads * kKeys * kKbHeadDim) * e));
  QKB_TRY(dk.allocate(k.bytes()));
  for (const DeviceBuffer* b : {&q, &k}) QKB_TRY(fill_value(b->get(), b->bytes() / sizeof(kBf16One), kBf16One, stream));
  QKB_TRY(fill_normal(dp.get(), qksoftmax::DType::kBFloat16, int64_t(dp.bytes() / e), kDpSeed, stream));

  qksoftmax::Problem prob;
  prob.pass = qksoftmax::Pass::kBackward;
  prob.B = 1, prob.Hq = query_heads, prob.Hk = key_heads, prob.Sq = sq, prob.Sk = kKeys;
  prob.D = kKbHeadDim;
  prob.dtype = qksoftmax::DType::kBFloat16;
  prob.device = qksoftmax::Device::kCUDA;
  prob.device_index = device;
  prob.mask = causal ? qksoftmax::Mask::kCausal : qksoftmax::Mask::kNone;
  prob.mode = Cfg::kSavedP ? qksoftmax::BackwardMode::kSavedP : qksoftmax::BackwardMode::kRecompute;
  prob.scale = 1.0f / std::sqrt(float(kKbHeadDim));
  prob.q = shared_rows(q.get(), rows, kKbHeadDim);
  prob.dp = shared_rows(dp.get(), rows, kKeys);
  if constexpr (Cfg::kSavedP) prob.p = shared_rows(p.get(), rows, kKeys);
  prob.dq = shared_rows(dq.get(), rows, kKbHeadDim);
  prob.k = heads_operand(k.get(), key_heads, kKeys, kKbHeadDim);
  prob.dk = heads_operand(dk.get(), key_heads, kKeys, kKbHeadDim);

  double us = 0;
  QKB_TRY(median_call_us(stream, {kWarmup, kRuns, 1}, [&](int) {
    return library_result(qksoftmax::cuda::run_sm90_single_pass<Cfg>(prob, stream, false), "single pass");
  }, &us));
  // The live blocks of all CTAs, and the steps of one CTA in the launch: the heads (causal: the pairs) a cluster
  // runs one after the other, the grid being the clusters resident at once. A causal head's blocks over its C CTAs
  // are Σ_r (2C − 2r) = C (C + 1); a pair's steps 2C + 2 in every CTA.
  resident = std::min<int64_t>(resident, causal ? key_heads / 2 : key_heads);
  const double total_steps = causal ? double(key_heads * kC * (kC + 1)) : double(s.ctas) * double(s.steps_per_cta);
  const int64_t cta_steps = causal ? 2 * kC + 2 : s.steps_per_cta;
  out->rounds = causal ? (key_heads / 2 + resident - 1) / resident : (key_heads + resident - 1) / resident;
  out->mode = (kC > 1 ? "single_pass_c" + std::to_string(kC) + (causal ? "_causal" : "")
               : Cfg::kDkWarpgroup ? "single_pass"
                                   : "single_pass_3wg") +
              (Cfg::kSavedP ? "_savedp" : "");
  out->dq = "bf16";
  out->products = Cfg::kSavedP ? kProductsSavedP : kProductsRecompute;
  out->bytes = int64_t(q.bytes() + dq.bytes() + dp.bytes() + p.bytes() + k.bytes() + dk.bytes());
  out->us = us;
  out->step_us = us / double(out->rounds * cta_steps);
  const double flops = double(out->products) * kFlopsPerMac * kKbBlockM * kSpKeys * kKbHeadDim * total_steps;
  out->tensor_share = flops / (us * kMicro) / (micro.ceilings.bf16_TFLOPs * kTera);
  if constexpr (Cfg::kCluster > kSpTracedMaxCluster) {
    return {};
  } else if (trace) {
    std::printf("kb %s: %.3f us per step\n", out->mode.c_str(), out->step_us);
    QKB_TRY(clear_trace(stream));
    QKB_TRY(library_result(qksoftmax::cuda::run_sm90_single_pass<TracedSp<Cfg>>(prob, stream, false),
                           "traced single pass"));
    PhaseCycles c;
    QKB_TRY(read_trace(stream, &c));
    print_consumer_trace(c, int(KbTraceRole::kConsumer0), int(KbTraceRole::kConsumer1), kSpConsumerPhases,
                         int(PpTracePhase::kCount), total_steps);
    if constexpr (Cfg::kDkWarpgroup) {
      for (int ph = 0; ph < int(PpDkTracePhase::kCount); ++ph) {
        std::printf("  dk warpgroup %-12s %7.0f\n", kSpDkPhases[ph], c.per_step(int(KbTraceRole::kDq), ph, total_steps));
      }
    }
  }
  return {};
}

}  // namespace

Result run_kb_steps(const MicroRun& micro, bool trace, KbStepShape* shape, std::vector<KbStepResult>* results) {
  const KbStepShape s = kb_step_shape(micro.info.sms, false, kKbElementBytes);
  if (s.ctas == 0) return Result("the key-block cases need " + std::to_string(kKbKeys / kKbBlockN) + " SMs or more");
  *shape = s;
  KbBuffers buffers;
  QKB_TRY(buffers.allocate(s, micro.stream.get()));
  std::printf("key-block pass: %lld key heads x %lld query heads, Sq %lld, Sk %lld, non-causal: %lld CTAs on %d "
              "SMs, %lld steps each; L2 %.1f MiB\n",
              (long long)s.key_heads, (long long)kKbGroup, (long long)kKbRows, (long long)kKbKeys,
              (long long)s.ctas, micro.info.sms, (long long)s.steps_per_cta, double(micro.info.l2_bytes) / kBytesPerMiB);
  std::printf("step_us/SM = launch_us x active SMs / the steps of all CTAs; tensor = the products at the cuBLAS "
              "rate over that time\n");
  std::printf("kb %-10s %-4s %9s %12s %8s %7s %8s\n", "mode", "dq", "launch_us", "step_us/SM", "products",
              "tensor", "data_MiB");
  for (bool saved_p : {false, true}) {
    for (bool direct_dq : {true, false}) {
      KbStepResult r;
      QKB_TRY(run_case(micro, s, buffers, saved_p, direct_dq, trace, &r));
      std::printf("kb %-10s %-4s %9.1f %12.3f %8d %6.1f%% %8.1f\n", r.mode.c_str(), r.dq.c_str(), r.us,
                  r.step_us, r.products, 100.0 * r.tensor_share, double(r.bytes) / kBytesPerMiB);
      results->push_back(r);
    }
  }
  // As dispatched, three warpgroups, in clusters of 2, 4 and 8; then causal rows in clusters, heads in pairs; then
  // saved-P in one CTA and in clusters of 8, unmasked and causal.
  using SpCase = Result (*)(const MicroRun&, const KbStepShape&, bool, bool, KbStepResult*);
  struct SpForm {
    SpCase run;
    int64_t keys;
    bool causal;
  };
  constexpr SpForm kSpForms[] = {{&run_sp_case<Sp>, Sp::kMaxSk, false},   {&run_sp_case<Sp3>, Sp3::kMaxSk, false},
                                 {&run_sp_case<Sp2>, Sp2::kMaxSk, false}, {&run_sp_case<Sp4>, Sp4::kMaxSk, false},
                                 {&run_sp_case<Sp8>, Sp8::kMaxSk, false}, {&run_sp_case<Sp2>, Sp2::kMaxSk, true},
                                 {&run_sp_case<Sp4>, Sp4::kMaxSk, true},  {&run_sp_case<Sp8>, Sp8::kMaxSk, true},
                                 {&run_sp_case<SpP>, SpP::kMaxSk, false}, {&run_sp_case<SpP8>, SpP8::kMaxSk, false},
                                 {&run_sp_case<SpP8>, SpP8::kMaxSk, true}};
  for (const SpForm& form : kSpForms) {
    KbStepResult r;
    QKB_TRY(form.run(micro, s, form.causal, trace, &r));
    std::printf("kb %-10s %-4s %9.1f %12.3f %8d %6.1f%% %8.1f   (%srows of %lld keys, pingpong; %lld round%s)\n",
                r.mode.c_str(), r.dq.c_str(), r.us, r.step_us, r.products, 100.0 * r.tensor_share,
                double(r.bytes) / kBytesPerMiB, form.causal ? "causal " : "", (long long)form.keys,
                (long long)r.rounds, r.rounds == 1 ? "" : "s");
    results->push_back(r);
  }
  return {};
}

void write_kb_json(std::FILE* f, const KbStepShape& s, const std::vector<KbStepResult>& results) {
  std::fprintf(f, ", \"key_block_shape\": {\"key_heads\": %lld, \"query_heads\": %lld, \"sq\": %lld, \"sk\": %lld, "
               "\"ctas\": %lld, \"steps_per_cta\": %lld}",
               (long long)s.key_heads, (long long)s.query_heads, (long long)kKbRows, (long long)kKbKeys,
               (long long)s.ctas, (long long)s.steps_per_cta);
  write_json_list(f, "key_block", results.size(), [&](std::FILE* out, size_t i) {
    const KbStepResult& r = results[i];
    std::fprintf(out, "{\"mode\": \"%s\", \"dq\": \"%s\", \"launch_us\": %.2f, \"step_us\": %.4f, \"products\": %d, "
                 "\"tensor_share\": %.4f, \"bytes\": %lld, \"rounds\": %lld}",
                 r.mode.c_str(), r.dq.c_str(), r.us, r.step_us, r.products, r.tensor_share, (long long)r.bytes,
                 (long long)r.rounds);
  });
}

}  // namespace qkbench
