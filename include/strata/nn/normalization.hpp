// Normalization layers over features: LayerNorm, RMSNorm and GroupNorm, with PyTorch's
// parameter names (weight, bias) and initialization (ones, zeros).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <strata/nn/module.hpp>

namespace strata::nn {

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;
  bool bias = true;  // only with elementwise_affine
};

class STRATA_API LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions options = {});
  explicit LayerNorm(int64_t normalized_size, LayerNormOptions options = {})
      : LayerNorm(Shape{normalized_size}, options) {}
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "LayerNorm"; }

  Shape normalized_shape;
  LayerNormOptions options;
  Tensor weight, bias;  // of normalized_shape, undefined without affine
};

struct RMSNormOptions {
  std::optional<double> eps;  // default: the machine epsilon of the input's compute type (functional::rms_norm)
  bool elementwise_affine = true;
};

class STRATA_API RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, RMSNormOptions options = {});
  explicit RMSNorm(int64_t normalized_size, RMSNormOptions options = {}) : RMSNorm(Shape{normalized_size}, options) {}
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "RMSNorm"; }

  Shape normalized_shape;
  RMSNormOptions options;
  Tensor weight;  // of normalized_shape, undefined without affine
};

struct GroupNormOptions {
  double eps = 1e-5;
  bool affine = true;
};

class STRATA_API GroupNorm : public Module {
 public:
  /// num_channels must be divisible by num_groups.
  GroupNorm(int64_t num_groups, int64_t num_channels, GroupNormOptions options = {});
  /// (N, C, *) -> same shape.
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "GroupNorm"; }

  int64_t num_groups, num_channels;
  GroupNormOptions options;
  Tensor weight, bias;  // (num_channels), undefined without affine
};

}  // namespace strata::nn
