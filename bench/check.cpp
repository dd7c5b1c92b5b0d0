#include "check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <thread>

#include "accuracy.h"
#include "dtype.h"

namespace qkbench {
namespace {

constexpr int64_t kMinElementsPerThread = 1 << 16;

template <typename Ref>
double relative_error_impl(const void* out, DType dtype, const Ref* ref, int64_t n) {
  std::mutex mutex;
  double diff2 = 0, ref2 = 0;
  parallel_for(n, [&](int64_t begin, int64_t end) {
    double d = 0, r = 0;
    for (int64_t i = begin; i < end; ++i) {
      const double x = qksoftmax::load_as_float(out, i, dtype);
      const double y = double(ref[i]);
      d += (x - y) * (x - y);
      r += y * y;
    }
    std::lock_guard lock(mutex);
    diff2 += d;
    ref2 += r;
  });
  if (std::isnan(diff2)) return NAN;
  if (ref2 == 0) return diff2 == 0 ? 0 : INFINITY;
  return std::sqrt(diff2 / ref2);
}

std::string format_error(double e) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", e);
  return buf;
}

}  // namespace

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = std::clamp<int64_t>(n / kMinElementsPerThread, 1, cores);
  if (threads == 1) {
    body(0, n);
    return;
  }
  std::vector<std::jthread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin < end) pool.emplace_back(body, begin, end);
  }
}

std::vector<float> to_floats(const void* data, DType dtype, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[size_t(i)] = qksoftmax::load_as_float(data, i, dtype);
  });
  return out;
}

double relative_error(const void* out, DType dtype, const float* ref, int64_t n) {
  return relative_error_impl(out, dtype, ref, n);
}

double relative_error(const void* out, DType dtype, const double* ref, int64_t n) {
  return relative_error_impl(out, dtype, ref, n);
}

std::string verdict(const std::vector<OutputError>& errors, DType dtype) {
  const double bound = qksoftmax::accuracy::bound(dtype);
  std::string failed;
  for (const OutputError& e : errors) {
    if (e.rel_error <= bound) continue;  // false for NaN
    failed += (failed.empty() ? "" : ", ") + e.name + " " + format_error(e.rel_error) + " > " + format_error(bound);
  }
  return failed.empty() ? std::string() : "FAILED: " + failed;
}

}  // namespace qkbench
