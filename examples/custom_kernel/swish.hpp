// scaled_swish, an op defined outside strata: y = x * sigmoid(beta * x), fused into one
// kernel per device. swish.cpp declares it in strata's op table at run time, registers its
// kernels (swish_cpu.cpp, swish_cuda.cu) and gives it a backward through a custom
// autograd::Function; ScaledSwish wraps it as a layer.
#pragma once

#include <string>

#include <strata/strata.hpp>

namespace swish {

/// The op's parameter struct, handed to every kernel through KernelCall::params.
struct Params {
  double beta;
};

/// Declares "scaled_swish" and registers its kernels: CPU for float32 and float64, and CUDA
/// for both when this program was built with a CUDA compiler. Runs once; later calls return
/// the same id.
strata::OpId register_scaled_swish();

/// True when the CUDA kernels are compiled in and registered.
bool has_cuda_kernel();

/// y = x * sigmoid(beta * x) for a float32 or float64 tensor on any device with a kernel;
/// differentiable in x.
strata::Tensor scaled_swish(const strata::Tensor& x, double beta);

/// The op as a layer.
class ScaledSwish : public strata::nn::Module {
 public:
  explicit ScaledSwish(double beta = 1.0) : beta(beta) {}
  strata::Tensor forward(const strata::Tensor& input) override { return scaled_swish(input, beta); }
  std::string name() const override { return "ScaledSwish"; }

  double beta;
};

}  // namespace swish
