// Module fusion, as torch.ao.quantization.fuse_modules and fuse_modules_qat: a run of layers
// named by their dotted paths becomes one fused module in the first one's place, the others
// become nn::Identity. In eval (fuse_modules), batch norm is folded into the convolution's or
// Linear's weight and bias; for training (fuse_modules_qat) it is kept, and quant::convert folds
// its running statistics after QAT.
//
//   model.eval();
//   quant::fuse_modules(model, {{"conv1", "bn1", "relu1"}, {"fc", "relu2"}});
//
// Patterns: Conv2d + BatchNorm2d (+ ReLU), Conv2d + ReLU, Conv1d + BatchNorm1d (+ ReLU), Conv1d + ReLU,
// Linear + ReLU, Linear + BatchNorm1d, and in eval only ConvTranspose2d + BatchNorm2d (folded).
// The layers must be owned by their parents (elements of a Sequential or ModuleList, or children
// registered as std::unique_ptr): a data member cannot be replaced (Note [Member children]).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <strata/nn/batchnorm.hpp>
#include <strata/nn/containers.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/linear.hpp>

namespace strata::quant {

/// PyTorch's intrinsic fused modules (torch.ao.nn.intrinsic).
/// ConvTransposeBn2d is a pattern of fuse_modules only (folded in eval): no FusedModule holds it.
enum class FusedKind {
  ConvReLU2d, ConvBn2d, ConvBnReLU2d, LinearReLU, LinearBn1d, ConvReLU1d, ConvBn1d, ConvBnReLU1d, ConvTransposeBn2d
};

/// A fused run of layers: a Sequential whose children "0" (Conv2d, Conv1d or Linear), "1" and "2" (BatchNorm,
/// ReLU) compute as the unfused layers did, so the state dict reads "<name>.0.weight" as PyTorch's.
/// prepare, prepare_qat and convert treat it as one quantized layer with its ReLU fused.
class STRATA_API FusedModule : public nn::Sequential {
 public:
  FusedModule(FusedKind kind, std::vector<std::unique_ptr<nn::Module>> layers);
  std::string name() const override;
  FusedKind kind() const { return kind_; }
  bool has_batch_norm() const { return kind_ == FusedKind::ConvBn2d || kind_ == FusedKind::ConvBnReLU2d ||
                                       kind_ == FusedKind::LinearBn1d || kind_ == FusedKind::ConvBn1d ||
                                       kind_ == FusedKind::ConvBnReLU1d; }
  bool has_relu() const { return kind_ == FusedKind::ConvReLU2d || kind_ == FusedKind::ConvBnReLU2d ||
                                 kind_ == FusedKind::LinearReLU || kind_ == FusedKind::ConvReLU1d ||
                                 kind_ == FusedKind::ConvBnReLU1d; }
  /// Batch norm statistics of a QAT module (fuse_modules_qat), as torch.ao.nn.intrinsic.qat's
  /// ConvBn2d: frozen, the batch norm normalizes with its running statistics and stops updating
  /// them, even in training mode (train() keeps it in eval); update_bn_stats undoes it. No-ops
  /// without batch norm.
  void freeze_bn_stats();
  void update_bn_stats();
  bool bn_frozen() const { return bn_frozen_; }
  nn::Module& train(bool on = true) override;

 protected:
  /// The QAT form of the layer reads the batch norm: set_submodule cannot replace it while prepared.
  void replacing_child(nn::Module* old, nn::Module* now) override;

 private:
  FusedKind kind_;
  bool bn_frozen_ = false;
};

/// Fuses each group of dotted names in eval form (batch norm folded); a group with batch norm
/// needs the model in eval mode (as PyTorch). Raises, before changing anything, on an unknown name,
/// a pattern not listed above, mismatched sizes or a layer its parent does not own.
STRATA_API void fuse_modules(nn::Module& model, const std::vector<std::vector<std::string>>& groups);
/// The same for QAT, in training mode: batch norm stays a layer of the fused module.
STRATA_API void fuse_modules_qat(nn::Module& model, const std::vector<std::vector<std::string>>& groups);

/// A new Conv2d (with a bias) computing conv followed by bn in eval: weight * gamma / sqrt(var + eps)
/// per output channel, bias (b - mean) * gamma / sqrt(var + eps) + beta, in the weight's dtype
/// (torch.nn.utils.fusion.fuse_conv_bn_eval). bn needs running statistics.
STRATA_API std::unique_ptr<nn::Conv2d> fuse_conv_bn_eval(const nn::Conv2d& conv, const nn::BatchNorm2d& bn);
/// The same for a Conv1d followed by a BatchNorm1d.
STRATA_API std::unique_ptr<nn::Conv1d> fuse_conv_bn_eval(const nn::Conv1d& conv, const nn::BatchNorm1d& bn);
/// The same for a ConvTranspose2d followed by a BatchNorm2d, the weight scaled along its output
/// channels (dim 1 of (in, out / groups, kH, kW)) (torch's fuse_convtranspose_bn_eval).
STRATA_API std::unique_ptr<nn::ConvTranspose2d> fuse_conv_bn_eval(const nn::ConvTranspose2d& conv,
                                                                  const nn::BatchNorm2d& bn);
/// The same for a Linear followed by a BatchNorm1d (torch's fuse_linear_bn_eval).
STRATA_API std::unique_ptr<nn::Linear> fuse_linear_bn_eval(const nn::Linear& linear, const nn::BatchNorm1d& bn);

}  // namespace strata::quant
