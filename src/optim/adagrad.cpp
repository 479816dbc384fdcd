// Adagrad and RMSprop: option checks, per-parameter CPU updates (kernels/cpu/optim.h) and
// batched CUDA updates (optim/cuda_update.h).
#include <strata/optim/adagrad.hpp>
#include <strata/optim/rmsprop.hpp>

#include "kernels/cpu/optim.h"
#include "optim/cuda_update.h"
#include "optim/update_util.h"

namespace strata::optim {

void validate_options(const AdagradOptions& o) {
  detail::check_nonneg("Adagrad", "lr", o.lr);
  detail::check_nonneg("Adagrad", "lr_decay", o.lr_decay);
  detail::check_nonneg("Adagrad", "weight_decay", o.weight_decay);
  detail::check_nonneg("Adagrad", "initial_accumulator_value", o.initial_accumulator_value);
  detail::check_nonneg("Adagrad", "eps", o.eps);
}

Adagrad::Adagrad(std::vector<Tensor> params, AdagradOptions options)
    : OptimizerFor("Adagrad", {Group{std::move(params), options}}, options) {}
Adagrad::Adagrad(std::vector<Group> groups, AdagradOptions defaults)
    : OptimizerFor("Adagrad", std::move(groups), defaults) {}

std::vector<StateSpec> Adagrad::state_specs(size_t, const Tensor& p) const {
  return {{"sum", p.shape(), p.dtype()}};
}

namespace {
// lr / (1 + (t - 1) * lr_decay) at step t
double adagrad_lr(const AdagradOptions& o, int64_t step) {
  return o.lr / (1 + static_cast<double>(step - 1) * o.lr_decay);
}
}  // namespace

void Adagrad::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const AdagradOptions& o = param_groups()[g].options;
  ++st.step;
  Tensor& sum = detail::state_tensor(st, "sum", p, o.initial_accumulator_value);
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    math::AdagradConsts<double> c{adagrad_lr(o, st.step), o.weight_decay, o.eps, o.maximize};
    cpu::adagrad_step(detail::ptr<T>(p), detail::ptr<T>(grad), detail::ptr<T>(sum), p.numel(), c);
  });
}

void Adagrad::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  const AdagradOptions& o = param_groups()[g].options;
  if (!batch.empty()) cuda_update::check_step_not_captured(batch[0].param, "Adagrad");
  std::vector<cuda_update::AdagradItem> items;
  for (const ParamUpdate& u : batch) {
    ++u.state->step;
    Tensor& sum = detail::state_tensor(*u.state, "sum", u.param, o.initial_accumulator_value);
    items.push_back({u.param, u.grad, sum, adagrad_lr(o, u.state->step)});
  }
  // clr comes from each item
  cuda_update::adagrad(items, math::AdagradConsts<double>{o.lr, o.weight_decay, o.eps, o.maximize});
}

namespace {
math::RmspropConsts<double> rmsprop_consts(const RMSpropOptions& o) {
  return {o.lr, o.alpha, 1 - o.alpha, o.eps, o.weight_decay, o.momentum, o.maximize};
}
}  // namespace

void validate_options(const RMSpropOptions& o) {
  detail::check_nonneg("RMSprop", "lr", o.lr);
  detail::check_nonneg("RMSprop", "alpha", o.alpha);
  detail::check_nonneg("RMSprop", "eps", o.eps);
  detail::check_nonneg("RMSprop", "weight_decay", o.weight_decay);
  detail::check_nonneg("RMSprop", "momentum", o.momentum);
}

RMSprop::RMSprop(std::vector<Tensor> params, RMSpropOptions options)
    : OptimizerFor("RMSprop", {Group{std::move(params), options}}, options) {}
RMSprop::RMSprop(std::vector<Group> groups, RMSpropOptions defaults)
    : OptimizerFor("RMSprop", std::move(groups), defaults) {}

std::vector<StateSpec> RMSprop::state_specs(size_t g, const Tensor& p) const {
  const RMSpropOptions& o = param_groups()[g].options;
  std::vector<StateSpec> s{{"square_avg", p.shape(), p.dtype()}};
  // absent when the option was switched on after steps: the next step creates them
  if (o.centered) s.push_back({"grad_avg", p.shape(), p.dtype(), false});
  if (o.momentum > 0) s.push_back({"momentum_buffer", p.shape(), p.dtype(), false});
  return s;
}

void RMSprop::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const RMSpropOptions& o = param_groups()[g].options;
  ++st.step;
  Tensor& sq = detail::state_tensor(st, "square_avg", p);
  Tensor* gavg = o.centered ? &detail::state_tensor(st, "grad_avg", p) : nullptr;
  Tensor* buf = o.momentum > 0 ? &detail::state_tensor(st, "momentum_buffer", p) : nullptr;
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cpu::rmsprop_step(detail::ptr<T>(p), detail::ptr<T>(grad), detail::ptr<T>(sq),
                      gavg ? detail::ptr<T>(*gavg) : nullptr, buf ? detail::ptr<T>(*buf) : nullptr, p.numel(),
                      rmsprop_consts(o));
  });
}

void RMSprop::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  const RMSpropOptions& o = param_groups()[g].options;
  if (!batch.empty()) cuda_update::check_step_not_captured(batch[0].param, "RMSprop");
  std::vector<cuda_update::RmspropItem> items;
  for (const ParamUpdate& u : batch) {
    ParamState& st = *u.state;
    ++st.step;
    Tensor& sq = detail::state_tensor(st, "square_avg", u.param);
    Tensor gavg = o.centered ? detail::state_tensor(st, "grad_avg", u.param) : Tensor();
    Tensor buf = o.momentum > 0 ? detail::state_tensor(st, "momentum_buffer", u.param) : Tensor();
    items.push_back({u.param, u.grad, sq, gavg, buf});
  }
  cuda_update::rmsprop(items, rmsprop_consts(o));
}

}  // namespace strata::optim
