// What is measured: shapes, suites, modes, and the speed-of-light (SOL) model of docs/SPEC.md, section 6.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qksoftmax/qksoftmax.h"

namespace qkbench {

using qksoftmax::DType;
using qksoftmax::Mask;

enum class Mode : uint8_t { kForward, kRecompute, kRecomputeLse, kSavedP };

inline constexpr Mode kAllModes[] = {Mode::kForward, Mode::kRecompute, Mode::kRecomputeLse, Mode::kSavedP};
inline constexpr DType kAllDTypes[] = {DType::kBFloat16, DType::kFloat16, DType::kFloat32};

const char* mode_name(Mode mode);              // "forward", "recompute", "recompute_lse", "saved_p"
std::optional<Mode> parse_mode(std::string_view name);
const char* dtype_short_name(DType dtype);     // "bf16", "fp16", "fp32"
std::optional<DType> parse_dtype(std::string_view name);

// Which outputs a mode produces and which saved forward results it reads.
inline bool is_backward(Mode mode) { return mode != Mode::kForward; }
inline bool reads_saved_p(Mode mode) { return mode == Mode::kSavedP; }
inline bool reads_lse(Mode mode) { return mode == Mode::kRecomputeLse; }

// One problem: batch B, H heads (query and key alike), Sq = Sk = S, head dimension D.
struct Shape {
  int64_t B = 0, H = 0, S = 0, D = 0;

  int64_t heads() const { return B * H; }
  int64_t qk_elements() const { return B * H * S * D; }  // q, k, dq, dk
  int64_t p_elements() const { return B * H * S * S; }   // p, dp (dense)
  int64_t lse_elements() const { return B * H * S; }
};

struct Suite {
  std::string name;
  std::vector<Shape> shapes;
};

// "seed16", "long", or "all" (both); empty when the name is unknown.
std::vector<Suite> suites_named(std::string_view name);

// Ceilings measured on the GPU in the same run (docs/SPEC.md, section 6).
struct Ceilings {
  double copy_GBps = 0;    // bytes read + written per second of a device-to-device copy, in 1e9
  double write_GBps = 0;   // bytes written per second of a device memset (reported: the forward mostly writes)
  double l2_read_GBps = 0;    // reads of an L2-resident buffer (reported: what the two-pass kernels re-read)
  double l2_reduce_GBps = 0;  // per-thread fp32 vector reduce-adds into an L2-resident buffer, bytes added (reported;
                              // the key-block pass adds dQ by TMA bulk reduce instead)
  double bf16_TFLOPs = 0;  // cuBLAS 8192³ GEMM rates, in 1e12 flop/s
  double fp16_TFLOPs = 0;
  double tf32_TFLOPs = 0;  // fp32 data, TF32 tensor cores allowed: the rate SOL uses for fp32
  double fp32_TFLOPs = 0;  // plain fp32 (reported only)
};

// The minimum traffic and arithmetic of one call.
struct Cost {
  double bytes = 0;
  double flops = 0;
};

// Unmasked (i, j) pairs over all heads: causal S(S+1)/2 per head, no mask S².
double live_elements(const Shape& shape, Mask mask);

// recompute: live dP + Q + K read, dQ + dK written, 6·D·live flops; recompute_lse adds LSE (4 bytes a row);
// saved_p adds live P, 4·D·live flops; forward: Q + K read, all of P (dense) + LSE written, 2·D·live flops.
Cost sol_cost(const Shape& shape, Mode mode, DType dtype, Mask mask);

// The GEMM rate SOL uses for a dtype (fp32: the TF32 rate), in flop/s.
double gemm_flops_per_s(DType dtype, const Ceilings& ceilings);

// max(bytes / copy bandwidth, flops / GEMM rate), in µs.
double sol_us(const Cost& cost, DType dtype, const Ceilings& ceilings);

}  // namespace qkbench
