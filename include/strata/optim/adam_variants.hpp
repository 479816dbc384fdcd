// NAdam, RAdam and Adamax, as torch.optim.NAdam / RAdam / Adamax. With g = grad (negated when
// maximize), t the parameter's step count, and weight decay either an L2 term g += wd * p or,
// where decoupled_weight_decay is set, p = p * (1 - lr * wd) before the update:
//
// NAdam (Dozat 2016), mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)):
//   m = beta1 * m + (1 - beta1) * g,  v = beta2 * v + (1 - beta2) * g^2,  P = P * mu_t (P_0 = 1)
//   d = sqrt(v / (1 - beta2^t)) + eps
//   p = p - lr * (1 - mu_t) / (1 - P) * g / d - lr * mu_{t+1} / (1 - P * mu_{t+1}) * m / d
// RAdam (Liu et al. 2020), rho_inf = 2 / (1 - beta2) - 1, rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t):
//   m, v as Adam;  m_hat = m / (1 - beta1^t)
//   rho_t > 5:  r = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
//               p = p - lr * m_hat * r * sqrt(1 - beta2^t) / (sqrt(v) + eps)
//   otherwise:  p = p - lr * m_hat
// Adamax (Kingma & Ba 2015, section 7), always L2 weight decay:
//   m = beta1 * m + (1 - beta1) * g,  u = max(beta2 * u, |g| + eps)
//   p = p - lr / (1 - beta1^t) * m / u
// State per parameter: "exp_avg", "exp_avg_sq" and NAdam's "mu_product" (a float64 scalar
// tensor); Adamax's "exp_avg", "exp_inf".
//
// The updates are per-element CPU loops; a CUDA parameter is updated through host copies of
// it, its grad and its state (correct, but not a fused device kernel).
#pragma once

#include <array>

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct NAdamOptions {
  double lr = 2e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum_decay = 4e-3;
  bool decoupled_weight_decay = false;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("beta1", o.betas[0]), f("beta2", o.betas[1]), f("eps", o.eps);
    f("weight_decay", o.weight_decay), f("momentum_decay", o.momentum_decay);
    f("decoupled_weight_decay", o.decoupled_weight_decay), f("maximize", o.maximize);
  }
};

struct RAdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool decoupled_weight_decay = false;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("beta1", o.betas[0]), f("beta2", o.betas[1]), f("eps", o.eps);
    f("weight_decay", o.weight_decay), f("decoupled_weight_decay", o.decoupled_weight_decay);
    f("maximize", o.maximize);
  }
};

struct AdamaxOptions {
  double lr = 2e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("beta1", o.betas[0]), f("beta2", o.betas[1]), f("eps", o.eps);
    f("weight_decay", o.weight_decay), f("maximize", o.maximize);
  }
};

/// Raise Error for lr, eps, weight_decay (NAdam: momentum_decay) < 0 or a beta outside [0, 1).
STRATA_API void validate_options(const NAdamOptions& o);
STRATA_API void validate_options(const RAdamOptions& o);
STRATA_API void validate_options(const AdamaxOptions& o);

class STRATA_API NAdam : public OptimizerFor<NAdamOptions> {
 public:
  explicit NAdam(std::vector<Tensor> params, NAdamOptions options = {});
  explicit NAdam(std::vector<Group> groups, NAdamOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

class STRATA_API RAdam : public OptimizerFor<RAdamOptions> {
 public:
  explicit RAdam(std::vector<Tensor> params, RAdamOptions options = {});
  explicit RAdam(std::vector<Group> groups, RAdamOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

class STRATA_API Adamax : public OptimizerFor<AdamaxOptions> {
 public:
  explicit Adamax(std::vector<Tensor> params, AdamaxOptions options = {});
  explicit Adamax(std::vector<Group> groups, AdamaxOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

}  // namespace strata::optim
