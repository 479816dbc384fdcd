// SGD: option checks, the per-parameter CPU update (kernels/cpu/optim.h) and the batched
// CUDA update (optim/cuda_update.h).
#include <strata/optim/sgd.hpp>

#include "kernels/cpu/optim.h"
#include "optim/cuda_update.h"
#include "optim/update_util.h"

namespace strata::optim {

void validate_options(const SGDOptions& o) {
  detail::check_nonneg("SGD", "lr", o.lr);
  detail::check_nonneg("SGD", "momentum", o.momentum);
  detail::check_nonneg("SGD", "weight_decay", o.weight_decay);
  STRATA_CHECK(std::isfinite(o.dampening), "[SGD] invalid dampening: {}", o.dampening);
  STRATA_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
               "[SGD] nesterov momentum needs momentum > 0 and dampening = 0 (got momentum {}, dampening {})",
               o.momentum, o.dampening);
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : OptimizerFor("SGD", {Group{std::move(params), options}}, options) {}

SGD::SGD(std::vector<Group> groups, SGDOptions defaults) : OptimizerFor("SGD", std::move(groups), defaults) {}

std::vector<StateSpec> SGD::state_specs(size_t, const Tensor& p) const {
  return {{"momentum_buffer", p.shape(), p.dtype(), false}};
}

namespace {
math::SgdConsts<double> sgd_consts(const SGDOptions& o) {
  return {o.lr, o.momentum, 1 - o.dampening, o.weight_decay, o.nesterov, o.maximize};
}
}  // namespace

void SGD::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const SGDOptions& o = param_groups()[g].options;
  ++st.step;
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const math::SgdConsts<double> c = sgd_consts(o);
    T* pp = detail::ptr<T>(p);
    const T* gp = detail::ptr<T>(grad);
    if (o.momentum == 0) {
      cpu::sgd_step(pp, gp, p.numel(), c);
      return;
    }
    bool first = !st.tensors.count("momentum_buffer");
    Tensor& buf = detail::state_tensor(st, "momentum_buffer", p);
    cpu::sgd_momentum_step(pp, gp, detail::ptr<T>(buf), first, p.numel(), c);
  });
}

void SGD::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  const SGDOptions& o = param_groups()[g].options;
  std::vector<cuda_update::SgdItem> items;
  // Captured in a CUDA graph, the step counts advance at each replay (Note [Graph replay slots])
  const bool captured = !batch.empty() && cuda_update::capturing(batch[0].param);
  if (captured) {
    std::vector<ParamState*> states;
    for (const ParamUpdate& u : batch) {
      if (o.momentum != 0) cuda_update::check_states_exist(*u.state, {"momentum_buffer"}, "SGD");
      states.push_back(u.state);
    }
    cuda_update::replay_slot(batch[0].param, 0, [states](double*) {
      for (ParamState* st : states) ++st->step;
    }, "SGD");
  }
  for (const ParamUpdate& u : batch) {
    if (!captured) ++u.state->step;
    if (o.momentum == 0) {
      items.push_back({u.param, u.grad, Tensor(), false});
      continue;
    }
    const bool first = !u.state->tensors.count("momentum_buffer");
    items.push_back({u.param, u.grad, detail::state_tensor(*u.state, "momentum_buffer", u.param), first});
  }
  cuda_update::sgd(items, sgd_consts(o));
}

}  // namespace strata::optim
