// Stochastic gradient descent with momentum, dampening, Nesterov momentum, L2 weight decay
// and maximize, as torch.optim.SGD:
//   g = grad (negated when maximize) + weight_decay * p
//   b = g at the first step, else momentum * b + (1 - dampening) * g      (momentum != 0)
//   g = g + momentum * b (nesterov) or b
//   p = p - lr * g
#pragma once

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("momentum", o.momentum), f("dampening", o.dampening), f("weight_decay", o.weight_decay);
    f("nesterov", o.nesterov), f("maximize", o.maximize);
  }
};

/// Raises Error for lr < 0, momentum < 0, weight_decay < 0, or nesterov without momentum or
/// with dampening.
STRATA_API void validate_options(const SGDOptions& o);

class STRATA_API SGD : public OptimizerFor<SGDOptions> {
 public:
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {});
  explicit SGD(std::vector<Group> groups, SGDOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

}  // namespace strata::optim
