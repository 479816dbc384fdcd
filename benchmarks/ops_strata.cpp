// strata running the op benchmark workloads (workload.h): single ops, layers forward +
// backward, and optimizer steps. peer_torch.cpp runs the same workloads in LibTorch; keep the
// two in step (same shapes, same calls per iteration).
#include <strata/strata.hpp>

#include "workload.h"

namespace bench {

namespace {

namespace st = strata;
namespace F = strata::nn::functional;

st::Tensor leaf(const st::Shape& shape) { return st::randn(shape).requires_grad_(); }

// One forward + backward: clears the leaves' grads (set to none, as zero_grad does by
// default), runs forward, and backpropagates the fixed upstream gradient dy, which frees the
// graph. Backward writes fresh grads into every leaf.
Runner train_step(std::vector<st::Tensor> leaves, std::function<st::Tensor()> forward, const st::Shape& out_shape) {
  st::Tensor dy = st::randn(out_shape);
  return [leaves = std::move(leaves), forward = std::move(forward), dy] {
    for (const st::Tensor& t : leaves) t.set_grad(st::Tensor());
    forward().backward(dy);
  };
}

// m tensors of n / m parameters each, with random gradients
std::vector<st::Tensor> params_with_grads(const Workload& w) {
  std::vector<st::Tensor> params;
  for (int64_t i = 0; i < w.m; ++i) {
    st::Tensor p = leaf({w.n / w.m});
    p.set_grad(st::randn({w.n / w.m}));
    params.push_back(p);
  }
  return params;
}

}  // namespace

Runner strata_runner(const Workload& w) {
  switch (w.op) {
    case Op::Matmul: {
      st::Tensor a = st::rand({w.m, w.k}), b = st::rand({w.k, w.n});
      return [a, b] { st::matmul(a, b); };
    }
    case Op::MatmulNT: {
      st::Tensor a = st::rand({w.m, w.k}), b = st::rand({w.n, w.k});
      return [a, b] { st::matmul(a, b.t()); };
    }
    case Op::BatchedNT: {
      st::Tensor a = st::rand({w.b, w.m, w.k}), b = st::rand({w.b, w.n, w.k});
      return [a, b] { st::matmul(a, b.transpose(1, 2)); };
    }
    case Op::Add: case Op::Mul: case Op::AddInPlace: {
      st::Tensor a = st::rand({w.n}), b = st::rand({w.n});
      if (w.op == Op::Add) return [a, b] { st::add(a, b); };
      if (w.op == Op::Mul) return [a, b] { st::mul(a, b); };
      return [a, b]() mutable { a.add_(b); };
    }
    case Op::Exp: {
      st::Tensor a = st::rand({w.n});
      return [a] { st::exp(a); };
    }
    case Op::Gelu: {
      st::Tensor a = st::rand({w.n});
      return [a] { st::gelu(a); };
    }
    case Op::GeluTanh: {
      st::Tensor a = st::rand({w.n});
      return [a] { st::gelu(a, "tanh"); };
    }
    case Op::Log: {
      st::Tensor a = st::rand({w.n});
      return [a] { st::log(a); };
    }
    case Op::Sin: {
      st::Tensor a = st::rand({w.n}) * 200.0 - 100.0;
      return [a] { st::sin(a); };
    }
    case Op::Randn:
      return [n = w.n] { st::randn({n}); };
    case Op::Randint:
      return [n = w.n, k = w.k] { st::randint(0, k, {n}); };
    case Op::Dropout: {
      st::Tensor a = st::rand({w.n});
      return [a] { st::nn::functional::dropout(a, 0.1, true); };
    }
    case Op::Transpose: {
      st::Tensor a = st::rand({w.m, w.n});
      return [a] { a.t().contiguous(); };
    }
    case Op::IndexAdd: {
      st::Tensor table = st::zeros({w.k, w.n}), src = st::rand({w.m, w.n}), index = st::randint(0, w.k, {w.m});
      return [table, src, index]() mutable { st::index_add_(table, 0, index, src); };
    }
    case Op::Gather: {
      st::Tensor a = st::rand({w.m, w.k}), index = st::randint(0, w.k, {w.m, w.n});
      return [a, index] { st::gather(a, 1, index); };
    }
    case Op::Sort: {
      st::Tensor a = st::rand({w.n});
      return [a] { st::sort(a); };
    }
    case Op::Topk: {
      st::Tensor a = st::rand({w.m, w.n});
      return [a, k = w.k] { st::topk(a, k, 1); };
    }
    case Op::MaxDim1: {
      st::Tensor a = st::rand({w.m, w.n});
      return [a] { st::max(a, 1); };
    }
    case Op::AmaxDim1: {
      st::Tensor a = st::rand({w.m, w.n});
      return [a] { st::amax(a, {1}); };
    }
    case Op::ToHalf: {
      st::Tensor a = st::randn({w.n});
      return [a] { a.to(st::kFloat16); };
    }
    case Op::FromHalf: {
      st::Tensor a = st::randn({w.n}).to(st::kFloat16);
      return [a] { a.to(st::kFloat32); };
    }
    case Op::Arange:
      return [n = w.n] { st::arange(n); };
    case Op::CatDim1: {
      st::Tensor a = st::rand({w.m, w.n}), b = st::rand({w.m, w.n});
      return [a, b] { st::cat({a, b}, 1); };
    }
    case Op::SumAll: case Op::SumDim0: case Op::SumDim1: {
      st::Tensor a = st::rand({w.m, w.n});
      if (w.op == Op::SumAll) return [a] { st::sum(a); };
      if (w.op == Op::SumDim0) return [a] { st::sum(a, {0}); };
      return [a] { st::sum(a, {1}); };
    }
    case Op::LinearTrain: {
      st::Tensor x = leaf({w.m, w.k}), weight = leaf({w.n, w.k}), bias = leaf({w.n});
      return train_step({x, weight, bias}, [=] { return F::linear(x, weight, bias); }, {w.m, w.n});
    }
    case Op::Conv2dTrain: {
      const ConvShape& c = w.conv;
      st::Tensor x = leaf({w.b, c.c_in, c.h, c.w}), weight = leaf({c.c_out, c.c_in, c.kernel, c.kernel});
      F::Conv2dArgs args{.stride = c.stride, .padding = c.pad};
      return train_step({x, weight}, [=] { return F::conv2d(x, weight, st::Tensor(), args); },
                        {w.b, c.c_out, c.out_h(), c.out_w()});
    }
    case Op::Conv3dTrain:
    case Op::Conv3dComposedTrain: {
      const ConvShape& c = w.conv;
      st::Tensor x = leaf({w.b, c.c_in, c.d, c.h, c.w});
      st::Tensor weight = leaf({c.c_out, c.c_in, c.kernel, c.kernel, c.kernel});
      F::Conv3dArgs args{.stride = c.stride, .padding = c.pad};
      const bool native = w.op == Op::Conv3dTrain;
      return train_step({x, weight},
                        [=] {
                          // the switch is read by the forward alone; the backward follows what it recorded
                          struct Restore {
                            ~Restore() { F::set_native_conv3d(st::DeviceType::CPU, true); }
                          } restore;
                          F::set_native_conv3d(st::DeviceType::CPU, native);
                          return F::conv3d(x, weight, st::Tensor(), args);
                        },
                        {w.b, c.c_out, c.out_d(), c.out_h(), c.out_w()});
    }
    case Op::MaxPool3dTrain:
    case Op::AvgPool3dTrain: {
      const ConvShape& c = w.conv;
      st::Tensor x = leaf({w.b, c.c_in, c.d, c.h, c.w});
      const bool is_max = w.op == Op::MaxPool3dTrain;
      const st::nn::Size3 stride(c.stride), pad(c.pad);
      return train_step({x},
                        [=] {
                          return is_max ? F::max_pool3d(x, c.kernel, {.stride = stride, .padding = pad})
                                        : F::avg_pool3d(x, c.kernel, {.stride = stride, .padding = pad});
                        },
                        {w.b, c.c_in, c.out_d(), c.out_h(), c.out_w()});
    }
    case Op::LayerNormTrain: {
      st::Tensor x = leaf({w.m, w.n}), weight = leaf({w.n}), bias = leaf({w.n});
      return train_step({x, weight, bias}, [=] { return F::layer_norm(x, {w.n}, weight, bias); }, {w.m, w.n});
    }
    case Op::SoftmaxTrain: {
      st::Tensor x = leaf({w.m, w.n});
      return train_step({x}, [=] { return st::softmax(x, 1); }, {w.m, w.n});
    }
    case Op::AttentionTrain:
    case Op::AttentionComposedTrain: {
      const st::Shape shape{w.b, w.m, w.n, w.k};
      st::Tensor q = leaf(shape), k = leaf(shape), v = leaf(shape);
      const bool fused = w.op == Op::AttentionTrain;
      return train_step({q, k, v},
                        [=] {
                          // the switch is read by the forward alone; the backward follows what it recorded
                          const F::FusedAttentionGuard path(st::DeviceType::CPU, fused);
                          return F::scaled_dot_product_attention(q, k, v, st::Tensor(), 0, /*is_causal=*/true);
                        },
                        shape);
    }
    case Op::AdamW: {
      auto opt = std::make_shared<st::optim::AdamW>(params_with_grads(w),
                                                    st::optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.01});
      return [opt] { opt->step(); };
    }
    case Op::SGDMomentum: {
      auto opt = std::make_shared<st::optim::SGD>(params_with_grads(w),
                                                  st::optim::SGDOptions{.lr = 1e-3, .momentum = 0.9});
      return [opt] { opt->step(); };
    }
  }
  return nullptr;
}

}  // namespace bench
