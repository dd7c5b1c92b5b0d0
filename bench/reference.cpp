#include "reference.h"

#include <algorithm>
#include <cmath>

namespace qkbench {
namespace {

// P of one head (S × S, dense) and its LSE.
void head_probabilities(const CaseSpec& spec, const double* q, const double* k, double* p, double* lse) {
  const int64_t S = spec.shape.S, D = spec.shape.D;
  const double scale = 1 / std::sqrt(double(D));
  for (int64_t i = 0; i < S; ++i) {
    const int64_t end = spec.mask == Mask::kCausal ? i + 1 : S;
    double* row = p + i * S;
    std::fill(row, row + S, 0.0);
    double m = -INFINITY;
    for (int64_t j = 0; j < end; ++j) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += q[i * D + d] * k[j * D + d];
      row[j] = scale * s;
      m = std::max(m, row[j]);
    }
    double l = 0;
    for (int64_t j = 0; j < end; ++j) l += std::exp(row[j] - m);
    for (int64_t j = 0; j < end; ++j) row[j] = std::exp(row[j] - m) / l;
    lse[i] = m + std::log(l);
  }
}

// dQ and dK of one head from P and dP.
void head_gradients(const CaseSpec& spec, const double* q, const double* k, const double* p, const double* dp,
                    double* dq, double* dk) {
  const int64_t S = spec.shape.S, D = spec.shape.D;
  const double scale = 1 / std::sqrt(double(D));
  std::fill(dq, dq + S * D, 0.0);
  std::fill(dk, dk + S * D, 0.0);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t end = spec.mask == Mask::kCausal ? i + 1 : S;
    double di = 0;
    for (int64_t j = 0; j < end; ++j) di += p[i * S + j] * dp[i * S + j];
    for (int64_t j = 0; j < end; ++j) {
      const double ds = scale * p[i * S + j] * (dp[i * S + j] - di);
      for (int64_t d = 0; d < D; ++d) {
        dq[i * D + d] += ds * k[j * D + d];
        dk[j * D + d] += ds * q[i * D + d];
      }
    }
  }
}

}  // namespace

void reference(const CaseSpec& spec, const HostTensors& in, HostTensors* out) {
  const Shape& s = spec.shape;
  for (Role r : output_roles(spec.mode)) (*out)[size_t(r)].assign(size_t(role_elements(r, s)), 0.0);
  // Head h of a role's tensor.
  auto at = [&](auto& tensors, Role r, int64_t h) { return tensors[size_t(r)].data() + h * role_elements_per_head(r, s); };
  std::vector<double> p(size_t(s.S * s.S)), lse(size_t(s.S));
  for (int64_t h = 0; h < s.heads(); ++h) {
    const double* q = at(in, Role::kQ, h);
    const double* k = at(in, Role::kK, h);
    if (!is_backward(spec.mode)) {
      head_probabilities(spec, q, k, at(*out, Role::kP, h), at(*out, Role::kLse, h));
      continue;
    }
    const double* probabilities = p.data();
    if (reads_saved_p(spec.mode))
      probabilities = at(in, Role::kP, h);
    else
      head_probabilities(spec, q, k, p.data(), lse.data());
    head_gradients(spec, q, k, probabilities, at(in, Role::kDp, h), at(*out, Role::kDq, h), at(*out, Role::kDk, h));
  }
}

}  // namespace qkbench
