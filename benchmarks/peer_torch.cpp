// LibTorch running the benchmark workloads (through ATen, the same calls torch:: makes).
// Compiled as its own C++17 object library: LibTorch 1.13's headers predate C++20.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/version.h>

#include <string>

#include "workload.h"

namespace bench {

namespace {

class TorchPeer final : public Peer {
 public:
  std::string name() const override {
    return "LibTorch " + std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
  }
  void set_threads(int n) override { at::set_num_threads(n); }

  Runner prepare(const Workload& w) override {
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
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
      case Op::SumAll: case Op::SumDim0: case Op::SumDim1: {
        at::Tensor a = at::rand({w.m, w.n}, f32);
        if (w.op == Op::SumAll) return [a] { at::sum(a); };
        if (w.op == Op::SumDim0) return [a] { at::sum(a, {0}); };
        return [a] { at::sum(a, {1}); };
      }
    }
    return nullptr;
  }
};

}  // namespace

std::unique_ptr<Peer> make_torch_peer() { return std::make_unique<TorchPeer>(); }

}  // namespace bench
