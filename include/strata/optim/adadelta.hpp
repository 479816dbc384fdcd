// Adadelta (Zeiler 2012), as torch.optim.Adadelta:
//   g = grad (negated when maximize) + weight_decay * p
//   s = rho * s + (1 - rho) * g^2
//   d = sqrt(a + eps) / sqrt(s + eps) * g
//   a = rho * a + (1 - rho) * d^2
//   p = p - lr * d
// State per parameter: "square_avg" (s), "acc_delta" (a). A per-element CPU loop; a CUDA
// parameter is updated through host copies (see adam_variants.hpp).
#pragma once

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct AdadeltaOptions {
  double lr = 1.0;
  double rho = 0.9;
  double eps = 1e-6;
  double weight_decay = 0;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("rho", o.rho), f("eps", o.eps), f("weight_decay", o.weight_decay), f("maximize", o.maximize);
  }
};

/// Raises Error for lr, eps or weight_decay < 0, or rho outside [0, 1].
STRATA_API void validate_options(const AdadeltaOptions& o);

class STRATA_API Adadelta : public OptimizerFor<AdadeltaOptions> {
 public:
  explicit Adadelta(std::vector<Tensor> params, AdadeltaOptions options = {});
  explicit Adadelta(std::vector<Group> groups, AdadeltaOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

}  // namespace strata::optim
