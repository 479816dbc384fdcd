// Learnable fake quantization (LSQ, Esser et al. 2020), as torch.ao.quantization's
// _LearnableFakeQuantize and torch._fake_quantize_learnable_per_tensor_affine / _per_channel_affine:
// the forward is fake_quantize_*_affine with the zero point rounded (half to even) and clamped; the
// backward also gives scale and zero point gradients, per element (code q = zp + round(x / s)):
//
//   inside [qmin, qmax]:  dx = dy   ds = dy * (x_fq - x) / s * f        dzp = 0
//   below qmin:           dx = 0    ds = dy * (qmin - zp) * f           dzp = -dy * s * f
//   above qmax:           dx = 0    ds = dy * (qmax - zp) * f           dzp = -dy * s * f
//
// summed over the tensor (per tensor) or over all but the channel axis, f = grad_factor.
//
//   auto fq = std::make_unique<quant::LearnableFakeQuantize>(std::make_unique<quant::MovingAverageMinMaxObserver>());
//   // observer first (static estimate), then fq->enable_param_learning(): scale and zero_point train
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <strata/nn/module.hpp>
#include <strata/quant/fake_quantize.hpp>

namespace strata::quant {

/// x (floating, any shape) -> fake-quantized x of its dtype; differentiable in x, scale and
/// zero_point (floating tensors of one element: float32 values; zero_point rounded half to even
/// and clamped to [quant_min, quant_max] as PyTorch's).
STRATA_API Tensor fake_quantize_learnable_per_tensor_affine(const Tensor& x, const Tensor& scale,
                                                            const Tensor& zero_point, int64_t quant_min,
                                                            int64_t quant_max, double grad_factor = 1.0);
/// One scale and zero point per index of `axis` (1-d of x.size(axis), floating).
STRATA_API Tensor fake_quantize_learnable_per_channel_affine(const Tensor& x, const Tensor& scale,
                                                             const Tensor& zero_point, int64_t axis,
                                                             int64_t quant_min, int64_t quant_max,
                                                             double grad_factor = 1.0);

struct LearnableOptions {
  double scale = 1.0;              // initial scale (every channel)
  double zero_point = 0.0;         // initial zero point
  bool use_grad_scaling = false;   // grad_factor = 1 / sqrt(x.numel() * quant_max) (LSQ's), else 1
};

/// A FakeQuantize whose scale and zero_point are float32 parameters (PyTorch's
/// _LearnableFakeQuantize). While the observer is enabled ("static estimate") each forward copies
/// its qparams into them; with it disabled the scale is clamped to the observer's eps and the
/// parameters are what the optimizer made them. Symmetric schemes hold the zero point at the
/// symmetric code (0 for a signed range). Per channel, the observer must be sized (num_channels):
/// the parameters keep their shape for the optimizer. Buffers fake_quant_enabled, observer_enabled
/// (PyTorch's static_enabled), learning_enabled, eps; the QAT switches (qat.hpp) act on it too.
class STRATA_API LearnableFakeQuantize : public FakeQuantize {
 public:
  explicit LearnableFakeQuantize(std::unique_ptr<Observer> observer, const LearnableOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "LearnableFakeQuantize"; }
  /// The scale (clamped to eps) and the rounded, clamped zero point (for a symmetric scheme its
  /// symmetric code, which the forward applies).
  std::pair<Tensor, Tensor> qparams() const override;

  /// Whether scale and zero_point require grad (learning_enabled).
  void toggle_qparam_learning(bool on);
  bool learning_enabled() const;
  /// PyTorch's modes: learning on, observer off, fake quant on.
  void enable_param_learning();
  /// Learning off, observer on, fake quant on.
  void enable_static_estimate();
  /// Learning off, observer on, fake quant off.
  void enable_static_observation();

 private:
  LearnableOptions options_;
  Tensor learning_enabled_, eps_;
};

/// The three modes above on every LearnableFakeQuantize at or under `module`.
STRATA_API void enable_param_learning(nn::Module& module);
STRATA_API void enable_static_estimate(nn::Module& module);
STRATA_API void enable_static_observation(nn::Module& module);

/// LSQ defaults (PyTorch's default_fused_act_fake_quant / per-channel weight learnable qconfig):
/// activations uint8 [0, 255] affine with a moving-average observer; weights int8 [-128, 127]
/// per-channel symmetric along dim 0 with grad scaling.
STRATA_API std::unique_ptr<LearnableFakeQuantize> learnable_fake_quant();
STRATA_API std::unique_ptr<LearnableFakeQuantize> learnable_weight_fake_quant(int64_t num_channels);

}  // namespace strata::quant
