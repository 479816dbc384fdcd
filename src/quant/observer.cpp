// Observers: see include/strata/quant/observer.hpp.
#include <strata/quant/observer.hpp>

#include <limits>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>

namespace strata::quant {

namespace {

QRange observer_range(const ObserverOptions& o) {
  QRange r = quant_range(o.dtype, o.reduce_range);
  if (o.quant_min || o.quant_max) {
    STRATA_CHECK(o.quant_min && o.quant_max, "[Observer] quant_min and quant_max are given together");
    const QRange full = quant_range(o.dtype);
    STRATA_CHECK(*o.quant_min < *o.quant_max && *o.quant_min >= full.quant_min && *o.quant_max <= full.quant_max,
                 "[Observer] the range [{}, {}] must be non-empty and inside [{}, {}] of {}", *o.quant_min,
                 *o.quant_max, full.quant_min, full.quant_max, o.dtype);
    r = {*o.quant_min, *o.quant_max};
  }
  return r;
}

}  // namespace

Observer::Observer(ObserverOptions options, bool per_channel, int64_t num_channels)
    : options_(std::move(options)), range_(observer_range(options_)) {
  STRATA_CHECK(is_per_channel(options_.qscheme) == per_channel, "[Observer] this observer needs a {} qscheme",
               per_channel ? "per-channel" : "per-tensor");
  STRATA_CHECK(options_.eps > 0 && options_.averaging_constant > 0 && options_.averaging_constant <= 1,
               "[Observer] eps must be positive and averaging_constant in (0, 1], got {} and {}", options_.eps,
               options_.averaging_constant);
  STRATA_CHECK(num_channels >= 0 && options_.ch_axis >= 0, "[Observer] num_channels ({}) and ch_axis ({}) must be "
               "non-negative", num_channels, options_.ch_axis);
  const Shape shape = per_channel ? Shape{num_channels} : Shape{};
  // never observed: [+inf, -inf], as PyTorch's buffers start
  min_val = register_buffer("min_val", full(shape, std::numeric_limits<float>::infinity()));
  max_val = register_buffer("max_val", full(shape, -std::numeric_limits<float>::infinity()));
}

bool Observer::observed() const {
  NoGradGuard no_grad;
  return min_val.numel() > 0 && le(min_val, max_val).all().item<bool>();
}

int64_t Observer::checked_axis(const Tensor& x) const {
  STRATA_CHECK(x.defined() && is_floating(x.dtype()), "[{}] observes floating tensors, got {}", name(),
               x.defined() ? fmt::format("{}", x.dtype()) : std::string("an undefined tensor"));
  const int64_t axis = per_channel() ? options_.ch_axis : -1;
  STRATA_CHECK(axis < x.dim(), "[{}] ch_axis {} is out of range for an input of shape {}", name(), axis, x.shape());
  return axis;
}

std::pair<Tensor, Tensor> Observer::batch_range(const Tensor& x) const {
  const int64_t axis = checked_axis(x);
  NoGradGuard no_grad;
  return finite_aminmax(x, axis);
}

Tensor Observer::forward(const Tensor& x) {
  NoGradGuard no_grad;
  auto [lo, hi] = batch_range(x);
  if (per_channel() && min_val.shape() != lo.shape()) {
    STRATA_CHECK(min_val.numel() == 0, "[{}] observed {} channels, then an input of shape {} with {} along ch_axis "
                 "{}", name(), min_val.numel(), x.shape(), lo.numel(), options_.ch_axis);
    set_tensor("min_val", full(lo.shape(), std::numeric_limits<float>::infinity(), TensorOptions(lo.device())));
    set_tensor("max_val", full(lo.shape(), -std::numeric_limits<float>::infinity(), TensorOptions(lo.device())));
  }
  update(lo.to(min_val.device()), hi.to(min_val.device()));
  return x;
}

std::pair<Tensor, Tensor> Observer::calculate_qparams() const {
  return quant::calculate_qparams(min_val, max_val, range_, is_symmetric(options_.qscheme), options_.eps);
}

MinMaxObserver::MinMaxObserver(ObserverOptions options) : Observer(std::move(options), false, 0) {}

void MinMaxObserver::update(const Tensor& batch_min, const Tensor& batch_max) {
  min_val.copy_(minimum(min_val, batch_min));
  max_val.copy_(maximum(max_val, batch_max));
}

MovingAverageMinMaxObserver::MovingAverageMinMaxObserver(ObserverOptions options)
    : Observer(std::move(options), false, 0) {}

void MovingAverageMinMaxObserver::update(const Tensor& batch_min, const Tensor& batch_max) {
  if (!observed()) {
    min_val.copy_(batch_min);
    max_val.copy_(batch_max);
    return;
  }
  const double c = options().averaging_constant;
  min_val.copy_(min_val + (batch_min - min_val) * c);
  max_val.copy_(max_val + (batch_max - max_val) * c);
}

PerChannelMinMaxObserver::PerChannelMinMaxObserver(ObserverOptions options, int64_t num_channels)
    : MinMaxObserver(std::move(options), true, num_channels) {}

MovingAveragePerChannelMinMaxObserver::MovingAveragePerChannelMinMaxObserver(ObserverOptions options,
                                                                             int64_t num_channels)
    : MovingAverageMinMaxObserver(std::move(options), true, num_channels) {}

}  // namespace strata::quant
