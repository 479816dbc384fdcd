// Learnable fake quantization (LSQ): see include/strata/quant/learnable_fake_quantize.hpp.
#include <strata/quant/learnable_fake_quantize.hpp>

#include <cmath>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "kernels/common/quant_affine.h"
#include "quant/fake_quantize.h"

namespace strata::quant {

namespace {

// The zero point of a symmetric scheme: 0 for a signed range, the middle code for an unsigned one.
int32_t symmetric_zero_point(int32_t quant_min, int32_t quant_max) {
  return qmath::choose_qparams(0.0f, 0.0f, quant_min, quant_max, true).zero_point;
}

// scale and zero point as float32, zero point rounded half to even and clamped (PyTorch's
// _get_rounded_zero_point), checked: finite positive scales, finite zero points.
std::pair<Tensor, Tensor> checked_qparams(const char* op, const Tensor& x, const Tensor& scale,
                                          const Tensor& zero_point, int64_t channels, int64_t quant_min,
                                          int64_t quant_max) {
  STRATA_CHECK(scale.defined() && zero_point.defined() && scale.numel() == channels &&
                   zero_point.numel() == channels && is_floating(scale.dtype()),
               "[{}] expects a floating scale and a zero_point of {} element(s), got {} and {}", op, channels,
               scale.defined() ? scale.shape() : Shape{}, zero_point.defined() ? zero_point.shape() : Shape{});
  STRATA_CHECK(scale.device() == x.device() && zero_point.device() == x.device(),
               "[{}] scale on {} and zero_point on {} for an input on {}", op, scale.device(), zero_point.device(),
               x.device());
  NoGradGuard no_grad;
  const Tensor s = scale.detach().to(kFloat32).reshape({channels});
  const Tensor z = zero_point.detach().to(kFloat32).reshape({channels});
  if (channels > 0) {
    STRATA_CHECK(amin(s).item<double>() > 0 && isfinite(s).all().item<bool>(),
                 "[{}] every scale must be finite and positive (in float32)", op);
    STRATA_CHECK(isfinite(z).all().item<bool>(), "[{}] every zero_point must be finite", op);
  }
  return {s, clamp(round(z), quant_min, quant_max)};
}

// The fake quant of x recorded with PyTorch's learnable backward (header's table), computed in
// float32 from the saved x, scale and rounded zero point, shaped for broadcasting along `axis`.
Tensor learnable(const char* op, const Tensor& x, const Tensor& scale, const Tensor& zero_point, int64_t axis,
                 int64_t quant_min, int64_t quant_max, double grad_factor) {
  STRATA_CHECK(std::isfinite(grad_factor), "[{}] grad_factor must be finite, got {}", op, grad_factor);
  const int64_t channels = axis < 0 ? 1 : x.size(axis);
  auto [s, z] = checked_qparams(op, x, scale, zero_point, channels, quant_min, quant_max);
  auto [out, mask] = detail::fake_quantize_values(x, s, z, axis, quant_min, quant_max);
  Shape bshape(static_cast<size_t>(x.dim()), 1);
  if (axis >= 0) bshape[static_cast<size_t>(axis)] = channels;
  const Tensor x32 = x.detach().to(kFloat32);
  const DType scale_dtype = scale.dtype(), zp_dtype = zero_point.dtype();
  const Shape scale_shape = scale.shape(), zp_shape = zero_point.shape();  // one element: any shape
  autograd::record(op, {x, scale, zero_point}, {out}, {x32, s.reshape(bshape), z.reshape(bshape), mask},
                   [=](const autograd::Grads& g, const autograd::Saved& sv) {
    const Tensor dy = g[0].to(kFloat32);
    const Tensor &xs = sv[0], &sc = sv[1], &zp = sv[2];
    const Tensor inv = reciprocal(sc);
    const Tensor code = round(xs * inv) + zp;  // PyTorch's xq, unclamped
    const Tensor inside = sv[3].to(kBool), nan = isnan(xs);
    const double lo = static_cast<double>(quant_min), hi = static_cast<double>(quant_max);
    const Tensor x_fq = (clamp(code, lo, hi) - zp) * sc;
    const Tensor outside_ds = where(lt(code, lo), dy * (lo - zp), dy * (hi - zp));
    Tensor ds = where(nan, 0.0, where(inside, dy * (x_fq - xs) * inv, outside_ds)) * grad_factor;
    Tensor dz = where(logical_or(inside, nan), 0.0, dy * sc * -grad_factor);
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < xs.dim(); ++d)
      if (d != axis) dims.push_back(d);
    if (!dims.empty()) {
      ds = sum(ds, dims);
      dz = sum(dz, dims);
    }
    return autograd::Grads{g[0] * sv[3].to(g[0].dtype()), ds.reshape(scale_shape).to(scale_dtype),
                           is_floating(zp_dtype) ? dz.reshape(zp_shape).to(zp_dtype) : Tensor()};
  });
  return out;
}

}  // namespace

Tensor fake_quantize_learnable_per_tensor_affine(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                                 int64_t quant_min, int64_t quant_max, double grad_factor) {
  const char* op = "fake_quantize_learnable_per_tensor_affine";
  detail::check_fake_quantize_input(op, x, quant_min, quant_max);
  return learnable(op, x, scale, zero_point, -1, quant_min, quant_max, grad_factor);
}

Tensor fake_quantize_learnable_per_channel_affine(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                                  int64_t axis, int64_t quant_min, int64_t quant_max,
                                                  double grad_factor) {
  const char* op = "fake_quantize_learnable_per_channel_affine";
  detail::check_fake_quantize_input(op, x, quant_min, quant_max);
  STRATA_CHECK(x.dim() >= 1 && axis >= -x.dim() && axis < x.dim(), "[{}] axis {} is out of range for shape {}", op,
               axis, x.shape());
  if (axis < 0) axis += x.dim();
  STRATA_CHECK(scale.defined() && scale.dim() == 1 && zero_point.defined() && zero_point.dim() == 1,
               "[{}] expects 1-d scale and zero_point of x.size({}) = {}", op, axis, x.size(axis));
  return learnable(op, x, scale, zero_point, axis, quant_min, quant_max, grad_factor);
}

// ---- LearnableFakeQuantize ------------------------------------------------------------------------

LearnableFakeQuantize::LearnableFakeQuantize(std::unique_ptr<Observer> observer, const LearnableOptions& options)
    : FakeQuantize(std::move(observer), true), options_(options) {
  STRATA_CHECK(!per_channel() || scale.numel() > 0, "[LearnableFakeQuantize] a per-channel observer must be sized "
               "(num_channels): the learnable scale and zero point keep their shape");
  STRATA_CHECK(std::isfinite(options.scale) && options.scale > 0 && std::isfinite(options.zero_point),
               "[LearnableFakeQuantize] the initial scale must be finite and positive and the zero point finite, got "
               "{} and {}", options.scale, options.zero_point);
  NoGradGuard no_grad;
  scale.fill_(options.scale);
  zero_point.fill_(options.zero_point);
  learning_enabled_ = register_buffer("learning_enabled", zeros({1}, kUInt8));
  eps_ = register_buffer("eps", full({1}, this->observer().options().eps));
}

std::pair<Tensor, Tensor> LearnableFakeQuantize::qparams() const {
  NoGradGuard no_grad;
  const Tensor s = clamp(scale.detach().to(kFloat32), eps_.item<double>(), std::nullopt);
  // symmetric: the code each forward applies, whatever an optimizer step since made the parameter
  if (is_symmetric(observer().options().qscheme))
    return {s, full(zero_point.shape(), symmetric_zero_point(quant_min(), quant_max()),
                    TensorOptions(kInt32, zero_point.device()))};
  return {s, clamp(round(zero_point.detach().to(kFloat32)), quant_min(), quant_max()).to(kInt32)};
}

void LearnableFakeQuantize::toggle_qparam_learning(bool on) {
  learning_enabled_.fill_(on ? 1 : 0);
  scale.requires_grad_(on);
  zero_point.requires_grad_(on);
}
bool LearnableFakeQuantize::learning_enabled() const { return learning_enabled_.item<int64_t>() != 0; }

void LearnableFakeQuantize::enable_param_learning() {
  toggle_qparam_learning(true);
  enable_fake_quant(true);
  enable_observer(false);
}
void LearnableFakeQuantize::enable_static_estimate() {
  toggle_qparam_learning(false);
  enable_fake_quant(true);
  enable_observer(true);
}
void LearnableFakeQuantize::enable_static_observation() {
  toggle_qparam_learning(false);
  enable_fake_quant(false);
  enable_observer(true);
}

Tensor LearnableFakeQuantize::forward(const Tensor& x) {
  STRATA_CHECK(x.defined() && is_floating(x.dtype()), "[LearnableFakeQuantize] expects a floating tensor");
  {
    NoGradGuard no_grad;
    if (observer_enabled()) {
      observer()(x.detach());
      auto [s, z] = observer().calculate_qparams();
      STRATA_CHECK(s.numel() == scale.numel(), "[LearnableFakeQuantize] the observer gives {} scales for {} learnable "
                   "ones (a per-channel observer along an axis of another size?)", s.numel(), scale.numel());
      scale.copy_(s.reshape(scale.shape()));
      zero_point.copy_(z.reshape(zero_point.shape()));
    } else {
      scale.clamp_(eps_.item<double>(), std::nullopt);
    }
  }
  if (!fake_quant_enabled()) return x;
  if (is_symmetric(observer().options().qscheme)) {
    NoGradGuard no_grad;  // PyTorch zeroes it; the symmetric code is 0 only for a signed range
    zero_point.fill_(symmetric_zero_point(quant_min(), quant_max()));
  }
  // LSQ's 1 / sqrt(N * Q_P); 1 for an empty input or a range without positive codes
  const double grad_factor = options_.use_grad_scaling && x.numel() > 0 && quant_max() > 0
                                 ? 1.0 / std::sqrt(static_cast<double>(x.numel()) * quant_max())
                                 : 1.0;
  const Device d = x.device();
  if (per_channel())
    return fake_quantize_learnable_per_channel_affine(x, scale.to(d), zero_point.to(d), ch_axis(), quant_min(),
                                                      quant_max(), grad_factor);
  return fake_quantize_learnable_per_tensor_affine(x, scale.to(d), zero_point.to(d), quant_min(), quant_max(),
                                                   grad_factor);
}

namespace {
template <class F>
void for_each_learnable(nn::Module& module, F&& f) {
  for (auto& [name, m] : module.named_modules())
    if (auto* fq = dynamic_cast<LearnableFakeQuantize*>(m)) f(*fq);
}
}  // namespace

void enable_param_learning(nn::Module& module) {
  for_each_learnable(module, [](LearnableFakeQuantize& fq) { fq.enable_param_learning(); });
}
void enable_static_estimate(nn::Module& module) {
  for_each_learnable(module, [](LearnableFakeQuantize& fq) { fq.enable_static_estimate(); });
}
void enable_static_observation(nn::Module& module) {
  for_each_learnable(module, [](LearnableFakeQuantize& fq) { fq.enable_static_observation(); });
}

std::unique_ptr<LearnableFakeQuantize> learnable_fake_quant() {
  return std::make_unique<LearnableFakeQuantize>(std::make_unique<MovingAverageMinMaxObserver>(ObserverOptions{}));
}

std::unique_ptr<LearnableFakeQuantize> learnable_weight_fake_quant(int64_t num_channels) {
  STRATA_CHECK(num_channels > 0, "[learnable_weight_fake_quant] num_channels must be positive, got {}", num_channels);
  return std::make_unique<LearnableFakeQuantize>(
      std::make_unique<MovingAveragePerChannelMinMaxObserver>(per_channel_defaults(), num_channels),
      LearnableOptions{.use_grad_scaling = true});
}

}  // namespace strata::quant
