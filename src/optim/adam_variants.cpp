// NAdam, RAdam and Adamax: option checks and per-element updates, computed in double and
// stored in the parameter's dtype (the rules are written out in adam_variants.hpp). CUDA
// parameters go through host copies (detail::update_on_host).
#include <strata/optim/adam_variants.hpp>

#include <algorithm>
#include <cmath>

#include "optim/update_util.h"

namespace strata::optim {

namespace {

template <class Options>
void check_adam_like(const char* opt, const Options& o) {
  detail::check_nonneg(opt, "lr", o.lr);
  detail::check_beta(opt, "beta1", o.betas[0]);
  detail::check_beta(opt, "beta2", o.betas[1]);
  detail::check_nonneg(opt, "eps", o.eps);
  detail::check_nonneg(opt, "weight_decay", o.weight_decay);
}

// NAdam's momentum coefficient mu_t
double nadam_mu(const NAdamOptions& o, int64_t t) {
  return o.betas[0] * (1 - 0.5 * std::pow(0.96, static_cast<double>(t) * o.momentum_decay));
}

}  // namespace

void validate_options(const NAdamOptions& o) {
  check_adam_like("NAdam", o);
  detail::check_nonneg("NAdam", "momentum_decay", o.momentum_decay);
}
void validate_options(const RAdamOptions& o) { check_adam_like("RAdam", o); }
void validate_options(const AdamaxOptions& o) { check_adam_like("Adamax", o); }

// ---- NAdam ------------------------------------------------------------------------------

NAdam::NAdam(std::vector<Tensor> params, NAdamOptions options)
    : OptimizerFor("NAdam", {Group{std::move(params), options}}, options) {}
NAdam::NAdam(std::vector<Group> groups, NAdamOptions defaults) : OptimizerFor("NAdam", std::move(groups), defaults) {}

std::vector<StateSpec> NAdam::state_specs(size_t, const Tensor& p) const {
  return {{"exp_avg", p.shape(), p.dtype()}, {"exp_avg_sq", p.shape(), p.dtype()}, {"mu_product", Shape{}, kFloat64}};
}

void NAdam::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const NAdamOptions& o = param_groups()[g].options;
  ++st.step;
  Tensor& m = detail::state_tensor(st, "exp_avg", p);
  Tensor& v = detail::state_tensor(st, "exp_avg_sq", p);
  // the product of the mu_t so far, kept in float64 whatever the parameter's dtype
  auto it = st.tensors.find("mu_product");
  if (it == st.tensors.end()) it = st.tensors.emplace("mu_product", full(Shape{}, 1.0, TensorOptions(kFloat64))).first;
  double& prod = *detail::ptr<double>(it->second);
  const double b1 = o.betas[0], b2 = o.betas[1];
  const double mu = nadam_mu(o, st.step), mu_next = nadam_mu(o, st.step + 1);
  prod *= mu;
  const double bc2 = 1 - std::pow(b2, static_cast<double>(st.step));
  const double grad_coef = o.lr * (1 - mu) / (1 - prod), avg_coef = o.lr * mu_next / (1 - prod * mu_next);
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* mp = detail::ptr<T>(m);
    T* vp = detail::ptr<T>(v);
    detail::for_each_element<T>(p, grad, o.maximize, o.lr, o.weight_decay, o.decoupled_weight_decay,
                        [&](int64_t i, double& pi, double gi) {
                          const double mi = b1 * mp[i] + (1 - b1) * gi, vi = b2 * vp[i] + (1 - b2) * gi * gi;
                          const double d = std::sqrt(vi / bc2) + o.eps;
                          pi -= grad_coef * gi / d + avg_coef * mi / d;
                          mp[i] = static_cast<T>(mi), vp[i] = static_cast<T>(vi);
                        });
  });
}

void NAdam::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  detail::update_on_host(batch, [&](const Tensor& p, const Tensor& grad, ParamState& st) { update(g, p, grad, st); });
}

// ---- RAdam ------------------------------------------------------------------------------

RAdam::RAdam(std::vector<Tensor> params, RAdamOptions options)
    : OptimizerFor("RAdam", {Group{std::move(params), options}}, options) {}
RAdam::RAdam(std::vector<Group> groups, RAdamOptions defaults) : OptimizerFor("RAdam", std::move(groups), defaults) {}

std::vector<StateSpec> RAdam::state_specs(size_t, const Tensor& p) const {
  return {{"exp_avg", p.shape(), p.dtype()}, {"exp_avg_sq", p.shape(), p.dtype()}};
}

void RAdam::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const RAdamOptions& o = param_groups()[g].options;
  ++st.step;
  Tensor& m = detail::state_tensor(st, "exp_avg", p);
  Tensor& v = detail::state_tensor(st, "exp_avg_sq", p);
  const double b1 = o.betas[0], b2 = o.betas[1], t = static_cast<double>(st.step);
  const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
  const double rho_inf = 2 / (1 - b2) - 1, rho_t = rho_inf - 2 * t * std::pow(b2, t) / bc2;
  // the variance of the adaptive lr is tractable only past rho_t = 5: before, plain momentum SGD
  const bool rectify = rho_t > 5;
  const double rect =
      rectify ? std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) : 0;
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* mp = detail::ptr<T>(m);
    T* vp = detail::ptr<T>(v);
    detail::for_each_element<T>(p, grad, o.maximize, o.lr, o.weight_decay, o.decoupled_weight_decay,
                        [&](int64_t i, double& pi, double gi) {
                          const double mi = b1 * mp[i] + (1 - b1) * gi, vi = b2 * vp[i] + (1 - b2) * gi * gi;
                          const double m_hat = mi / bc1;
                          if (rectify) pi -= o.lr * m_hat * rect * std::sqrt(bc2) / (std::sqrt(vi) + o.eps);
                          else pi -= o.lr * m_hat;
                          mp[i] = static_cast<T>(mi), vp[i] = static_cast<T>(vi);
                        });
  });
}

void RAdam::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  detail::update_on_host(batch, [&](const Tensor& p, const Tensor& grad, ParamState& st) { update(g, p, grad, st); });
}

// ---- Adamax -----------------------------------------------------------------------------

Adamax::Adamax(std::vector<Tensor> params, AdamaxOptions options)
    : OptimizerFor("Adamax", {Group{std::move(params), options}}, options) {}
Adamax::Adamax(std::vector<Group> groups, AdamaxOptions defaults)
    : OptimizerFor("Adamax", std::move(groups), defaults) {}

std::vector<StateSpec> Adamax::state_specs(size_t, const Tensor& p) const {
  return {{"exp_avg", p.shape(), p.dtype()}, {"exp_inf", p.shape(), p.dtype()}};
}

void Adamax::update(size_t g, const Tensor& p, const Tensor& grad, ParamState& st) {
  const AdamaxOptions& o = param_groups()[g].options;
  ++st.step;
  Tensor& m = detail::state_tensor(st, "exp_avg", p);
  Tensor& u = detail::state_tensor(st, "exp_inf", p);
  const double b1 = o.betas[0], b2 = o.betas[1];
  const double clr = o.lr / (1 - std::pow(b1, static_cast<double>(st.step)));
  detail::dispatch_param(p.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* mp = detail::ptr<T>(m);
    T* up = detail::ptr<T>(u);
    auto step = [&](int64_t i, double& pi, double gi) {
      const double mi = b1 * mp[i] + (1 - b1) * gi, ui = std::max(b2 * up[i], std::abs(gi) + o.eps);
      pi -= clr * mi / ui;
      mp[i] = static_cast<T>(mi), up[i] = static_cast<T>(ui);
    };
    detail::for_each_element<T>(p, grad, o.maximize, o.lr, o.weight_decay, /*decoupled=*/false, step);
  });
}

void Adamax::update_cuda(size_t g, const std::vector<ParamUpdate>& batch) {
  detail::update_on_host(batch, [&](const Tensor& p, const Tensor& grad, ParamState& st) { update(g, p, grad, st); });
}

}  // namespace strata::optim
