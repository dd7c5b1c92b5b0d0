// P = softmax(mask(scale · Q Kᵀ)) and the gradients of Q and K on the CPU backend, through the C++ API.
#include <qksoftmax/qksoftmax.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int64_t kBatch = 1, kHeads = 2, kSeq = 4, kHeadDim = 8;

// A contiguous float32 host tensor of the given shape.
qksoftmax::TensorDesc describe(std::vector<float>& data, std::vector<int64_t> shape) {
  qksoftmax::TensorDesc t;
  t.data = data.data();
  t.dtype = qksoftmax::DType::kFloat32;
  t.device = qksoftmax::Device::kCPU;
  t.rank = int(shape.size());
  int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.shape[d] = shape[size_t(d)];
    t.stride[d] = stride;
    stride *= shape[size_t(d)];
  }
  return t;
}

}  // namespace

int main() {
  const std::vector<int64_t> qk_shape{kBatch, kHeads, kSeq, kHeadDim}, p_shape{kBatch, kHeads, kSeq, kSeq};
  std::vector<float> q(kBatch * kHeads * kSeq * kHeadDim), k(q.size()), dq(q.size()), dk(q.size());
  std::vector<float> p(kBatch * kHeads * kSeq * kSeq), dp(p.size()), lse(kBatch * kHeads * kSeq);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = std::sin(float(i));
    k[i] = std::cos(float(i));
  }
  for (size_t i = 0; i < dp.size(); ++i) dp[i] = std::sin(0.5f * float(i));

  const qksoftmax::Options options;  // scale 1/sqrt(D), causal, recompute mode
  const qksoftmax::ForwardArgs fwd{describe(q, qk_shape), describe(k, qk_shape), describe(p, p_shape),
                                   describe(lse, {kBatch, kHeads, kSeq})};
  // The CPU backend needs no workspace and no stream; a GPU call would pass the size query's bytes and one.
  if (qksoftmax::Status s = qksoftmax::forward(fwd, options, nullptr, 0, nullptr); !s.ok()) {
    std::fprintf(stderr, "forward: %s\n", s.message().c_str());
    return 1;
  }
  qksoftmax::BackwardArgs bwd;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.dp = describe(dp, p_shape);
  bwd.lse = fwd.lse;
  bwd.dq = describe(dq, qk_shape);
  bwd.dk = describe(dk, qk_shape);
  if (qksoftmax::Status s = qksoftmax::backward(bwd, options, nullptr, 0, nullptr); !s.ok()) {
    std::fprintf(stderr, "backward: %s\n", s.message().c_str());
    return 1;
  }
  std::printf("qksoftmax %s: P[0, 0, %lld, :] =", qksoftmax::version(), (long long)(kSeq - 1));
  for (int64_t j = 0; j < kSeq; ++j) std::printf(" %.4f", p[size_t((kSeq - 1) * kSeq + j)]);
  std::printf(", dQ[0, 0, %lld, 0] = %.4f\n", (long long)(kSeq - 1), dq[size_t((kSeq - 1) * kHeadDim)]);
  return 0;
}
