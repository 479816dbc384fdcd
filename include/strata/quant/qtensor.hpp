// Affine quantization primitives with PyTorch's semantics: quantize_per_tensor,
// quantize_per_channel, dequantize and the observers' choice of scale and zero point
// (torch.ao.quantization's _calculate_qparams). See docs/quantization.md.
//
//   auto q = quant::quantize_per_tensor(x, 0.05, 3, kUInt8);  // codes = clamp(3 + round(x / 0.05), 0, 255)
//   Tensor back = q.dequantize();                               // (codes - 3) * 0.05, float32
//
// Rounding is half to even, in float32, as PyTorch; NaN quantizes to the zero point and +-inf
// to the end codes (Note [Non-finite values in quantization] in kernels/common/quant_affine.h).
#pragma once

#include <cstdint>
#include <utility>

#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::quant {

enum class QScheme { PerTensorAffine, PerTensorSymmetric, PerChannelAffine, PerChannelSymmetric };

constexpr bool is_per_channel(QScheme s) { return s == QScheme::PerChannelAffine || s == QScheme::PerChannelSymmetric; }
constexpr bool is_symmetric(QScheme s) { return s == QScheme::PerTensorSymmetric || s == QScheme::PerChannelSymmetric; }

/// The integer range of a code type: int8 [-128, 127], uint8 [0, 255]; reduce_range drops one
/// bit ([-64, 63], [0, 127]), as PyTorch's observers.
struct QRange {
  int32_t quant_min, quant_max;
};
STRATA_API QRange quant_range(DType dtype, bool reduce_range = false);

/// An integer tensor with its quantization parameters: PyTorch's quantized tensor, as a value.
struct STRATA_API QuantizedTensor {
  Tensor int_repr;     // int8 or uint8 codes, contiguous, in the float tensor's shape
  Tensor scales;       // float32, (1) per tensor or (channels) per channel
  Tensor zero_points;  // int32, shaped as scales
  int64_t axis = -1;   // the channel dim, -1 per tensor

  bool per_channel() const { return axis >= 0; }
  QRange range() const { return quant_range(int_repr.dtype()); }
  /// (codes - zero_point) * scale as float32.
  Tensor dequantize() const;
};

/// Quantizes a floating tensor with one scale and zero point; dtype is kInt8 or kUInt8.
STRATA_API QuantizedTensor quantize_per_tensor(const Tensor& x, double scale, int64_t zero_point, DType dtype);
/// Quantizes with one scale and zero point per index of `axis` (scales float, zero points integer,
/// both 1-d of x.size(axis)).
STRATA_API QuantizedTensor quantize_per_channel(const Tensor& x, const Tensor& scales, const Tensor& zero_points,
                                                int64_t axis, DType dtype);
STRATA_API Tensor dequantize(const QuantizedTensor& q);

/// Scale (float32) and zero point (int32) for ranges [min_val, max_val] (tensors of one shape:
/// 0-d per tensor, 1-d per channel), with PyTorch's observer math: the range widened to hold 0,
/// the scale floored at eps, the zero point an integer in [quant_min, quant_max].
STRATA_API std::pair<Tensor, Tensor> calculate_qparams(const Tensor& min_val, const Tensor& max_val, QRange range,
                                                       bool symmetric, double eps = 1.1920928955078125e-07);

/// The finite minimum and maximum of x (over all of it, or per index of `axis` when axis >= 0):
/// the range observers and weight quantization use (NaN and inf are left out; a slice with no
/// finite value gives [0, 0]).
STRATA_API std::pair<Tensor, Tensor> finite_aminmax(const Tensor& x, int64_t axis = -1);

}  // namespace strata::quant
