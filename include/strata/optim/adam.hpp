// Adam (Kingma & Ba 2015) and AdamW (Loshchilov & Hutter 2019), as torch.optim.Adam / AdamW:
//   g = grad (negated when maximize), + weight_decay * p for Adam (an L2 penalty)
//   p = p * (1 - lr * weight_decay)                          AdamW only (decoupled decay)
//   m = beta1 * m + (1 - beta1) * g,  v = beta2 * v + (1 - beta2) * g^2
//   vmax = max(vmax, v) with amsgrad, and v below means vmax
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State per parameter: "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" with amsgrad.
#pragma once

#include <array>

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct AdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("beta1", o.betas[0]), f("beta2", o.betas[1]), f("eps", o.eps);
    f("weight_decay", o.weight_decay), f("amsgrad", o.amsgrad), f("maximize", o.maximize);
  }
};

/// The same fields as AdamOptions; weight decay defaults to 0.01, as torch.optim.AdamW.
struct AdamWOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("beta1", o.betas[0]), f("beta2", o.betas[1]), f("eps", o.eps);
    f("weight_decay", o.weight_decay), f("amsgrad", o.amsgrad), f("maximize", o.maximize);
  }
};

/// Raise Error for lr, eps or weight_decay < 0 or a beta outside [0, 1).
STRATA_API void validate_options(const AdamOptions& o);
STRATA_API void validate_options(const AdamWOptions& o);

class STRATA_API Adam : public OptimizerFor<AdamOptions> {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  explicit Adam(std::vector<Group> groups, AdamOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

class STRATA_API AdamW : public OptimizerFor<AdamWOptions> {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  explicit AdamW(std::vector<Group> groups, AdamWOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

}  // namespace strata::optim
