// What the communication hook tests share: a module whose loss is sum_i <p_i, c_i>, so each
// parameter's local gradient is exactly the coefficient tensor the test chose for that rank and
// step, and whose shapes mix matrices PowerSGD compresses with a 1-d and a small one it does not.
#pragma once

#include <vector>

#include "dist/dist_testing.h"

namespace strata::comm_hook_testing {

// bytes per bucket: with float64 the buckets are [small, w3], [w2, b1], [w1] (reverse order)
constexpr double kBucketCapMb = 400.0 / (1 << 20);

struct Weights : nn::Module {
  Tensor w1, b1, w2, w3, small;
  bool use_small = true;
  explicit Weights(uint64_t seed) {
    Generator gen(seed);
    TensorOptions f64(kFloat64);
    w1 = register_parameter("w1", randn({8, 6}, f64, &gen));
    b1 = register_parameter("b1", randn({8}, f64, &gen));
    w2 = register_parameter("w2", randn({5, 8}, f64, &gen));
    w3 = register_parameter("w3", randn({3, 2, 4}, f64, &gen));     // a 3 x 8 matrix to PowerSGD
    small = register_parameter("small", randn({2, 2}, f64, &gen));  // too small to compress
  }
  // sum_i <p_i, c_i>: the gradient of p_i is c_i
  Tensor loss(const std::vector<Tensor>& coefs) {
    const std::vector<Tensor> ps = parameters();
    Tensor total = (ps[0] * coefs[0]).sum();
    for (size_t i = 1; i < ps.size(); ++i)
      if (use_small || !ps[i].is_same(small)) total = total + (ps[i] * coefs[i]).sum();
    return total;
  }
};

// Rank `rank`'s gradients at `step`, one per parameter. `bounded`: magnitudes in [0.1, 1.1] with
// random signs, so sums of their half-precision casts over 4 ranks are exact in float32.
inline std::vector<Tensor> coefficients(Weights& net, int rank, int step, bool bounded = false) {
  Generator gen(5000 + 97 * static_cast<uint64_t>(step) + static_cast<uint64_t>(rank));
  std::vector<Tensor> out;
  for (const Tensor& p : net.parameters()) {
    TensorOptions f64(kFloat64);
    if (!bounded) {
      out.push_back(randn(p.shape(), f64, &gen));
      continue;
    }
    Tensor sign = (rand(p.shape(), f64, &gen) > 0.5).to(kFloat64) * 2.0 - 1.0;
    out.push_back((rand(p.shape(), f64, &gen) + 0.1) * sign);
  }
  return out;
}

// One backward through `ddp` with rank `rank`'s coefficients of `step`.
inline void backward(dist::DistributedDataParallel& ddp, Weights& net, int rank, int step, bool bounded = false) {
  std::vector<Tensor> c = coefficients(net, rank, step, bounded);
  ddp.forward_with([&] { return net.loss(c); }).backward();
}

inline std::vector<Tensor> grads(Weights& net) {
  std::vector<Tensor> g;
  for (const Tensor& p : net.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  return g;
}

// Every rank's `local`, gathered: out[r] is rank r's.
inline std::vector<Tensor> gather_all(dist::ProcessGroup& pg, const Tensor& local) {
  std::vector<Tensor> out;
  for (int r = 0; r < pg.size(); ++r) out.push_back(empty_like(local));
  pg.allgather(out, local.contiguous())->wait();
  return out;
}

}  // namespace strata::comm_hook_testing
