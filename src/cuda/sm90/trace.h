// Phase timing of the single-pass backward, for the step micro-benchmark (qksoftmax-step --trace). A config's
// Trace type is NoTrace (every call compiles to nothing); a benchmark's config may name ClockTrace<Sink>, under
// which lane 0 of the first warp of each role reads the SM clock at every phase boundary of its loop and adds
// the cycles since the previous boundary to Sink::add(role, phase, cycles) (a global counter in the benchmark).
#pragma once

#include <cute/config.hpp>

#include <cstdint>

namespace qksoftmax::cuda::sm90 {

// The roles whose loops are timed, and the phases of each (a phase ends where the next begins).
enum class TraceRole : int { kConsumer0, kConsumer1, kReducer, kProducer, kCount };
enum class TracePhase : int {
  // consumers, in the order of a turn of the step loop
  kStageWait,     // the next step's Q and dP (and P) loaded
  kIssueS,        // S of the next step issued
  kStatsWait,     // every CTA's statistics of this step arrived
  kCombine,       // the statistics combined, the slots freed
  kDs,            // dS computed and written
  kDsBarrier,     // both consumers' dS written
  kIssueDkDq,     // the dK and dQ products issued
  kWaitS,         // S of the next step done
  kFront,         // the next step's dP (and P) read, its partial statistics
  kPushStats,     // the statistics pushed
  kWaitDkDq,      // the dK and dQ products done
  kDqEmpty,       // the owners' dQ slots free
  kSendDq,        // the stage freed, the dQ pieces pushed (or stored)
  kItem,          // per work item: K waited for, dK stored
  // reducers
  kDqFullWait = 0,  // every CTA's dQ pieces arrived
  kReduce,          // summed, scaled, stored, the slots freed
  // producer
  kAcquire = 0,  // a stage free
  kIssueLoads,   // its loads issued
  kCount = 14
};

struct NoTrace {
  CUTE_DEVICE explicit NoTrace(TraceRole, bool) {}
  CUTE_DEVICE void mark(TracePhase) {}
};

template <class Sink>
struct ClockTrace {
  uint32_t last;
  int role;
  bool on;  // lane 0 of the role's first warp

  CUTE_DEVICE static uint32_t now() {
    uint32_t c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    return c;
  }
  CUTE_DEVICE ClockTrace(TraceRole r, bool first_warp)
      : last(now()), role(int(r)), on(first_warp && threadIdx.x % 32 == 0) {}
  CUTE_DEVICE void mark(TracePhase phase) {
    const uint32_t t = now();
    if (on) Sink::add(role, int(phase), t - last);
    last = t;
  }
};

}  // namespace qksoftmax::cuda::sm90
