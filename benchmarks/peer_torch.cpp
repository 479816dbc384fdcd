// LibTorch running the benchmark workloads (through ATen, the same calls torch:: makes, and
// torch::optim), the twin of ops_strata.cpp: keep the two in step.
// Compiled as its own C++17 object library: LibTorch 1.13's headers predate C++20.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "workload.h"

namespace bench {

namespace {

const auto f32 = at::TensorOptions().dtype(at::kFloat);

at::Tensor leaf(at::IntArrayRef shape) { return at::randn(shape, f32).requires_grad_(); }

// One forward + backward, as ops_strata.cpp's train_step: grads set to none, forward,
// backward of the fixed upstream gradient dy (which frees the graph).
Runner train_step(std::vector<at::Tensor> leaves, std::function<at::Tensor()> forward, at::IntArrayRef out_shape) {
  at::Tensor dy = at::randn(out_shape, f32);
  return [leaves = std::move(leaves), forward = std::move(forward), dy] {
    for (const at::Tensor& t : leaves) t.mutable_grad().reset();
    forward().backward(dy);
  };
}

// m tensors of n / m parameters each, with random gradients
std::vector<at::Tensor> params_with_grads(const Workload& w) {
  std::vector<at::Tensor> params;
  for (int64_t i = 0; i < w.m; ++i) {
    at::Tensor p = leaf({w.n / w.m});
    p.mutable_grad() = at::randn({w.n / w.m}, f32);
    params.push_back(p);
  }
  return params;
}

// LibTorch 1.13 has no fused scaled_dot_product_attention: the composed math a user writes,
// softmax(masked_fill(q k^T / sqrt(d), causal mask, -inf)) v
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t t = q.size(-2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor mask = at::ones({t, t}, at::TensorOptions().dtype(at::kBool)).triu(1);
  return at::matmul(at::softmax(scores.masked_fill(mask, -INFINITY), -1), v);
}

class TorchPeer final : public Peer {
 public:
  std::string name() const override {
    return "LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  }
  void set_threads(int n) override { at::set_num_threads(n); }

  Runner prepare(const Workload& w) override {
    switch (w.op) {
      case Op::Matmul: {
        at::Tensor a = at::rand({w.m, w.k}, f32), b = at::rand({w.k, w.n}, f32);
        return [a, b] { at::matmul(a, b); };
      }
      case Op::MatmulNT: {
        at::Tensor a = at::rand({w.m, w.k}, f32), b = at::rand({w.n, w.k}, f32);
        return [a, b] { at::matmul(a, b.t()); };
      }
      case Op::BatchedNT: {
        at::Tensor a = at::rand({w.b, w.m, w.k}, f32), b = at::rand({w.b, w.n, w.k}, f32);
        return [a, b] { at::matmul(a, b.transpose(1, 2)); };
      }
      case Op::Add: case Op::Mul: case Op::AddInPlace: {
        at::Tensor a = at::rand({w.n}, f32), b = at::rand({w.n}, f32);
        if (w.op == Op::Add) return [a, b] { at::add(a, b); };
        if (w.op == Op::Mul) return [a, b] { at::mul(a, b); };
        return [a, b]() mutable { a.add_(b); };
      }
      case Op::Exp: {
        at::Tensor a = at::rand({w.n}, f32);
        return [a] { at::exp(a); };
      }
      case Op::Gelu: {
        at::Tensor a = at::rand({w.n}, f32);
        return [a] { at::gelu(a); };
      }
      case Op::GeluTanh: {
        at::Tensor a = at::rand({w.n}, f32);
        return [a] { at::gelu(a, "tanh"); };
      }
      case Op::Log: {
        at::Tensor a = at::rand({w.n}, f32);
        return [a] { at::log(a); };
      }
      case Op::Sin: {
        at::Tensor a = at::rand({w.n}, f32) * 200.0 - 100.0;
        return [a] { at::sin(a); };
      }
      case Op::Randn:
        return [n = w.n] { at::randn({n}, f32); };
      case Op::Randint:
        return [n = w.n, k = w.k] { at::randint(0, k, {n}, at::kLong); };
      case Op::Dropout: {
        at::Tensor a = at::rand({w.n}, f32);
        return [a] { at::dropout(a, 0.1, true); };
      }
      case Op::Transpose: {
        at::Tensor a = at::rand({w.m, w.n}, f32);
        return [a] { a.t().contiguous(); };
      }
      case Op::IndexAdd: {
        at::Tensor table = at::zeros({w.k, w.n}, f32), src = at::rand({w.m, w.n}, f32);
        at::Tensor index = at::randint(0, w.k, {w.m}, at::kLong);
        return [table, src, index]() mutable { table.index_add_(0, index, src); };
      }
      case Op::Gather: {
        at::Tensor a = at::rand({w.m, w.k}, f32), index = at::randint(0, w.k, {w.m, w.n}, at::kLong);
        return [a, index] { at::gather(a, 1, index); };
      }
      case Op::Sort: {
        at::Tensor a = at::rand({w.n}, f32);
        return [a] { at::sort(a, /*stable=*/true, -1, false); };  // strata's sort is always stable
      }
      case Op::Topk: {
        at::Tensor a = at::rand({w.m, w.n}, f32);
        return [a, k = w.k] { at::topk(a, k, 1); };
      }
      case Op::MaxDim1: {
        at::Tensor a = at::rand({w.m, w.n}, f32);
        return [a] { at::max(a, 1); };
      }
      case Op::AmaxDim1: {
        at::Tensor a = at::rand({w.m, w.n}, f32);
        return [a] { at::amax(a, {1}); };
      }
      case Op::ToHalf: {
        at::Tensor a = at::randn({w.n}, f32);
        return [a] { a.to(at::kHalf); };
      }
      case Op::FromHalf: {
        at::Tensor a = at::randn({w.n}, f32).to(at::kHalf);
        return [a] { a.to(at::kFloat); };
      }
      case Op::Arange:
        return [n = w.n] { at::arange(n, at::kLong); };
      case Op::CatDim1: {
        at::Tensor a = at::rand({w.m, w.n}, f32), b = at::rand({w.m, w.n}, f32);
        return [a, b] { at::cat({a, b}, 1); };
      }
      case Op::SumAll: case Op::SumDim0: case Op::SumDim1: {
        at::Tensor a = at::rand({w.m, w.n}, f32);
        if (w.op == Op::SumAll) return [a] { at::sum(a); };
        if (w.op == Op::SumDim0) return [a] { at::sum(a, {0}); };
        return [a] { at::sum(a, {1}); };
      }
      case Op::LinearTrain: {
        at::Tensor x = leaf({w.m, w.k}), weight = leaf({w.n, w.k}), bias = leaf({w.n});
        return train_step({x, weight, bias}, [=] { return at::linear(x, weight, bias); }, {w.m, w.n});
      }
      case Op::Conv2dTrain: {
        const ConvShape& c = w.conv;
        at::Tensor x = leaf({w.b, c.c_in, c.h, c.w}), weight = leaf({c.c_out, c.c_in, c.kernel, c.kernel});
        return train_step({x, weight}, [=] { return at::conv2d(x, weight, {}, c.stride, c.pad); },
                          {w.b, c.c_out, c.out_h(), c.out_w()});
      }
      case Op::Conv3dTrain:
      case Op::Conv3dComposedTrain: {
        const ConvShape& c = w.conv;
        at::Tensor x = leaf({w.b, c.c_in, c.d, c.h, c.w});
        at::Tensor weight = leaf({c.c_out, c.c_in, c.kernel, c.kernel, c.kernel});
        return train_step({x, weight}, [=] { return at::conv3d(x, weight, {}, c.stride, c.pad); },
                          {w.b, c.c_out, c.out_d(), c.out_h(), c.out_w()});
      }
      case Op::MaxPool3dTrain:
      case Op::AvgPool3dTrain: {
        const ConvShape& c = w.conv;
        at::Tensor x = leaf({w.b, c.c_in, c.d, c.h, c.w});
        const bool is_max = w.op == Op::MaxPool3dTrain;
        return train_step({x},
                          [=] {
                            return is_max ? at::max_pool3d(x, c.kernel, c.stride, c.pad)
                                          : at::avg_pool3d(x, c.kernel, c.stride, c.pad);
                          },
                          {w.b, c.c_in, c.out_d(), c.out_h(), c.out_w()});
      }
      case Op::LayerNormTrain: {
        at::Tensor x = leaf({w.m, w.n}), weight = leaf({w.n}), bias = leaf({w.n});
        return train_step({x, weight, bias}, [=] { return at::layer_norm(x, {w.n}, weight, bias); }, {w.m, w.n});
      }
      case Op::SoftmaxTrain: {
        at::Tensor x = leaf({w.m, w.n});
        return train_step({x}, [=] { return at::softmax(x, 1); }, {w.m, w.n});
      }
      case Op::AttentionTrain:
      case Op::AttentionComposedTrain: {
        const std::vector<int64_t> shape{w.b, w.m, w.n, w.k};
        at::Tensor q = leaf(shape), k = leaf(shape), v = leaf(shape);
        return train_step({q, k, v}, [=] { return causal_attention(q, k, v); }, shape);
      }
      case Op::AdamW: {
        auto opt = std::make_shared<torch::optim::AdamW>(params_with_grads(w),
                                                         torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
        return [opt] { opt->step(); };
      }
      case Op::SGDMomentum: {
        auto opt = std::make_shared<torch::optim::SGD>(params_with_grads(w), torch::optim::SGDOptions(1e-3).momentum(0.9));
        return [opt] { opt->step(); };
      }
    }
    return nullptr;
  }
};

}  // namespace

std::unique_ptr<Peer> make_torch_peer() { return std::make_unique<TorchPeer>(); }

}  // namespace bench
