// Fake quantization for quantization-aware training: the quantize-dequantize round trip in
// float, with the straight-through gradient of torch.fake_quantize_per_tensor_affine (the
// gradient passes where zero_point + round(x / scale) lies in [quant_min, quant_max], zero
// elsewhere), and the FakeQuantize module that pairs it with an observer.
//
//   quant::FakeQuantize fq(std::make_unique<quant::MovingAverageMinMaxObserver>());
//   Tensor y = fq(x);                   // observes x, then fake-quantizes it with the new qparams
//   fq.disable_observer();              // freeze the qparams (late in training)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <strata/nn/module.hpp>
#include <strata/quant/observer.hpp>

namespace strata::quant {

/// x (floating, any shape) -> fake-quantized x of its dtype; differentiable in x only.
STRATA_API Tensor fake_quantize_per_tensor_affine(const Tensor& x, double scale, int64_t zero_point,
                                                  int64_t quant_min, int64_t quant_max);
/// One scale (float) and zero point (integer) per index of `axis`, 1-d of x.size(axis).
STRATA_API Tensor fake_quantize_per_channel_affine(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                                   int64_t axis, int64_t quant_min, int64_t quant_max);

/// An observer and the fake quantization its qparams drive (torch.ao.quantization.FakeQuantize).
/// Buffers: scale, zero_point, fake_quant_enabled, observer_enabled; the observer is the child
/// "activation_post_process", as in PyTorch.
class STRATA_API FakeQuantize : public nn::Module {
 public:
  explicit FakeQuantize(std::unique_ptr<Observer> observer);
  /// Observes x (when enabled) and updates scale and zero_point, then fake-quantizes x (when
  /// enabled) with them; with both disabled, returns x.
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "FakeQuantize"; }
  /// The float32 scale and int32 zero point (detached copies) the fake quantization applies:
  /// what convert quantizes with.
  virtual std::pair<Tensor, Tensor> qparams() const;

  void enable_fake_quant(bool on = true);
  void disable_fake_quant() { enable_fake_quant(false); }
  void enable_observer(bool on = true);
  void disable_observer() { enable_observer(false); }
  bool fake_quant_enabled() const;
  bool observer_enabled() const;
  /// The observer's current qparams.
  std::pair<Tensor, Tensor> calculate_qparams() const { return observer_->calculate_qparams(); }

  Observer& observer() { return *observer_; }
  const Observer& observer() const { return *observer_; }
  int32_t quant_min() const { return observer_->range().quant_min; }
  int32_t quant_max() const { return observer_->range().quant_max; }
  bool per_channel() const { return observer_->per_channel(); }
  int64_t ch_axis() const { return per_channel() ? observer_->options().ch_axis : -1; }

  Tensor scale;       // float32: (1) per tensor, (channels) per channel once observed
  Tensor zero_point;  // int32, shaped as scale (float32 parameters in LearnableFakeQuantize)

 protected:
  /// learnable: scale and zero_point are float32 parameters of the observer's shape
  /// (LearnableFakeQuantize) rather than buffers.
  FakeQuantize(std::unique_ptr<Observer> observer, bool learnable);
  /// The observer sized scale and zero_point: set_submodule cannot replace it.
  void replacing_child(nn::Module* old, nn::Module* now) override;

 private:
  Observer* observer_;
  Tensor fake_quant_enabled_, observer_enabled_;  // uint8 (1), as PyTorch's buffers
};

/// PyTorch's default QAT fake quants: activations with a moving-average per-tensor affine
/// observer (uint8 [0, 255]); weights with a moving-average per-channel symmetric one (int8
/// [-128, 127], channels along dim 0; num_channels sizes its buffers for a state dict).
STRATA_API std::unique_ptr<FakeQuantize> default_fake_quant();
STRATA_API std::unique_ptr<FakeQuantize> default_weight_fake_quant(int64_t num_channels = 0);

}  // namespace strata::quant
