// quantize_per_tensor / quantize_per_channel / dequantize and the observers' qparams math:
// see include/strata/quant/qtensor.hpp.
#include <strata/quant/qtensor.hpp>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "quant/dispatch.h"

namespace strata::quant {

QRange quant_range(DType dtype, bool reduce_range) {
  STRATA_CHECK(dtype == kInt8 || dtype == kUInt8, "[quantize] codes are int8 or uint8, got {}", dtype);
  if (dtype == kInt8) return reduce_range ? QRange{-64, 63} : QRange{-128, 127};
  return reduce_range ? QRange{0, 127} : QRange{0, 255};
}

namespace {

Tensor float_input(const Tensor& x, const char* op) {
  STRATA_CHECK(x.defined(), "[{}] the input tensor is undefined", op);
  STRATA_CHECK(is_floating(x.dtype()), "[{}] expects a floating tensor, got {}", op, x.dtype());
  return x.detach().to(kFloat32).contiguous();
}

QuantizedTensor quantize_with(const Tensor& x, Tensor scales, Tensor zero_points, int64_t axis, DType dtype) {
  const QRange r = quant_range(dtype);
  QuantizedTensor q{empty(x.shape(), TensorOptions(dtype, x.device())), std::move(scales), std::move(zero_points),
                    axis};
  detail::run_quantize(x, q.int_repr, detail::layout_of(x.shape(), axis), q.scales, q.zero_points, r.quant_min,
                       r.quant_max);
  return q;
}

}  // namespace

QuantizedTensor quantize_per_tensor(const Tensor& x, double scale, int64_t zero_point, DType dtype) {
  const Tensor xf = float_input(x, "quantize_per_tensor");
  const QRange r = quant_range(dtype);
  STRATA_CHECK(std::isfinite(static_cast<float>(scale)) && static_cast<float>(scale) > 0,
               "[quantize_per_tensor] scale must be positive and finite in float32, got {}", scale);
  STRATA_CHECK(zero_point >= r.quant_min && zero_point <= r.quant_max,
               "[quantize_per_tensor] zero_point {} is outside [{}, {}] of {}", zero_point, r.quant_min, r.quant_max,
               dtype);
  const TensorOptions f32(kFloat32, x.device());
  return quantize_with(xf, full({1}, scale, f32), full({1}, zero_point, f32.dtype(kInt32)), -1, dtype);
}

QuantizedTensor quantize_per_channel(const Tensor& x, const Tensor& scales, const Tensor& zero_points, int64_t axis,
                                     DType dtype) {
  const Tensor xf = float_input(x, "quantize_per_channel");
  const QRange r = quant_range(dtype);
  STRATA_CHECK(x.dim() >= 1, "[quantize_per_channel] expects a tensor with at least one dim, got a 0-d tensor");
  STRATA_CHECK(axis >= -x.dim() && axis < x.dim(), "[quantize_per_channel] axis {} is out of range for shape {}",
               axis, x.shape());
  if (axis < 0) axis += x.dim();
  const int64_t c = x.size(axis);
  STRATA_CHECK(scales.defined() && zero_points.defined() && scales.shape() == Shape{c} &&
                   zero_points.shape() == Shape{c},
               "[quantize_per_channel] scales and zero_points must have shape ({}) for axis {} of shape {}", c, axis,
               x.shape());
  STRATA_CHECK(is_floating(scales.dtype()) && is_integral(zero_points.dtype()),
               "[quantize_per_channel] scales must be floating and zero_points integer, got {} and {}",
               scales.dtype(), zero_points.dtype());
  STRATA_CHECK(scales.device() == x.device() && zero_points.device() == x.device(),
               "[quantize_per_channel] scales on {} and zero_points on {} for an input on {}", scales.device(),
               zero_points.device(), x.device());
  const Tensor s = scales.detach().to(kFloat32).contiguous(), z = zero_points.detach().to(kInt32).contiguous();
  NoGradGuard no_grad;
  STRATA_CHECK(c == 0 || (amin(s).item<float>() > 0 && isfinite(s).all().item<bool>()),
               "[quantize_per_channel] every scale must be finite and positive");
  STRATA_CHECK(c == 0 || (amin(z).item<int32_t>() >= r.quant_min && amax(z).item<int32_t>() <= r.quant_max),
               "[quantize_per_channel] zero_points must lie in [{}, {}] of {}", r.quant_min, r.quant_max, dtype);
  return quantize_with(xf, s, z, axis, dtype);
}

Tensor QuantizedTensor::dequantize() const { return quant::dequantize(*this); }

Tensor dequantize(const QuantizedTensor& q) {
  STRATA_CHECK(q.int_repr.defined() && q.scales.defined() && q.zero_points.defined(),
               "[dequantize] the quantized tensor is incomplete (codes, scales and zero points are needed)");
  STRATA_CHECK(q.int_repr.dtype() == kInt8 || q.int_repr.dtype() == kUInt8,
               "[dequantize] codes are int8 or uint8, got {}", q.int_repr.dtype());
  const int64_t channels = q.axis >= 0 ? q.int_repr.size(q.axis) : 1;
  STRATA_CHECK(q.scales.numel() == channels && q.zero_points.numel() == channels,
               "[dequantize] {} scales and {} zero points for {} channels", q.scales.numel(), q.zero_points.numel(),
               channels);
  Tensor out = empty(q.int_repr.shape(), TensorOptions(kFloat32, q.int_repr.device()));
  detail::run_dequantize(q.int_repr.contiguous(), out, detail::layout_of(q.int_repr.shape(), q.axis),
                         q.scales.to(kFloat32).contiguous(), q.zero_points.to(kInt32).contiguous());
  return out;
}

std::pair<Tensor, Tensor> calculate_qparams(const Tensor& min_val, const Tensor& max_val, QRange range,
                                            bool symmetric, double eps) {
  STRATA_CHECK(min_val.defined() && max_val.defined() && min_val.shape() == max_val.shape(),
               "[calculate_qparams] min_val and max_val must be tensors of one shape");
  STRATA_CHECK(range.quant_min < range.quant_max, "[calculate_qparams] quant_min {} must be below quant_max {}",
               range.quant_min, range.quant_max);
  const Tensor lo = min_val.detach().to(kCPU).to(kFloat32).contiguous();
  const Tensor hi = max_val.detach().to(kCPU).to(kFloat32).contiguous();
  Tensor scale = empty(lo.shape(), kFloat32), zero = empty(lo.shape(), kInt32);
  const float* l = lo.data_ptr<float>();
  const float* h = hi.data_ptr<float>();
  for (int64_t i = 0; i < lo.numel(); ++i) {
    // a range never observed ([+inf, -inf]) gives scale 1 and zero point 0, as PyTorch warns and does
    qmath::QParams p{1.0f, 0};
    if (l[i] <= h[i])
      p = qmath::choose_qparams(l[i], h[i], range.quant_min, range.quant_max, symmetric, static_cast<float>(eps));
    else if (symmetric && range.quant_min >= 0)
      p.zero_point = qmath::choose_qparams(0, 0, range.quant_min, range.quant_max, true).zero_point;
    scale.data_ptr<float>()[i] = p.scale;
    zero.data_ptr<int32_t>()[i] = p.zero_point;
  }
  return {scale.to(min_val.device()), zero.to(min_val.device())};
}

std::pair<Tensor, Tensor> finite_aminmax(const Tensor& x, int64_t axis) {
  STRATA_CHECK(x.defined() && is_floating(x.dtype()), "[finite_aminmax] expects a floating tensor");
  NoGradGuard no_grad;
  Tensor v = x.detach().to(kFloat32);
  if (axis >= 0) {
    STRATA_CHECK(axis < x.dim(), "[finite_aminmax] axis {} is out of range for shape {}", axis, x.shape());
    v = v.transpose(0, axis).reshape({x.size(axis), -1});
  } else {
    v = v.reshape({1, -1});
  }
  if (v.size(1) == 0) {
    Tensor z = zeros({v.size(0)}, TensorOptions(kFloat32, x.device()));
    return axis >= 0 ? std::pair{z, z.clone()} : std::pair{z.reshape({}), z.reshape({}).clone()};
  }
  const Tensor finite = isfinite(v);
  Tensor lo = amin(where(finite, v, std::numeric_limits<float>::infinity()), {1});
  Tensor hi = amax(where(finite, v, -std::numeric_limits<float>::infinity()), {1});
  const Tensor none = gt(lo, hi);  // no finite value: [0, 0]
  lo = where(none, 0.0, lo);
  hi = where(none, 0.0, hi);
  if (axis < 0) return {lo.reshape({}), hi.reshape({})};
  return {lo, hi};
}

}  // namespace strata::quant
