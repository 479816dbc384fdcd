// Activation layers: each forwards to its nn::functional counterpart.
#pragma once

#include <cstdint>
#include <string>

#include <strata/nn/functional.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

class STRATA_API ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::relu(input); }
  std::string name() const override { return "ReLU"; }
};

class STRATA_API GELU : public Module {
 public:
  /// approximate: "none" (exact, erf) or "tanh"; checked here.
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& input) override { return functional::gelu(input, approximate); }
  std::string name() const override { return "GELU"; }

  std::string approximate;
};

class STRATA_API SiLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::silu(input); }
  std::string name() const override { return "SiLU"; }
};

class STRATA_API Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::tanh(input); }
  std::string name() const override { return "Tanh"; }
};

class STRATA_API Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::sigmoid(input); }
  std::string name() const override { return "Sigmoid"; }
};

class STRATA_API LeakyReLU : public Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& input) override { return functional::leaky_relu(input, negative_slope); }
  std::string name() const override { return "LeakyReLU"; }

  double negative_slope;
};

class STRATA_API Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& input) override { return functional::softmax(input, dim); }
  std::string name() const override { return "Softmax"; }

  int64_t dim;
};

class STRATA_API LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim) : dim(dim) {}
  Tensor forward(const Tensor& input) override { return functional::log_softmax(input, dim); }
  std::string name() const override { return "LogSoftmax"; }

  int64_t dim;
};

}  // namespace strata::nn
