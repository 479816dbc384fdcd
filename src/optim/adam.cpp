// Adam and AdamW: one update routine, with the weight decay either added to the gradient
// (Adam) or applied to the weights (AdamW); per parameter on the CPU, batched on CUDA.
#include <strata/optim/adam.hpp>

#include <cmath>

#include "kernels/cpu/optim.h"
#include "optim/adam_consts.h"
#include "optim/cuda_update.h"
#include "optim/update_util.h"

namespace strata::optim {

namespace {

template <class O>
void validate_adam(const char* name, const O& o) {
  detail::check_nonneg(name, "lr", o.lr);
  detail::check_nonneg(name, "eps", o.eps);
  detail::check_beta(name, "beta1 (betas[0])", o.betas[0]);
  detail::check_beta(name, "beta2 (betas[1])", o.betas[1]);
  detail::check_nonneg(name, "weight_decay", o.weight_decay);
}

template <class O>
std::vector<StateSpec> adam_specs(const O& o, const Tensor& p) {
  std::vector<StateSpec> s{{"exp_avg", p.shape(), p.dtype()}, {"exp_avg_sq", p.shape(), p.dtype()}};
  // absent when amsgrad was switched on after steps: the next step creates it (Note [Option changes])
  if (o.amsgrad) s.push_back({"max_exp_avg_sq", p.shape(), p.dtype(), false});
  return s;
}

template <class O>
void adam_update(const O& o, bool decoupled, const Tensor& p, const Tensor& grad, ParamState& st) {
  ++st.step;
  Tensor& m = detail::state_tensor(st, "exp_avg", p);
  Tensor& v = detail::state_tensor(st, "exp_avg_sq", p);
  Tensor* vmax = o.amsgrad ? &detail::state_tensor(st, "max_exp_avg_sq", p) : nullptr;
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto c = detail::adam_consts<double>(o.lr, o.betas, o.eps, o.weight_decay, decoupled, o.maximize, st.step);
    cpu::adam_step(detail::ptr<T>(p), detail::ptr<T>(grad), detail::ptr<T>(m), detail::ptr<T>(v),
                   vmax ? detail::ptr<T>(*vmax) : nullptr, p.numel(), c);
  });
}

// The items of a CUDA batch, with each parameter's step and states advanced as update does.
// Captured in a CUDA graph, the step counts advance at each replay instead, and the bias
// corrections and the decay, computed from the group's options at replay time (so a learning
// rate schedule applies), reach the kernel through a replay slot (Note [Graph replay slots]).
// `options()` gives the group's current options.
template <class Get>
void adam_update_cuda(Get options, bool decoupled, const std::vector<ParamUpdate>& batch) {
  if (batch.empty()) return;
  const auto& o = options();
  const char* name = decoupled ? "AdamW" : "Adam";
  const bool captured = cuda_update::capturing(batch[0].param);
  std::vector<cuda_update::AdamItem> items;
  std::vector<ParamState*> states;
  for (const ParamUpdate& u : batch) {
    ParamState& st = *u.state;
    if (captured) {
      cuda_update::check_states_exist(st, {"exp_avg", "exp_avg_sq"}, name);
      if (o.amsgrad) cuda_update::check_states_exist(st, {"max_exp_avg_sq"}, name);
    }
    const int64_t step = captured ? st.step + 1 : ++st.step;
    auto c = detail::adam_consts<double>(o.lr, o.betas, o.eps, o.weight_decay, decoupled, o.maximize, step);
    Tensor& m = detail::state_tensor(st, "exp_avg", u.param);
    Tensor& v = detail::state_tensor(st, "exp_avg_sq", u.param);
    Tensor vmax = o.amsgrad ? detail::state_tensor(st, "max_exp_avg_sq", u.param) : Tensor();
    items.push_back({u.param, u.grad, m, v, vmax, c.step_size, c.bc2_sqrt});
    if (captured) states.push_back(&st);
  }
  if (captured) {
    const double* corrections = cuda_update::replay_slot(
        batch[0].param, 3 * items.size(),
        [options, decoupled, states](double* out) {
          const auto& now = options();
          for (size_t i = 0; i < states.size(); ++i) {
            const int64_t step = ++states[i]->step;
            auto c = detail::adam_consts<double>(now.lr, now.betas, now.eps, now.weight_decay, decoupled,
                                                 now.maximize, step);
            out[3 * i] = c.step_size;
            out[3 * i + 1] = c.bc2_sqrt;
            out[3 * i + 2] = c.decay;
          }
        },
        name);
    for (size_t i = 0; i < items.size(); ++i) items[i].corrections = corrections + 3 * i;
  }
  // the group's constants; step_size and bc2_sqrt come from each item
  cuda_update::adam(items,
                    detail::adam_consts<double>(o.lr, o.betas, o.eps, o.weight_decay, decoupled, o.maximize, 1));
}

}  // namespace

void validate_options(const AdamOptions& o) { validate_adam("Adam", o); }
void validate_options(const AdamWOptions& o) { validate_adam("AdamW", o); }

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : OptimizerFor("Adam", {Group{std::move(params), options}}, options) {}
Adam::Adam(std::vector<Group> groups, AdamOptions defaults) : OptimizerFor("Adam", std::move(groups), defaults) {}

std::vector<StateSpec> Adam::state_specs(size_t g, const Tensor& p) const {
  return adam_specs(param_groups()[g].options, p);
}
void Adam::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  adam_update(param_groups()[g].options, false, p, grad, st);
}
void Adam::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  adam_update_cuda([this, g]() -> const AdamOptions& { return param_groups()[g].options; }, false, batch);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : OptimizerFor("AdamW", {Group{std::move(params), options}}, options) {}
AdamW::AdamW(std::vector<Group> groups, AdamWOptions defaults)
    : OptimizerFor("AdamW", std::move(groups), defaults) {}

std::vector<StateSpec> AdamW::state_specs(size_t g, const Tensor& p) const {
  return adam_specs(param_groups()[g].options, p);
}
void AdamW::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  adam_update(param_groups()[g].options, true, p, grad, st);
}
void AdamW::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  adam_update_cuda([this, g]() -> const AdamWOptions& { return param_groups()[g].options; }, true, batch);
}

}  // namespace strata::optim
