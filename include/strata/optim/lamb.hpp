// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2): Adam's
// direction plus decoupled weight decay, scaled per tensor by a trust ratio.
//   m = beta1 * m + (1 - beta1) * g,  v = beta2 * v + (1 - beta2) * g^2
//   mhat = m / (1 - beta1^t), vhat = v / (1 - beta2^t)         (1 without bias_correction)
//   u = mhat / (sqrt(vhat) + eps) + weight_decay * p
//   r = phi(||p||) / ||u||, phi(z) = clamp(z, clamp_min, clamp_max); r = 1 when phi(||p||)
//       or ||u|| is 0 (the paper's reference implementation)
//   p = p - lr * r * u
// Norms are over the whole parameter tensor, summed in double. State: "exp_avg", "exp_avg_sq".
#pragma once

#include <array>
#include <limits>

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct LAMBOptions {
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-6;
  double weight_decay = 0;
  bool bias_correction = true;
  /// The paper's phi: the weight norm is clamped to [clamp_min, clamp_max] (gamma_l,
  /// gamma_u); the default leaves it as is, as NVIDIA's and timm's implementations do.
  double clamp_min = 0;
  double clamp_max = std::numeric_limits<double>::infinity();
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("beta1", o.betas[0]), f("beta2", o.betas[1]), f("eps", o.eps);
    f("weight_decay", o.weight_decay), f("bias_correction", o.bias_correction);
    f("clamp_min", o.clamp_min), f("clamp_max", o.clamp_max), f("maximize", o.maximize);
  }
};

/// Raises Error for lr, eps, weight_decay or clamp_min < 0, a beta outside [0, 1), or
/// clamp_max < clamp_min.
STRATA_API void validate_options(const LAMBOptions& o);

class STRATA_API LAMB : public OptimizerFor<LAMBOptions> {
 public:
  explicit LAMB(std::vector<Tensor> params, LAMBOptions options = {});
  explicit LAMB(std::vector<Group> groups, LAMBOptions defaults = {});

  /// The trust ratio r of `param`'s last update (1 before the first). For a CUDA parameter
  /// the ratio stays on the device until asked for: this call waits for it.
  double last_trust_ratio(const Tensor& param) const;

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;

 private:
  struct TrustRatio {
    double value = 1;
    Tensor on_device;  // a CUDA step's ratios (float64), this parameter's at `index`
    int64_t index = 0;
  };
  std::unordered_map<const TensorImpl*, TrustRatio> trust_;
};

}  // namespace strata::optim
