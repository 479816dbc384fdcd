// Batch normalization layers: BatchNorm1d ((N, C) or (N, C, L) inputs) and BatchNorm2d
// ((N, C, H, W), NCHW or channels-last), with PyTorch's parameters (weight ones, bias zeros),
// buffers (running_mean zeros, running_var ones, num_batches_tracked int64 0) and update
// rules: training normalizes with the batch statistics and moves the running ones by
// momentum (momentum = std::nullopt: a cumulative average over the batches seen); eval
// normalizes with the running statistics.
//
//   nn::BatchNorm2d bn(64);
//   nn::BatchNorm1d bn1(128, {.momentum = std::nullopt, .affine = false});
//   y = bn.forward_relu(x, shortcut);   // relu(bn(x) + shortcut), one pass
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <strata/nn/module.hpp>

namespace strata::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  std::optional<double> momentum = 0.1;
  bool affine = true;               // learnable weight and bias
  bool track_running_stats = true;  // keep running statistics (else: batch statistics in eval too)
};

/// What BatchNorm1d and BatchNorm2d share; they differ in the input ranks they accept.
class STRATA_API BatchNormBase : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  /// relu(forward(input) + residual) in one pass (functional::batch_norm_relu); residual
  /// optional, of the input's shape.
  Tensor forward_relu(const Tensor& input, const Tensor& residual = Tensor());
  /// running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_running_stats();
  /// reset_running_stats(), weight = 1, bias = 0.
  void reset_parameters();

  int64_t num_features;
  BatchNormOptions options;
  Tensor weight, bias;                 // (num_features), undefined without affine
  Tensor running_mean, running_var;    // (num_features), undefined without track_running_stats
  Tensor num_batches_tracked;          // int64 scalar, undefined without track_running_stats

 protected:
  BatchNormBase(int64_t num_features, BatchNormOptions options);
  /// Raises Error naming the layer unless the input's rank is one this layer accepts.
  virtual void check_rank(const Tensor& input) const = 0;
  std::string describe() const;
  /// num_batches_tracked: checkpoints from before PyTorch 0.4.1 lack it, and PyTorch loads them.
  std::vector<std::string> optional_state_keys() const override;

 private:
  Tensor run(const Tensor& input, bool relu, const Tensor& residual);
};

class STRATA_API BatchNorm1d : public BatchNormBase {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {}) : BatchNormBase(num_features, options) {}
  std::string name() const override { return "BatchNorm1d"; }

 protected:
  void check_rank(const Tensor& input) const override;
};

class STRATA_API BatchNorm2d : public BatchNormBase {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {}) : BatchNormBase(num_features, options) {}
  std::string name() const override { return "BatchNorm2d"; }

 protected:
  void check_rank(const Tensor& input) const override;
};

}  // namespace strata::nn
