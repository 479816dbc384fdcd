// Instance normalization layers: InstanceNorm1d ((N, C, L) or (C, L)) and InstanceNorm2d
// ((N, C, H, W) or (C, H, W)), with PyTorch's defaults (no affine parameters, no running
// statistics) and, when asked for, its parameters (weight ones, bias zeros) and buffers
// (running_mean, running_var, num_batches_tracked), so state dicts match torch's.
//
//   nn::InstanceNorm2d norm(64, {.affine = true});
#pragma once

#include <cstdint>
#include <string>

#include <strata/nn/module.hpp>

namespace strata::nn {

struct InstanceNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = false;               // learnable per-channel weight and bias
  bool track_running_stats = false;  // keep running statistics and use them in eval
};

/// What InstanceNorm1d and InstanceNorm2d share; they differ in the input ranks they accept.
class STRATA_API InstanceNormBase : public Module {
 public:
  Tensor forward(const Tensor& input) override;

  int64_t num_features;
  InstanceNormOptions options;
  Tensor weight, bias;               // (num_features), undefined without affine
  Tensor running_mean, running_var;  // (num_features), undefined without track_running_stats
  Tensor num_batches_tracked;        // int64 scalar, undefined without track_running_stats

 protected:
  InstanceNormBase(int64_t num_features, InstanceNormOptions options, int64_t spatial_dims);

 private:
  int64_t spatial_dims_;
};

class STRATA_API InstanceNorm1d : public InstanceNormBase {
 public:
  explicit InstanceNorm1d(int64_t num_features, InstanceNormOptions options = {})
      : InstanceNormBase(num_features, options, 1) {}
  std::string name() const override { return "InstanceNorm1d"; }
};

class STRATA_API InstanceNorm2d : public InstanceNormBase {
 public:
  explicit InstanceNorm2d(int64_t num_features, InstanceNormOptions options = {})
      : InstanceNormBase(num_features, options, 2) {}
  std::string name() const override { return "InstanceNorm2d"; }
};

}  // namespace strata::nn
