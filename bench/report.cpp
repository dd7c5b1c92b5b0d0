#include "report.h"

#include <unistd.h>

#include <cstdio>

namespace qkbench {
namespace {

constexpr double kGiga = 1e9;
constexpr double kTera = 1e12;
constexpr double kMicro = 1e-6;
constexpr double kPercent = 100;

std::string errors_text(const CaseResult& c) {
  std::string text;
  char buf[48];
  for (const OutputError& e : c.errors) {
    std::snprintf(buf, sizeof buf, "%s%s %.1e", text.empty() ? "" : " ", e.name.c_str(), e.rel_error);
    text += buf;
  }
  return text;
}

void print_case(const CaseResult& c) {
  const Shape& s = c.shape;
  std::printf("%4lld %5lld %6lld %4lld", (long long)s.B, (long long)s.H, (long long)s.S, (long long)s.D);
  if (!c.us) {
    std::printf("  %s\n", c.failure.c_str());
    return;
  }
  const double seconds = *c.us * kMicro;
  std::printf(" %10.1f", *c.us);
  if (c.host_us)
    std::printf(" %7.1f", *c.host_us);
  else
    std::printf(" %7s", "-");
  std::printf(" %8.2f %8.1f", c.cost.flops / seconds / kTera, c.cost.bytes / seconds / kGiga);
  if (c.sol_us)
    std::printf(" %9.1f %6.1f%%", *c.sol_us, kPercent * *c.sol_us / *c.us);
  else
    std::printf(" %9s %7s", "-", "-");
  // (a failed case timed all the same, --time-failed, says so after its errors)
  std::printf(" %6d  %s%s%s\n", c.copies, errors_text(c).c_str(), c.passed() ? "" : "  ", c.failure.c_str());
}

}  // namespace

void print_ceilings(const Ceilings& c) {
  std::printf("ceilings: copy %.0f GB/s (read + written), write %.0f GB/s, L2 read %.0f GB/s, "
              "L2 fp32 reduce %.0f GB/s, GEMM 8192^3: bf16 %.0f, fp16 %.0f, tf32 %.0f, fp32 %.1f TFLOP/s\n",
              c.copy_GBps, c.write_GBps, c.l2_read_GBps, c.l2_reduce_GBps, c.bf16_TFLOPs, c.fp16_TFLOPs,
              c.tf32_TFLOPs, c.fp32_TFLOPs);
}

void print_run(const RunResult& run) {
  std::printf("\n== %s | %s | %s | %s ==\n", run.suite.c_str(), mode_name(run.mode), dtype_short_name(run.dtype),
              run.impl.c_str());
  std::printf("%4s %5s %6s %4s %10s %7s %8s %8s %9s %7s %6s  %s\n", "B", "H", "S", "D", "us", "host us", "TFLOP/s",
              "GB/s", "SOL us", "%SOL", "copies", "check (rel. error)");
  for (const CaseResult& c : run.cases) print_case(c);
  const Aggregate a = aggregate(run);
  if (!a.mean_us) {
    std::printf("suite: incomplete (a case has no time): no aggregate\n");
    return;
  }
  if (a.sol_pct)
    std::printf("suite: %%SOL %.1f%% (sum SOL %.1f us / sum measured %.1f us), mean %.1f us\n", *a.sol_pct,
                *a.sum_sol_us, *a.sum_us, *a.mean_us);
  else
    std::printf("suite: mean %.1f us\n", *a.mean_us);
  std::fflush(stdout);
}

Progress::Progress(int total) : total_(total), tty_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() { clear(); }

void Progress::clear() {
  if (tty_ && dirty_) std::fprintf(stderr, "\r\033[K");
  dirty_ = false;
}

void Progress::start_case(const RunResult& run, const Shape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "[%d/%d] %s %s %s %s B=%lld H=%lld S=%lld D=%lld", ++index_, total_,
                run.suite.c_str(), mode_name(run.mode), dtype_short_name(run.dtype), run.impl.c_str(),
                (long long)s.B, (long long)s.H, (long long)s.S, (long long)s.D);
  prefix_ = buf;
}

void Progress::stage(const char* what) {
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s: %s", prefix_.c_str(), what);
    dirty_ = true;
  } else {
    std::fprintf(stderr, "%s: %s\n", prefix_.c_str(), what);
  }
  std::fflush(stderr);
}

}  // namespace qkbench
