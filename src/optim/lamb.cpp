// LAMB: pass 1 updates the moments and sums ||p||^2 and ||u||^2; the trust ratio follows;
// pass 2 applies lr * ratio * u. On the CPU per parameter (kernels/cpu/optim.h), the ratio
// on the host; on CUDA for a batch of parameters, the ratios on the device (no host sync).
#include <strata/optim/lamb.hpp>

#include <array>
#include <cmath>

#include "kernels/cpu/optim.h"
#include "optim/cuda_update.h"
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
  if (it == trust_.end()) return 1.0;
  const TrustRatio& r = it->second;
  if (!r.on_device.defined()) return r.value;
  return r.on_device.slice(0, r.index, r.index + 1).item_scalar().to_double();
}

namespace {
// Bias corrections of step t: 1 - beta^t, or 1 without bias correction.
std::array<double, 2> lamb_corrections(const LAMBOptions& o, int64_t step) {
  const double t = static_cast<double>(step);
  if (!o.bias_correction) return {1.0, 1.0};
  return {1 - std::pow(o.betas[0], t), 1 - std::pow(o.betas[1], t)};
}

math::LambConsts<double> lamb_consts(const LAMBOptions& o, const std::array<double, 2>& bc) {
  return {o.betas[0], o.betas[1], 1 - o.betas[0], 1 - o.betas[1], o.eps, o.weight_decay, bc[0], bc[1], o.maximize};
}
}  // namespace

std::vector<StateSpec> LAMB::state_specs(size_t, const Tensor& p) const {
  return {{"exp_avg", p.shape(), p.dtype()}, {"exp_avg_sq", p.shape(), p.dtype()}};
}

void LAMB::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const LAMBOptions& o = param_groups()[g].options;
  ++st.step;
  Tensor& m = detail::state_tensor(st, "exp_avg", p);
  Tensor& v = detail::state_tensor(st, "exp_avg_sq", p);
  const math::LambConsts<double> c = lamb_consts(o, lamb_corrections(o, st.step));
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T *pp = detail::ptr<T>(p), *mp = detail::ptr<T>(m), *vp = detail::ptr<T>(v);
    double p_sq = 0, u_sq = 0;
    cpu::lamb_moments_and_norms(pp, detail::ptr<T>(grad), mp, vp, p.numel(), c, p_sq, u_sq);
    double ratio = math::lamb_trust_ratio(std::sqrt(p_sq), std::sqrt(u_sq), o.clamp_min, o.clamp_max);
    trust_[p.impl_ptr().get()] = TrustRatio{ratio, Tensor(), 0};
    cpu::lamb_apply(pp, mp, vp, p.numel(), o.lr * ratio, c);
  });
}

void LAMB::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  if (!batch.empty()) cuda_update::check_step_not_captured(batch[0].param, "LAMB");
  const LAMBOptions& o = param_groups()[g].options;
  std::vector<cuda_update::LambItem> items;
  for (const ParamUpdate& u : batch) {
    ParamState& st = *u.state;
    ++st.step;
    const std::array<double, 2> bc = lamb_corrections(o, st.step);
    Tensor& m = detail::state_tensor(st, "exp_avg", u.param);
    Tensor& v = detail::state_tensor(st, "exp_avg_sq", u.param);
    items.push_back({u.param, u.grad, m, v, bc[0], bc[1]});
  }
  // the group's constants; the bias corrections come from each item
  Tensor ratios = cuda_update::lamb(items, lamb_consts(o, {1.0, 1.0}), o.lr, o.clamp_min, o.clamp_max);
  for (size_t i = 0; i < batch.size(); ++i)
    trust_[batch[i].param.impl_ptr().get()] = TrustRatio{1.0, ratios, static_cast<int64_t>(i)};
}

}  // namespace strata::optim
