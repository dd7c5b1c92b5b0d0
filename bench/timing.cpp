#include "timing.h"

#include <algorithm>
#include <chrono>

#include "cuda_check.h"

namespace qkbench {
namespace {

constexpr double kMicrosecondsPerMillisecond = 1e3;

class Events {
 public:
  ~Events() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  Result create(int n) {
    events_.reserve(size_t(n));
    for (int i = 0; i < n; ++i) {
      cudaEvent_t e = nullptr;
      QKB_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return {};
  }
  cudaEvent_t operator[](int i) const { return events_[size_t(i)]; }

 private:
  std::vector<cudaEvent_t> events_;
};

}  // namespace

Result time_calls(cudaStream_t stream, const TimingPlan& plan, const EnqueueCall& call, std::vector<double>* us,
                  std::vector<double>* host_us) {
  using Clock = std::chrono::steady_clock;
  Events events;
  QKB_TRY(events.create(plan.runs + 1));
  const int copies = std::max(1, plan.copies);
  int set = 0;
  for (int i = 0; i < plan.warmup; ++i, set = (set + 1) % copies) QKB_TRY(call(set));
  if (host_us) host_us->clear();
  QKB_CUDA(cudaEventRecord(events[0], stream));
  for (int i = 0; i < plan.runs; ++i, set = (set + 1) % copies) {
    const Clock::time_point start = Clock::now();
    QKB_TRY(call(set));
    if (host_us) host_us->push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    QKB_CUDA(cudaEventRecord(events[i + 1], stream));
  }
  QKB_CUDA(cudaEventSynchronize(events[plan.runs]));
  us->clear();
  for (int i = 0; i < plan.runs; ++i) {
    float ms = 0;
    QKB_CUDA(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
    us->push_back(double(ms) * kMicrosecondsPerMillisecond);
  }
  return {};
}

Result median_call_us(cudaStream_t stream, const TimingPlan& plan, const EnqueueCall& call, double* us,
                      double* host_us) {
  std::vector<double> times, host_times;
  QKB_TRY(time_calls(stream, plan, call, &times, host_us ? &host_times : nullptr));
  *us = median(std::move(times));
  if (host_us) *host_us = median(std::move(host_times));
  return {};
}

}  // namespace qkbench
