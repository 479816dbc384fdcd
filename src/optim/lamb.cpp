// LAMB: pass 1 updates the moments and sums ||p||^2 and ||u||^2; the trust ratio follows on
// the host; pass 2 applies lr * ratio * u (kernels/cpu/optim.h).
#include <strata/optim/lamb.hpp>

#include <cmath>

#include "kernels/cpu/optim.h"
#include "optim/update_util.h"

namespace strata::optim {

void validate_options(const LAMBOptions& o) {
  detail::check_nonneg("LAMB", "lr", o.lr);
  detail::check_nonneg("LAMB", "eps", o.eps);
  detail::check_beta("LAMB", "beta1 (betas[0])", o.betas[0]);
  detail::check_beta("LAMB", "beta2 (betas[1])", o.betas[1]);
  detail::check_nonneg("LAMB", "weight_decay", o.weight_decay);
  detail::check_nonneg("LAMB", "clamp_min", o.clamp_min);
  STRATA_CHECK(o.clamp_max >= o.clamp_min, "[LAMB] invalid clamp range [{}, {}]", o.clamp_min, o.clamp_max);
}

LAMB::LAMB(std::vector<Tensor> params, LAMBOptions options)
    : OptimizerFor("LAMB", {Group{std::move(params), options}}, options) {}
LAMB::LAMB(std::vector<Group> groups, LAMBOptions defaults) : OptimizerFor("LAMB", std::move(groups), defaults) {}

double LAMB::last_trust_ratio(const Tensor& param) const {
  auto it = param.defined() ? trust_.find(param.impl_ptr().get()) : trust_.end();
  return it == trust_.end() ? 1.0 : it->second;
}

std::vector<StateSpec> LAMB::state_specs(size_t, const Tensor& p) const {
  return {{"exp_avg", p.shape(), p.dtype()}, {"exp_avg_sq", p.shape(), p.dtype()}};
}

void LAMB::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const LAMBOptions& o = param_groups()[g].options;
  ++st.step;
  Tensor& m = detail::state_tensor(st, "exp_avg", p);
  Tensor& v = detail::state_tensor(st, "exp_avg_sq", p);
  const double t = static_cast<double>(st.step);
  const double bc1 = o.bias_correction ? 1 - std::pow(o.betas[0], t) : 1.0;
  const double bc2 = o.bias_correction ? 1 - std::pow(o.betas[1], t) : 1.0;
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    math::LambConsts<double> c{o.betas[0], o.betas[1], 1 - o.betas[0], 1 - o.betas[1], o.eps, o.weight_decay, bc1, bc2, o.maximize};
    T *pp = detail::ptr<T>(p), *mp = detail::ptr<T>(m), *vp = detail::ptr<T>(v);
    double p_sq = 0, u_sq = 0;
    cpu::lamb_moments_and_norms(pp, detail::ptr<T>(grad), mp, vp, p.numel(), c, p_sq, u_sq);
    double ratio = math::lamb_trust_ratio(std::sqrt(p_sq), std::sqrt(u_sq), o.clamp_min, o.clamp_max);
    trust_[p.impl_ptr().get()] = ratio;
    cpu::lamb_apply(pp, mp, vp, p.numel(), o.lr * ratio, c);
  });
}

}  // namespace strata::optim
