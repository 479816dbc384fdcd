// Quantization-aware training, as torch.ao.quantization's prepare_qat and convert, for Linear,
// Conv2d, Conv1d and ConvTranspose2d layers: prepare_qat puts fake quantization on each layer's
// input and weight (the layer keeps training its float weight through the straight-through
// gradient); convert turns each into an int8 layer with the observers' qparams, whose outputs
// match the fake-quantized ones. A fused module of quant::fuse_modules_qat trains its batch norm
// as a layer; convert folds its running statistics into the weight and bias and quantizes the
// folded weight with the weight fake quant's qparams (which QAT computed on the weight scaled the
// same way).
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

#include <strata/nn/module.hpp>
#include <strata/quant/fake_quantize.hpp>

namespace strata::quant {

struct QatOptions {
  /// Fake quant of each layer's input; null: default_fake_quant() (uint8 affine, moving average).
  std::function<std::unique_ptr<FakeQuantize>()> input_fake_quant;
  /// Fake quant of each weight, given its output channels; null: default_weight_fake_quant (int8
  /// per-channel symmetric, the form convert needs).
  std::function<std::unique_ptr<FakeQuantize>(int64_t out_channels)> weight_fake_quant;
  /// Which layers (nn::Linear, Conv2d, Conv1d, ConvTranspose2d), by dotted name; null: every one.
  std::function<bool(const std::string& name, const nn::Module& layer)> filter;
};

/// Attaches fake quantization to the Linear, Conv2d, Conv1d and ConvTranspose2d layers of `model`
/// (a transposed convolution's weight fake quant sees its weight with the output channels on dim 0,
/// (out, in / groups, kH, kW), so one scale per output channel; state dict keys
/// "<layer>.qat.input_fake_quant.*" and "<layer>.qat.weight_fake_quant.*"); returns how many.
/// Raises on a layer that is quantized or prepared already, or a convolution not padding with zeros.
/// Each float QuantStub (stubs.hpp) that `options.filter` accepts gets an input_fake_quant (counted too).
STRATA_API int64_t prepare_qat(nn::Module& model, const QatOptions& options = {});

/// PyTorch's QAT switches (torch.ao.quantization.enable_observer, disable_observer,
/// enable_fake_quant, disable_fake_quant; torch.ao.nn.intrinsic.qat.freeze_bn_stats,
/// update_bn_stats): each acts on every FakeQuantize (or fused Conv-BN / Linear-BN module of
/// fuse_modules_qat) at or under `module`, so both `disable_observer(model)` and PyTorch's
/// `model.apply(quant::disable_observer)` work. A disabled observer keeps its range and the fake
/// quant its last scale and zero point; frozen batch norm statistics stop changing and the folded
/// weight of the QAT form keeps using them.
STRATA_API void enable_observer(nn::Module& module);
STRATA_API void disable_observer(nn::Module& module);
STRATA_API void enable_fake_quant(nn::Module& module);
STRATA_API void disable_fake_quant(nn::Module& module);
STRATA_API void freeze_bn_stats(nn::Module& module);
STRATA_API void update_bn_stats(nn::Module& module);

/// Converts every layer prepared by prepare_qat or prepare (quantize_static.hpp) to int8, in place,
/// and returns how many. QAT: int8 weights quantized with the weight observer's qparams (which must
/// be per-channel symmetric along dim 0 with a signed range), static input quantization with the
/// input's, float outputs. Static: weights quantized per channel, symmetric; the observers' input
/// and output qparams, outputs requantized. Prepared QuantStubs become quantizes with their
/// observer's (fake quant's) qparams and count too; a LearnableFakeQuantize gives its learned ones.
/// Raises (before converting any) when nothing is prepared or an observer has seen no data.
STRATA_API int64_t convert(nn::Module& model);

}  // namespace strata::quant
