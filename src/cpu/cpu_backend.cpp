// The CPU backend: the math of docs/SPEC.md in fp64, on any strides, on every core.
//
// Work is split into tasks of kRowsPerTask rows of one head; a task reads its inputs, writes only its own
// output rows, and uses scratch that it initialises itself, so no result depends on which thread runs it or
// on how many threads there are: every run is bitwise identical.
//
// Forward: one task per block of query rows computes scores, row statistics, P and LSE.
// Backward, two passes:
//   1. per block of query rows: P (recomputed or read), D_i = Σ_j P_ij dP_ij, dS = P ∘ (dP − D),
//      dQ = scale · dS K; the row's log-sum-exp and D_i are kept (O(rows) memory). A given LSE (float32) is
//      used as it is, except for float64 data: there the row's log-sum-exp is computed in fp64 from the
//      scores at hand, since P = exp(S − LSE) would carry the float32 rounding of LSE (~1e-7).
//   2. per block of key rows: dK = scale · dSᵀ Q over every query head of the group, recomputing dS from
//      the kept statistics. dK rows are owned by one task, so no cross-thread reduction is needed.
// Memory is O(threads × kRowsPerTask × (Sk + D)) beyond the statistics: P is never held whole.
#include "cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <new>
#include <optional>
#include <thread>
#include <vector>

#include "dtype.h"

namespace qksoftmax::cpu {
namespace {

// Rows per task: each streamed row of the other operand is reused this many times from cache, and tasks
// stay small enough to balance a causal mask's uneven rows over the threads.
constexpr int64_t kRowsPerTask = 32;
// Independent partial sums in a dot product: they break the addition chain so that it pipelines and
// vectorises (measured: 8 lanes run the backward about 1.4x faster than 4).
constexpr int kDotLanes = 8;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double dot(const double* a, const double* b, int64_t n) {
  double partial[kDotLanes] = {};
  int64_t i = 0;
  for (; i + kDotLanes <= n; i += kDotLanes) {
    for (int lane = 0; lane < kDotLanes; ++lane) partial[lane] += a[i + lane] * b[i + lane];
  }
  for (int lane = 0; i < n; ++i, ++lane) partial[lane] += a[i] * b[i];
  double sum = 0;
  for (double p : partial) sum += p;
  return sum;
}

void axpy(double alpha, const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// log Σ_j exp(s_j) over s[0, n), stable; −inf when n is 0 (a fully masked row).
double log_sum_exp(const double* s, int64_t n) {
  if (n == 0) return kNegInf;
  const double max = *std::max_element(s, s + n);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - max);
  return max + std::log(sum);
}

// Rows [first, last) of head h of batch b: the unit of work.
struct Block {
  int64_t b, h, first, last;
  int64_t size() const { return last - first; }
};

Block block_of(int64_t task, int64_t heads, int64_t rows) {
  const int64_t per_head = ceil_div(rows, kRowsPerTask);
  const int64_t first = task % per_head * kRowsPerTask;
  return {task / (heads * per_head), task / per_head % heads, first, std::min(rows, first + kRowsPerTask)};
}

// One thread's buffers, allocated before any output is written.
struct Scratch {
  std::vector<double> own;     // kRowsPerTask × D: the task's rows of q (query tasks) or k (key tasks)
  std::vector<double> other;   // D: one streamed row of k (query tasks) or q (key tasks)
  std::vector<double> scores;  // kRowsPerTask × Sk: S, then P, then dS of the task's query rows
  std::vector<double> acc;     // kRowsPerTask × D: dQ or dK of the task's rows
};

// The threads a run may use: asked once per process (std::thread::hardware_concurrency reads
// /sys/devices/system/cpu/online on each call, a few µs of system calls per run).
unsigned cores() {
  static const unsigned count = std::max(1u, std::thread::hardware_concurrency());
  return count;
}

// Runs task(t, scratch) for every t in [0, count), on the calling thread and up to scratches.size() − 1
// more; each thread uses its own scratch.
template <class Task>
void parallel_for(int64_t count, std::vector<Scratch>& scratches, const Task& task) {
  std::atomic<int64_t> next{0};
  const auto work = [&](Scratch& scratch) {
    for (int64_t t = next++; t < count; t = next++) task(t, scratch);
  };
  std::vector<std::thread> helpers;
  try {
    helpers.reserve(scratches.size() - 1);
    for (size_t w = 1; w < scratches.size(); ++w) helpers.emplace_back(work, std::ref(scratches[w]));
  } catch (const std::exception&) {
    // Fewer threads cost only speed: the threads that did start take every task.
  }
  work(scratches[0]);
  for (std::thread& helper : helpers) helper.join();
}

class Runner {
 public:
  // Allocates everything the run needs; throws std::bad_alloc before anything is written.
  explicit Runner(const Problem& pb) : pb_(pb) {
    const bool backward = pb.pass == Pass::kBackward;
    const int64_t tasks = std::max(query_tasks(), backward ? key_tasks() : 0);
    const int64_t threads = std::min<int64_t>(tasks, cores());
    scratches_.resize(threads);
    for (Scratch& s : scratches_) {
      s.own.resize(kRowsPerTask * pb.D);
      s.other.resize(pb.D);
      s.scores.resize(kRowsPerTask * pb.Sk);
      if (backward) s.acc.resize(kRowsPerTask * pb.D);
    }
    if (backward) {
      row_lse_.resize(pb.B * pb.Hq * pb.Sq);
      row_delta_.resize(pb.B * pb.Hq * pb.Sq);
    }
  }

  // Cannot fail once constructed: a thread that does not start costs only speed (see parallel_for).
  void run() {
    const auto query_rows = [&](int64_t t) { return block_of(t, pb_.Hq, pb_.Sq); };
    if (pb_.pass == Pass::kForward) {
      parallel_for(query_tasks(), scratches_, [&](int64_t t, Scratch& s) { forward_rows(query_rows(t), s); });
      return;
    }
    parallel_for(query_tasks(), scratches_, [&](int64_t t, Scratch& s) { dq_rows(query_rows(t), s); });
    parallel_for(key_tasks(), scratches_, [&](int64_t t, Scratch& s) { dk_rows(block_of(t, pb_.Hk, pb_.Sk), s); });
  }

 private:
  int64_t query_tasks() const { return pb_.B * pb_.Hq * ceil_div(pb_.Sq, kRowsPerTask); }
  int64_t key_tasks() const { return pb_.B * pb_.Hk * ceil_div(pb_.Sk, kRowsPerTask); }
  bool saved_p() const { return pb_.mode == BackwardMode::kSavedP; }
  bool use_given_lse() const { return pb_.lse.present() && pb_.dtype != DType::kFloat64; }
  int64_t stat_index(int64_t b, int64_t h, int64_t i) const { return (b * pb_.Hq + h) * pb_.Sq + i; }

  double read(const Operand& op, int64_t b, int64_t h, int64_t r, int64_t c) const {
    return load_as_double(op.ptr, op.offset(b, h, r, c), pb_.dtype);
  }
  void write(const Operand& op, int64_t b, int64_t h, int64_t r, int64_t c, double v) const {
    store_from_double(op.ptr, op.offset(b, h, r, c), pb_.dtype, v);
  }
  double read_lse(int64_t b, int64_t h, int64_t i) const {
    return load_as_float(pb_.lse.ptr, pb_.lse.offset(b, h, i), DType::kFloat32);
  }
  void load_row(const Operand& op, int64_t b, int64_t h, int64_t r, double* out) const {
    for (int64_t d = 0; d < pb_.D; ++d) out[d] = read(op, b, h, r, d);
  }

  // Scores S_ij = scale · q_i · k_j of the block's unmasked positions into s.scores (row r at r × Sk).
  // Loads the block's q rows into s.own.
  void scores(const Block& blk, Scratch& s) const {
    const int64_t hk = blk.h / pb_.group();
    for (int64_t r = 0; r < blk.size(); ++r) load_row(pb_.q, blk.b, blk.h, blk.first + r, &s.own[r * pb_.D]);
    for (int64_t j = 0; j < pb_.col_end(blk.last - 1); ++j) {
      load_row(pb_.k, blk.b, hk, j, s.other.data());
      for (int64_t r = 0; r < blk.size(); ++r) {
        if (j < pb_.col_end(blk.first + r)) {
          s.scores[r * pb_.Sk + j] = pb_.scale_f64 * dot(&s.own[r * pb_.D], s.other.data(), pb_.D);
        }
      }
    }
  }

  void forward_rows(const Block& blk, Scratch& s) const {
    scores(blk, s);
    for (int64_t r = 0; r < blk.size(); ++r) {
      const int64_t i = blk.first + r, end = pb_.col_end(i);
      const double* row = &s.scores[r * pb_.Sk];
      const double lse = log_sum_exp(row, end);
      for (int64_t j = 0; j < pb_.Sk; ++j) {
        write(pb_.out_p, blk.b, blk.h, i, j, j < end ? std::exp(row[j] - lse) : 0.0);
      }
      if (pb_.out_lse.present()) {
        store_from_float(pb_.out_lse.ptr, pb_.out_lse.offset(blk.b, blk.h, i), DType::kFloat32, float(lse));
      }
    }
  }

  // Pass 1: turns the block's score rows into dS rows (keeping each row's statistics), then dQ = scale · dS K.
  void dq_rows(const Block& blk, Scratch& s) {
    if (!saved_p()) scores(blk, s);
    for (int64_t r = 0; r < blk.size(); ++r) {
      const int64_t i = blk.first + r, end = pb_.col_end(i), stat = stat_index(blk.b, blk.h, i);
      double* row = &s.scores[r * pb_.Sk];
      if (saved_p()) {
        for (int64_t j = 0; j < end; ++j) row[j] = read(pb_.p, blk.b, blk.h, i, j);
      } else {
        row_lse_[stat] = use_given_lse() ? read_lse(blk.b, blk.h, i) : log_sum_exp(row, end);
        for (int64_t j = 0; j < end; ++j) row[j] = std::exp(row[j] - row_lse_[stat]);
      }
      double delta = 0;
      for (int64_t j = 0; j < end; ++j) delta += row[j] * read(pb_.dp, blk.b, blk.h, i, j);
      row_delta_[stat] = delta;
      for (int64_t j = 0; j < end; ++j) row[j] *= read(pb_.dp, blk.b, blk.h, i, j) - delta;
    }
    const int64_t hk = blk.h / pb_.group();
    std::fill(s.acc.begin(), s.acc.end(), 0.0);
    for (int64_t j = 0; j < pb_.col_end(blk.last - 1); ++j) {
      load_row(pb_.k, blk.b, hk, j, s.other.data());
      for (int64_t r = 0; r < blk.size(); ++r) {
        if (j < pb_.col_end(blk.first + r)) {
          axpy(pb_.scale_f64 * s.scores[r * pb_.Sk + j], s.other.data(), &s.acc[r * pb_.D], pb_.D);
        }
      }
    }
    store_rows(pb_.dq, blk, s.acc);
  }

  // Pass 2: dK_j = scale · Σ_{h in group} Σ_i dS_ij q_i for the block's key rows j (blk.h is the key head).
  void dk_rows(const Block& blk, Scratch& s) const {
    if (!saved_p()) {
      for (int64_t r = 0; r < blk.size(); ++r) load_row(pb_.k, blk.b, blk.h, blk.first + r, &s.own[r * pb_.D]);
    }
    std::fill(s.acc.begin(), s.acc.end(), 0.0);
    // Query rows before the block's first key cannot see it under the causal mask.
    const int64_t first_row = pb_.mask == Mask::kCausal ? blk.first : 0;
    for (int64_t h = blk.h * pb_.group(); h < (blk.h + 1) * pb_.group(); ++h) {
      for (int64_t i = first_row; i < pb_.Sq; ++i) {
        const int64_t end = std::min(blk.last, pb_.col_end(i)), stat = stat_index(blk.b, h, i);
        load_row(pb_.q, blk.b, h, i, s.other.data());
        for (int64_t j = blk.first; j < end; ++j) {
          const int64_t r = j - blk.first;
          const double p = saved_p() ? read(pb_.p, blk.b, h, i, j)
                                     : std::exp(pb_.scale_f64 * dot(&s.own[r * pb_.D], s.other.data(), pb_.D) -
                                                row_lse_[stat]);
          const double ds = p * (read(pb_.dp, blk.b, h, i, j) - row_delta_[stat]);
          axpy(pb_.scale_f64 * ds, s.other.data(), &s.acc[r * pb_.D], pb_.D);
        }
      }
    }
    store_rows(pb_.dk, blk, s.acc);
  }

  void store_rows(const Operand& out, const Block& blk, const std::vector<double>& rows) const {
    for (int64_t r = 0; r < blk.size(); ++r) {
      for (int64_t d = 0; d < pb_.D; ++d) write(out, blk.b, blk.h, blk.first + r, d, rows[r * pb_.D + d]);
    }
  }

  const Problem& pb_;
  std::vector<Scratch> scratches_;
  std::vector<double> row_lse_, row_delta_;  // backward: per (b, h, i) of q, written by pass 1, read by pass 2
};

}  // namespace

Status run(const Problem& problem) {
  std::optional<Runner> runner;
  try {
    runner.emplace(problem);
  } catch (const std::bad_alloc&) {
    return {Code::kInternal, "the CPU backend could not allocate the host memory this problem needs"};
  }
  runner->run();
  return {};
}

}  // namespace qksoftmax::cpu
