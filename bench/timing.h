// Timing by CUDA events, as CONTRACT.md section 6 says: warm-up calls first, then timed calls issued back
// to back on one stream with an event between consecutive calls (so launch overhead hides behind the
// previous call as in real use); a call's time is the difference of its two events; the median is reported.
// The only synchronisation is on the last event.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "result.h"
#include "results.h"

namespace qkbench {

struct TimingPlan {
  int warmup = 0;
  int runs = 0;
  int copies = 1;  // call i works on input set i % copies (the warm-ups count too)
};

// Enqueues one call on set `set`; must not synchronise.
using EnqueueCall = std::function<Result(int set)>;

// Per-call times in µs, one per timed call. With host_us, also the host's wall time to enqueue each timed
// call (validation, descriptors, launches): where it exceeds the GPU time, the GPU waits on the host and the
// events measure the host.
Result time_calls(cudaStream_t stream, const TimingPlan& plan, const EnqueueCall& call, std::vector<double>* us,
                  std::vector<double>* host_us = nullptr);

// time_calls, then the medians, in µs.
Result median_call_us(cudaStream_t stream, const TimingPlan& plan, const EnqueueCall& call, double* us,
                      double* host_us = nullptr);

}  // namespace qkbench
