// The fp64 reference of the math (docs/SPEC.md, "The math"), written apart from the library on purpose:
// contiguous std::vector<double> tensors, full matrices, plain loops, one thread. Slow and obvious. The C++
// tests and the bench's CPU path check against it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace qksoftmax::reference {

struct Dims {
  int64_t B, Hq, Hk, Sq, Sk, D;
  bool causal;
  double scale;
};

struct Forward {
  std::vector<double> p;    // (B, Hq, Sq, Sk)
  std::vector<double> lse;  // (B, Hq, Sq)
};

struct Gradients {
  std::vector<double> dq;  // (B, Hq, Sq, D)
  std::vector<double> dk;  // (B, Hk, Sk, D)
};

inline bool visible(const Dims& d, int64_t i, int64_t j) { return !d.causal || j <= i; }

// Row-major indices into the contiguous tensors.
inline int64_t q_at(const Dims& d, int64_t b, int64_t h, int64_t i, int64_t x) {
  return ((b * d.Hq + h) * d.Sq + i) * d.D + x;
}
inline int64_t k_at(const Dims& d, int64_t b, int64_t hk, int64_t j, int64_t x) {
  return ((b * d.Hk + hk) * d.Sk + j) * d.D + x;
}
inline int64_t p_at(const Dims& d, int64_t b, int64_t h, int64_t i, int64_t j) {
  return ((b * d.Hq + h) * d.Sq + i) * d.Sk + j;
}

// S = scale · Q Kᵀ of query head h (Sq × Sk, row-major).
inline std::vector<double> scores(const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                                  int64_t b, int64_t h) {
  const int64_t hk = h / (d.Hq / d.Hk);
  std::vector<double> s(d.Sq * d.Sk);
  for (int64_t i = 0; i < d.Sq; ++i) {
    for (int64_t j = 0; j < d.Sk; ++j) {
      double sum = 0;
      for (int64_t x = 0; x < d.D; ++x) sum += q[q_at(d, b, h, i, x)] * k[k_at(d, b, hk, j, x)];
      s[i * d.Sk + j] = d.scale * sum;
    }
  }
  return s;
}

inline Forward forward(const Dims& d, const std::vector<double>& q, const std::vector<double>& k) {
  Forward out{std::vector<double>(d.B * d.Hq * d.Sq * d.Sk), std::vector<double>(d.B * d.Hq * d.Sq)};
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      const std::vector<double> s = scores(d, q, k, b, h);
      for (int64_t i = 0; i < d.Sq; ++i) {
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < d.Sk; ++j) {
          if (visible(d, i, j)) max = std::fmax(max, s[i * d.Sk + j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < d.Sk; ++j) {
          if (visible(d, i, j)) sum += std::exp(s[i * d.Sk + j] - max);
        }
        for (int64_t j = 0; j < d.Sk; ++j) {
          out.p[p_at(d, b, h, i, j)] = visible(d, i, j) ? std::exp(s[i * d.Sk + j] - max) / sum : 0.0;
        }
        out.lse[(b * d.Hq + h) * d.Sq + i] = sum > 0 ? max + std::log(sum) : -std::numeric_limits<double>::infinity();
      }
    }
  }
  return out;
}

// P is taken from saved_p when given (saved-P mode), else recomputed: exp(S − lse) when lse is given, else
// the softmax. Masked positions of saved_p and dp are never read.
inline Gradients backward(const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& dp, const std::vector<double>* saved_p,
                          const std::vector<double>* lse) {
  const std::vector<double> softmax = saved_p || lse ? std::vector<double>{} : forward(d, q, k).p;
  Gradients out{std::vector<double>(q.size()), std::vector<double>(k.size())};
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / (d.Hq / d.Hk);
      const std::vector<double> s = scores(d, q, k, b, h);
      std::vector<double> p(d.Sq * d.Sk), ds(d.Sq * d.Sk);
      for (int64_t i = 0; i < d.Sq; ++i) {
        for (int64_t j = 0; j < d.Sk; ++j) {
          if (!visible(d, i, j)) continue;
          const int64_t at = p_at(d, b, h, i, j);
          p[i * d.Sk + j] = saved_p ? (*saved_p)[at]
                            : lse   ? std::exp(s[i * d.Sk + j] - (*lse)[(b * d.Hq + h) * d.Sq + i])
                                    : softmax[at];
        }
        double row_dot = 0;  // D_i = Σ_j P_ij dP_ij
        for (int64_t j = 0; j < d.Sk; ++j) {
          if (visible(d, i, j)) row_dot += p[i * d.Sk + j] * dp[p_at(d, b, h, i, j)];
        }
        for (int64_t j = 0; j < d.Sk; ++j) {
          if (visible(d, i, j)) ds[i * d.Sk + j] = p[i * d.Sk + j] * (dp[p_at(d, b, h, i, j)] - row_dot);
        }
      }
      for (int64_t i = 0; i < d.Sq; ++i) {
        for (int64_t j = 0; j < d.Sk; ++j) {
          for (int64_t x = 0; x < d.D; ++x) {
            out.dq[q_at(d, b, h, i, x)] += d.scale * ds[i * d.Sk + j] * k[k_at(d, b, hk, j, x)];
            out.dk[k_at(d, b, hk, j, x)] += d.scale * ds[i * d.Sk + j] * q[q_at(d, b, h, i, x)];
          }
        }
      }
    }
  }
  return out;
}

}  // namespace qksoftmax::reference
