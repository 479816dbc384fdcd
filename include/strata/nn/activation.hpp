// Activation layers: each forwards to its nn::functional counterpart (PReLU holds its slopes).
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

class STRATA_API ELU : public Module {
 public:
  explicit ELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& input) override { return functional::elu(input, alpha); }
  std::string name() const override { return "ELU"; }

  double alpha;
};

class STRATA_API SELU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::selu(input); }
  std::string name() const override { return "SELU"; }
};

class STRATA_API CELU : public Module {
 public:
  explicit CELU(double alpha = 1.0) : alpha(alpha) {}
  Tensor forward(const Tensor& input) override { return functional::celu(input, alpha); }
  std::string name() const override { return "CELU"; }

  double alpha;
};

class STRATA_API Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0) : beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& input) override { return functional::softplus(input, beta, threshold); }
  std::string name() const override { return "Softplus"; }

  double beta, threshold;
};

class STRATA_API Mish : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::mish(input); }
  std::string name() const override { return "Mish"; }
};

class STRATA_API LogSigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::logsigmoid(input); }
  std::string name() const override { return "LogSigmoid"; }
};

class STRATA_API Hardtanh : public Module {
 public:
  explicit Hardtanh(double min_val = -1.0, double max_val = 1.0) : min_val(min_val), max_val(max_val) {}
  Tensor forward(const Tensor& input) override { return functional::hardtanh(input, min_val, max_val); }
  std::string name() const override { return "Hardtanh"; }

  double min_val, max_val;
};

class STRATA_API ReLU6 : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::relu6(input); }
  std::string name() const override { return "ReLU6"; }
};

class STRATA_API Hardsigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::hardsigmoid(input); }
  std::string name() const override { return "Hardsigmoid"; }
};

class STRATA_API Hardswish : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::hardswish(input); }
  std::string name() const override { return "Hardswish"; }
};

class STRATA_API Softsign : public Module {
 public:
  Tensor forward(const Tensor& input) override { return functional::softsign(input); }
  std::string name() const override { return "Softsign"; }
};

class STRATA_API GLU : public Module {
 public:
  explicit GLU(int64_t dim = -1) : dim(dim) {}
  Tensor forward(const Tensor& input) override { return functional::glu(input, dim); }
  std::string name() const override { return "GLU"; }

  int64_t dim;
};

/// A learned slope for negative inputs: one shared, or one per channel (dim 1 of the input).
class STRATA_API PReLU : public Module {
 public:
  explicit PReLU(int64_t num_parameters = 1, double init = 0.25);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "PReLU"; }

  int64_t num_parameters;
  Tensor weight;  // (num_parameters)
};

}  // namespace strata::nn
