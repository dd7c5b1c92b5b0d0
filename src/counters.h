// Counts of the library's own work, for the tests that keep the call path at one validation per call.
#pragma once

#include <atomic>
#include <cstdint>

namespace qksoftmax::detail {

struct CallCounters {
  std::atomic<uint64_t> validations{0};      // make_problem: one per plan, size query or call
  std::atomic<uint64_t> pointer_queries{0};  // cudaPointerGetAttributes: one per undeclared distinct pointer
};

inline CallCounters& call_counters() {
  static CallCounters counters;
  return counters;
}

inline void count(std::atomic<uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }

}  // namespace qksoftmax::detail
