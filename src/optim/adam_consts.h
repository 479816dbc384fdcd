// The per-step constants of an Adam-family update (bias corrections, decayed lr), computed
// in double and rounded once to the parameter's type. Shared by Adam, AdamW and Adam8bit.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "kernels/common/optim_math.h"

namespace strata::optim::detail {

template <class T>
math::AdamConsts<T> adam_consts(double lr, const std::array<double, 2>& betas, double eps, double weight_decay,
                                bool decoupled, bool maximize, int64_t step) {
  const double t = static_cast<double>(step);
  const double bc1 = 1 - std::pow(betas[0], t), bc2 = 1 - std::pow(betas[1], t);
  math::AdamConsts<T> c;
  c.beta1 = T(betas[0]);
  c.beta2 = T(betas[1]);
  c.one_minus_beta1 = T(1 - betas[0]);
  c.one_minus_beta2 = T(1 - betas[1]);
  c.eps = T(eps);
  c.weight_decay = decoupled ? T(0) : T(weight_decay);
  c.decay = decoupled ? T(1 - lr * weight_decay) : T(1);
  c.step_size = T(lr / bc1);
  c.bc2_sqrt = T(std::sqrt(bc2));
  c.maximize = maximize;
  return c;
}

}  // namespace strata::optim::detail
