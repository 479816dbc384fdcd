// Static (post-training) quantization in eager mode, as torch.ao.quantization's prepare, calibrate
// and convert: prepare puts observers on the input and output of every Linear, Conv2d, Conv1d and
// ConvTranspose2d (and of the fused modules of quant::fuse_modules, ReLU included); calibration
// batches run through the
// float model record the activations' ranges; convert gives int8 layers whose activations use
// those fixed scales and zero points (int8 weights per output channel, symmetric; uint8 x int8 ->
// int32 products; outputs requantized to the output observer's qparams, as PyTorch's quantized
// modules produce). See docs/quantization.md.
//
//   model.eval();
//   quant::fuse_modules(model, {{"0", "1", "2"}});   // Conv2d, BatchNorm2d, ReLU
//   quant::prepare(model);
//   for (auto& batch : calibration) model(batch);      // no gradients needed
//   quant::convert(model);                             // qat.hpp: converts prepare_qat's layers too
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <strata/nn/conv.hpp>
#include <strata/nn/module.hpp>
#include <strata/quant/observer.hpp>
#include <strata/quant/quantize.hpp>

namespace strata::quant {

struct StaticOptions {
  /// The observer of each layer's input and output (per tensor); null: MinMaxObserver with uint8
  /// [0, 255] affine qparams.
  std::function<std::unique_ptr<Observer>()> activation_observer;
  /// Which layers (nn::Linear, Conv2d, Conv1d, ConvTranspose2d), by dotted name; null: every one.
  std::function<bool(const std::string& name, const nn::Module& layer)> filter;
};

/// Puts observers on the quantizable layers of `model` (state dict keys
/// "<layer>.observed.input_observer.*" and "<layer>.observed.output_observer.*"); a fused module's
/// ReLU moves into its layer's form (the ReLU child becomes nn::Identity) so the output observer
/// sees its result. Returns how many layers; raises (before changing any) on none, on a layer that
/// is quantized or prepared already, a convolution padding other than with zeros, or a fused module
/// holding batch norm (fuse in eval with fuse_modules for static quantization). Each QuantStub
/// (stubs.hpp) that `options.filter` accepts gets an activation observer too; the count includes them.
STRATA_API int64_t prepare(nn::Module& model, const StaticOptions& options = {});

/// y = x . dequantize(w)^T + bias with x quantized per tensor to uint8 with the fixed (x_scale,
/// x_zero_point): uint8 x int8 -> int32 products, the float epilogue of the dynamic layer. Float
/// output of x's dtype, not requantized.
STRATA_API Tensor linear_int8_static(const Tensor& x, double x_scale, int64_t x_zero_point, const Int8Weight& w,
                                     const Tensor& bias = {});

/// conv2d(x, dequantize(w), bias) computed in integers: x (N, C, H, W) or (C, H, W) quantized per
/// tensor to uint8 with (x_scale, x_zero_point), zero padding as the zero point's code, the codes
/// convolved by oneDNN's int8 convolution (CPUs with VNNI; see set_onednn_int8_conv) or gathered
/// by im2col and multiplied by w.codes (out, C / groups * kH * kW), the weight of shape
/// (out, C / groups, kH, kW) quantized as quantize_weight_int8(weight.reshape({out, -1})). Float32
/// output, not requantized; CPU and CUDA.
STRATA_API Tensor conv2d_int8(const Tensor& x, double x_scale, int64_t x_zero_point, const Int8Weight& w,
                              nn::Size2 kernel_size, const nn::functional::Conv2dArgs& args = {},
                              const Tensor& bias = {});

/// conv_transpose2d(x, w_float, bias, args) computed in integers, x (N, C, H, W) or (C, H, W) quantized
/// per tensor to uint8 with (x_scale, x_zero_point): the int8 GEMM of each pixel's codes by w.codes, then
/// the float columns summed into the output (col2im). w holds the transposed weight (C, out / groups, kH,
/// kW) with its output channels on dim 0, as the weight of the convolution it transposes: (out, C /
/// groups * kH * kW), quantized per output channel (quantize_weight_int8 of that). Float32 output, not
/// requantized; CPU and CUDA.
STRATA_API Tensor conv_transpose2d_int8(const Tensor& x, double x_scale, int64_t x_zero_point, const Int8Weight& w,
                                        nn::Size2 kernel_size, const nn::functional::ConvTranspose2dArgs& args = {},
                                        const Tensor& bias = {});

/// Whether the int8 convolutions (conv2d_int8 and converted Conv2d and Conv1d layers) on the CPU
/// may run oneDNN's int8 convolution, where the build has oneDNN and the CPU multiplies int8
/// exactly (VNNI); otherwise, or when switched off, im2col and the int8 GEMM. Both give the same results
/// bit for bit. On by default; process-wide, as PyTorch's torch.backends.mkldnn.enabled.
STRATA_API void set_onednn_int8_conv(bool enabled);
STRATA_API bool onednn_int8_conv_enabled();

}  // namespace strata::quant
