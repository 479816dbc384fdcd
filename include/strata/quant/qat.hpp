// Quantization-aware training, as torch.ao.quantization's prepare_qat and convert, for Linear
// layers: prepare_qat puts fake quantization on each Linear's input and weight (the layer keeps
// training its float weight through the straight-through gradient); convert turns each into an
// int8 layer with the observers' qparams, whose outputs match the fake-quantized ones.
//
//   quant::prepare_qat(model);         // train as usual: forward sees quantization's rounding
//   ... training loop ...
//   model.eval();
//   quant::convert(model);             // int8 weights, static int8 input scales
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <strata/nn/linear.hpp>
#include <strata/quant/fake_quantize.hpp>

namespace strata::quant {

struct QatOptions {
  /// Fake quant of each layer's input; null: default_fake_quant() (uint8 affine, moving average).
  std::function<std::unique_ptr<FakeQuantize>()> input_fake_quant;
  /// Fake quant of each weight, given out_features; null: default_weight_fake_quant (int8
  /// per-channel symmetric, the form convert needs).
  std::function<std::unique_ptr<FakeQuantize>(int64_t out_features)> weight_fake_quant;
  /// Which layers, by dotted name; null: every nn::Linear.
  std::function<bool(const std::string& name, const nn::Linear& layer)> filter;
};

/// Attaches fake quantization to the Linear layers of `model` (state dict keys
/// "<layer>.qat.input_fake_quant.*" and "<layer>.qat.weight_fake_quant.*"); returns how many.
/// Raises on a layer that is quantized or prepared already.
STRATA_API int64_t prepare_qat(nn::Module& model, const QatOptions& options = {});

/// Replaces every prepared layer's fake quantization by int8 weights (quantized with the weight
/// observer's qparams) and static int8 input quantization (the input observer's); returns how
/// many. The weight observer must be per-channel symmetric along dim 0 with a signed range.
STRATA_API int64_t convert(nn::Module& model);

}  // namespace strata::quant
