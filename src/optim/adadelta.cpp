// Adadelta: option checks and the per-element update (the rule is in adadelta.hpp), computed in
// double and stored in the parameter's dtype; CUDA parameters go through host copies.
#include <strata/optim/adadelta.hpp>

#include <cmath>

#include "optim/update_util.h"

namespace strata::optim {

void validate_options(const AdadeltaOptions& o) {
  detail::check_nonneg("Adadelta", "lr", o.lr);
  STRATA_CHECK(o.rho >= 0 && o.rho <= 1, "[Adadelta] invalid rho: {} (must be in [0, 1])", o.rho);
  detail::check_nonneg("Adadelta", "eps", o.eps);
  detail::check_nonneg("Adadelta", "weight_decay", o.weight_decay);
}

Adadelta::Adadelta(std::vector<Tensor> params, AdadeltaOptions options)
    : OptimizerFor("Adadelta", {Group{std::move(params), options}}, options) {}
Adadelta::Adadelta(std::vector<Group> groups, AdadeltaOptions defaults)
    : OptimizerFor("Adadelta", std::move(groups), defaults) {}

std::vector<StateSpec> Adadelta::state_specs(size_t, const Tensor& p) const {
  return {{"square_avg", p.shape(), p.dtype()}, {"acc_delta", p.shape(), p.dtype()}};
}

void Adadelta::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const AdadeltaOptions& o = param_groups()[g].options;
  ++st.step;
  Tensor& s = detail::state_tensor(st, "square_avg", p);
  Tensor& a = detail::state_tensor(st, "acc_delta", p);
  const double rho = o.rho;
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* sp = detail::ptr<T>(s);
    T* ap = detail::ptr<T>(a);
    auto step = [&](int64_t i, double& pi, double gi) {
      const double si = rho * sp[i] + (1 - rho) * gi * gi;
      const double d = std::sqrt(static_cast<double>(ap[i]) + o.eps) / std::sqrt(si + o.eps) * gi;
      ap[i] = static_cast<T>(rho * ap[i] + (1 - rho) * d * d);
      sp[i] = static_cast<T>(si);
      pi -= o.lr * d;
    };
    detail::for_each_element<T>(p, grad, o.maximize, o.lr, o.weight_decay, /*decoupled=*/false, step);
  });
}

void Adadelta::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  detail::update_on_host(batch, [&](const Tensor& p, const Tensor& grad, ParamState& st) { update(g, p, grad, st); });
}

}  // namespace strata::optim
