// Linear: y = x @ weight^T + bias, with PyTorch's parameter names, shapes and default
// initialization (weight kaiming_uniform(a = sqrt(5)), bias uniform(+-1/sqrt(in_features))).
#pragma once

#include <cstdint>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

struct LinearOptions {
  bool bias = true;
  Generator* generator = nullptr;  // for the initial values; default_generator() when null
};

class STRATA_API Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, LinearOptions options = {});
  /// (*, in_features) -> (*, out_features); raises Error naming the layer when the last dim
  /// of the input is not in_features.
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Linear"; }
  /// Re-draws the parameters as the constructor does.
  void reset_parameters(Generator* gen = nullptr);

  int64_t in_features, out_features;
  Tensor weight;  // (out_features, in_features)
  Tensor bias;    // (out_features), undefined without bias
};

}  // namespace strata::nn
