// Fake quantization ops and the FakeQuantize module: see include/strata/quant/fake_quantize.hpp.
#include <strata/quant/fake_quantize.hpp>

#include <cmath>

#include <strata/autograd/grad_mode.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "quant/dispatch.h"
#include "quant/fake_quantize.h"

namespace strata::quant {

namespace detail {

std::pair<Tensor, Tensor> fake_quantize_values(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                               int64_t axis, int64_t quant_min, int64_t quant_max) {
  Tensor out = empty(x.shape(), TensorOptions(kFloat32, x.device()));
  Tensor mask = empty(x.shape(), TensorOptions(kUInt8, x.device()));
  NoGradGuard no_grad;
  run_fake_quantize(x.detach().to(kFloat32).contiguous(), out, mask, layout_of(x.shape(), axis),
                    scale.detach().to(kFloat32).contiguous(), zero_point.detach().to(kInt32).contiguous(),
                    static_cast<int32_t>(quant_min), static_cast<int32_t>(quant_max));
  return {out.to(x.dtype()), mask};
}

void check_fake_quantize_input(const char* op, const Tensor& x, int64_t quant_min, int64_t quant_max) {
  STRATA_CHECK(x.defined(), "[{}] the input tensor is undefined", op);
  STRATA_CHECK(is_floating(x.dtype()), "[{}] expects a floating tensor, got {}", op, x.dtype());
  STRATA_CHECK(quant_min < quant_max && quant_min >= -(int64_t{1} << 24) && quant_max <= (int64_t{1} << 24),
               "[{}] quant_min ({}) must be below quant_max ({}), both within +-2^24", op, quant_min, quant_max);
}

}  // namespace detail

namespace {

// scale float32 and zero_point int32, one per channel of `axis` (-1: one), already checked
Tensor fake_quantize(const char* op, const Tensor& x, const Tensor& scale, const Tensor& zero_point, int64_t axis,
                     int64_t quant_min, int64_t quant_max) {
  auto [out, mask] = detail::fake_quantize_values(x, scale, zero_point, axis, quant_min, quant_max);
  // straight-through: the gradient passes where the unclamped code is inside [quant_min, quant_max]
  autograd::record(op, {x}, {out}, {mask}, [](const autograd::Grads& g, const autograd::Saved& s) {
    return autograd::Grads{g[0] * s[0].to(g[0].dtype())};
  });
  return out;
}

using detail::check_fake_quantize_input;

}  // namespace

Tensor fake_quantize_per_tensor_affine(const Tensor& x, double scale, int64_t zero_point, int64_t quant_min,
                                       int64_t quant_max) {
  const char* op = "fake_quantize_per_tensor_affine";
  check_fake_quantize_input(op, x, quant_min, quant_max);
  STRATA_CHECK(std::isfinite(static_cast<float>(scale)) && static_cast<float>(scale) > 0,
               "[{}] scale must be positive and finite in float32, got {}", op, scale);
  STRATA_CHECK(zero_point >= quant_min && zero_point <= quant_max, "[{}] zero_point {} is outside [{}, {}]", op,
               zero_point, quant_min, quant_max);
  const TensorOptions o(kFloat32, x.device());
  return fake_quantize(op, x, full({1}, scale, o), full({1}, zero_point, o.dtype(kInt32)), -1, quant_min, quant_max);
}

Tensor fake_quantize_per_channel_affine(const Tensor& x, const Tensor& scale, const Tensor& zero_point, int64_t axis,
                                        int64_t quant_min, int64_t quant_max) {
  const char* op = "fake_quantize_per_channel_affine";
  check_fake_quantize_input(op, x, quant_min, quant_max);
  STRATA_CHECK(x.dim() >= 1 && axis >= -x.dim() && axis < x.dim(), "[{}] axis {} is out of range for shape {}", op,
               axis, x.shape());
  if (axis < 0) axis += x.dim();
  const int64_t c = x.size(axis);
  STRATA_CHECK(scale.defined() && zero_point.defined() && scale.shape() == Shape{c} &&
                   zero_point.shape() == Shape{c} && is_floating(scale.dtype()) &&
                   !is_floating(zero_point.dtype()),
               "[{}] expects a floating scale and an integer zero_point of shape ({}) for axis {} of shape {}", op,
               c, axis, x.shape());
  STRATA_CHECK(scale.device() == x.device() && zero_point.device() == x.device(),
               "[{}] scale on {} and zero_point on {} for an input on {}", op, scale.device(), zero_point.device(),
               x.device());
  if (c > 0) {
    NoGradGuard no_grad;
    STRATA_CHECK(amin(scale).item<double>() > 0 && isfinite(scale).all().item<bool>(),
                 "[{}] every scale must be finite and positive", op);
    STRATA_CHECK(amin(zero_point).item<int64_t>() >= quant_min && amax(zero_point).item<int64_t>() <= quant_max,
                 "[{}] every zero_point must lie in [{}, {}]", op, quant_min, quant_max);
  }
  return fake_quantize(op, x, scale.detach(), zero_point.detach(), axis, quant_min, quant_max);
}

// ---- FakeQuantize ---------------------------------------------------------------------------------

FakeQuantize::FakeQuantize(std::unique_ptr<Observer> observer) : FakeQuantize(std::move(observer), false) {}

FakeQuantize::FakeQuantize(std::unique_ptr<Observer> observer, bool learnable) {
  STRATA_CHECK(observer != nullptr, "[FakeQuantize] the observer is null");
  observer_ = &register_module("activation_post_process", std::move(observer));
  const Shape shape = observer_->per_channel() ? observer_->min_val.shape() : Shape{1};
  if (learnable) {
    scale = register_parameter("scale", ones(shape));
    zero_point = register_parameter("zero_point", zeros(shape));
  } else {
    scale = register_buffer("scale", ones(shape));
    zero_point = register_buffer("zero_point", zeros(shape, kInt32));
  }
  fake_quant_enabled_ = register_buffer("fake_quant_enabled", ones({1}, kUInt8));
  observer_enabled_ = register_buffer("observer_enabled", ones({1}, kUInt8));
}

void FakeQuantize::replacing_child(nn::Module* old, nn::Module*) {
  STRATA_CHECK(old != observer_, "[FakeQuantize] its observer \"activation_post_process\" cannot be replaced (scale "
               "and zero_point take its shape): make a new FakeQuantize with the observer instead");
}

std::pair<Tensor, Tensor> FakeQuantize::qparams() const {
  NoGradGuard no_grad;
  return {scale.detach().to(kFloat32).clone(), zero_point.detach().to(kInt32).clone()};
}

void FakeQuantize::enable_fake_quant(bool on) { fake_quant_enabled_.fill_(on ? 1 : 0); }
void FakeQuantize::enable_observer(bool on) { observer_enabled_.fill_(on ? 1 : 0); }
bool FakeQuantize::fake_quant_enabled() const { return fake_quant_enabled_.item<int64_t>() != 0; }
bool FakeQuantize::observer_enabled() const { return observer_enabled_.item<int64_t>() != 0; }

Tensor FakeQuantize::forward(const Tensor& x) {
  STRATA_CHECK(x.defined() && is_floating(x.dtype()), "[FakeQuantize] expects a floating tensor");
  if (observer_enabled()) {
    NoGradGuard no_grad;
    (*observer_)(x.detach());
    auto [s, z] = observer_->calculate_qparams();
    s = s.reshape(per_channel() ? s.shape() : Shape{1});
    z = z.reshape(s.shape());
    if (scale.shape() != s.shape()) {
      set_tensor("scale", s.to(scale.device()));
      set_tensor("zero_point", z.to(zero_point.device()));
    } else {
      scale.copy_(s);
      zero_point.copy_(z);
    }
  }
  if (!fake_quant_enabled()) return x;
  if (per_channel())
    return fake_quantize_per_channel_affine(x, scale.to(x.device()), zero_point.to(x.device()), ch_axis(),
                                            quant_min(), quant_max());
  return fake_quantize("fake_quantize_per_tensor_affine", x, scale.to(x.device()), zero_point.to(x.device()), -1,
                       quant_min(), quant_max());
}

std::unique_ptr<FakeQuantize> default_fake_quant() {
  return std::make_unique<FakeQuantize>(std::make_unique<MovingAverageMinMaxObserver>(ObserverOptions{}));
}

std::unique_ptr<FakeQuantize> default_weight_fake_quant(int64_t num_channels) {
  return std::make_unique<FakeQuantize>(
      std::make_unique<MovingAveragePerChannelMinMaxObserver>(per_channel_defaults(), num_channels));
}

}  // namespace strata::quant
