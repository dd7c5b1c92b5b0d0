// The key-block pass's cases of qksoftmax-step (the second pass of the two-pass Hopper backward,
// src/cuda/sm90/kb_*): the problem's shape and bytes on the host (kb_step_shape, checked at compile time in
// kb_step.cu), the launches on the GPU.
//
// One CTA per SM, each looping the pass's 64 × 128 step over data that stays in L2: Hk key heads of Sk = 1024
// keys (8 key blocks each; Hk = SMs / 8, so the grid is one wave), 8 query heads per key head of Sq = 512 rows,
// non-causal: 8 · 512 / 64 = 64 steps per CTA. Every query head reads the same Q and dP (and P) rows: query
// head h's row r is row h + r of one block of Sq + Hq − 1 rows (a head stride of one row; a zero stride would
// alias them exactly, but dispatch.cu keeps zero strides away from TMA, and a positive multiple of 16 bytes
// meets every rule a TMA descriptor has). LSE and D are one Sq-row vector read by every head (plain loads, head
// stride 0). K, dK and the dQ target stay distinct per head: the reduce-adds of a query head's dQ come from its
// key head's 8 CTAs as in a real call, not from every CTA into one set of rows.
//
// On an H200 (132 SMs): 16 key heads, 128 query heads, 128 CTAs; distinct data 25.4 MiB in recompute with dQ in
// bf16 (K 4 + dK 4 + dQ 16 + dP 1.25 + Q 0.16), 26.7 saved-P (P 1.25 more); with the fp32 accumulator
// (dQ 32 MiB) 41.4 and 42.7: inside the 60 MiB L2, the fp32 cases less comfortably.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "micro.h"
#include "problem.h"
#include "result.h"

namespace qkbench {

inline constexpr int64_t kKbHeadDim = 128;
inline constexpr int64_t kKbBlockM = 64;       // rows per step (KbConfig::kBlockM)
inline constexpr int64_t kKbBlockN = 128;      // keys per CTA (KbConfig::kBlockN)
inline constexpr int64_t kKbKeys = 1024;       // Sk: the longest rows whose dQ partials go straight into dQ
inline constexpr int64_t kKbRows = 512;        // Sq
inline constexpr int64_t kKbGroup = 8;         // query heads per key head
inline constexpr int64_t kKbElementBytes = 2;  // bf16

struct KbStepShape {
  int64_t key_heads = 0;      // Hk
  int64_t query_heads = 0;    // Hq = Hk · group
  int64_t ctas = 0;           // one per key block of 128 keys
  int64_t steps_per_cta = 0;  // group · Sq / 64
  int64_t shared_rows = 0;    // rows of the Q, dP (and P) block that every query head reads: Sq + Hq − 1
  int64_t bytes = 0;          // distinct data that a launch touches
};

// The problem on a device of `sms` SMs, its dQ partials added as dq_element_bytes-byte values (2: into dQ; 4:
// into the fp32 accumulator).
constexpr KbStepShape kb_step_shape(int64_t sms, bool saved_p, int64_t dq_element_bytes) {
  KbStepShape s;
  const int64_t blocks_per_head = kKbKeys / kKbBlockN;
  s.key_heads = sms / blocks_per_head;
  s.query_heads = s.key_heads * kKbGroup;
  s.ctas = s.key_heads * blocks_per_head;
  s.steps_per_cta = kKbGroup * (kKbRows / kKbBlockM);
  s.shared_rows = kKbRows + s.query_heads - 1;
  const int64_t k_bytes = s.key_heads * kKbKeys * kKbHeadDim * kKbElementBytes;
  const int64_t dk_bytes = k_bytes;
  const int64_t dq_bytes = s.query_heads * kKbRows * kKbHeadDim * dq_element_bytes;
  const int64_t q_bytes = s.shared_rows * kKbHeadDim * kKbElementBytes;
  const int64_t dp_bytes = s.shared_rows * kKbKeys * kKbElementBytes;
  const int64_t p_bytes = saved_p ? dp_bytes : 0;
  const int64_t lse_bytes = kKbRows * int64_t(sizeof(float));
  const int64_t delta_bytes = lse_bytes;
  s.bytes = k_bytes + dk_bytes + dq_bytes + q_bytes + dp_bytes + p_bytes + lse_bytes + delta_bytes;
  return s;
}

// A contiguous (heads, rows, cols) operand, each head its own rows (both step benchmarks' inputs and outputs).
inline qksoftmax::Operand heads_operand(void* ptr, int64_t heads, int64_t rows, int64_t cols) {
  return {ptr, heads * rows * cols, rows * cols, cols, 1};
}

struct KbStepResult {
  std::string mode;  // recompute, saved_p
  std::string dq;    // bf16: partials straight into dQ (the default at Sk ≤ 1024); fp32: into the accumulator
  int products = 0;  // 64 × 128 × 128 products per step: Sᵀ, dK, dQ in recompute; dK, dQ in saved-P
  int64_t bytes = 0;
  double us = 0;            // one launch
  double step_us = 0;       // per 64 × 128 step and SM
  double tensor_share = 0;  // the step's products at the measured bf16 GEMM rate, over step_us
  int64_t rounds = 1;       // the single pass in clusters: heads a cluster runs one after another (step_us per CTA step)
};

// Runs and prints the four cases (mode × dQ target) and the pingpong single pass's step (rows of 128 keys, each
// consumer warpgroup every other row block; in clusters of 2, 4 and 8, rows of 256, 512, 1024 keys; then causal
// square rows in those clusters, heads in mirrored pairs, whose short tiles carry a head's start and end costs);
// with `trace`, each case's phase trace too (phase_trace.cuh; of the single pass, up to clusters of 2).
Result run_kb_steps(const MicroRun& micro, bool trace, KbStepShape* shape, std::vector<KbStepResult>* results);

// Writes `, "key_block_shape": {...}, "key_block": [...]` (write_json_list).
void write_kb_json(std::FILE* f, const KbStepShape& shape, const std::vector<KbStepResult>& results);

}  // namespace qkbench
