// Per-element update rules of the optimizers in strata::optim, shared by the CPU loops
// (kernels/cpu/optim.h) and the CUDA kernels. Each function updates one parameter element and
// its state in place. Per-step constants (bias corrections, the decayed lr) are computed once
// on the host in double and handed over in T, the parameter's type (float or double).
//
// The rules are torch.optim's documented algorithms. `maximize` negates the gradient before
// anything else, as torch.optim's implementation does (weight decay still shrinks weights).
#pragma once

#include <cmath>

#include "host_device.h"

namespace strata::math {

// ---- SGD -------------------------------------------------------------------------------
// Factors such as 1 - beta are rounded from double once on the host: computed in float from a
// rounded beta, 1 - 0.999f is off by 1e-5 relative.
template <class T>
struct SgdConsts {
  T lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov, maximize;
};

// The gradient with the L2 penalty added: g + weight_decay * p.
template <class T>
STRATA_HOST_DEVICE T sgd_grad(T p, T g, const SgdConsts<T>& c) {
  if (c.maximize) g = -g;
  return g + c.weight_decay * p;
}

template <class T>
STRATA_HOST_DEVICE void sgd_update(T& p, T g, const SgdConsts<T>& c) {
  p -= c.lr * sgd_grad(p, g, c);
}

// `first`: the buffer has no history yet and starts as the gradient itself (b_1 = g_1).
template <class T>
STRATA_HOST_DEVICE void sgd_momentum_update(T& p, T g, T& buf, bool first, const SgdConsts<T>& c) {
  g = sgd_grad(p, g, c);
  buf = first ? g : c.momentum * buf + c.one_minus_dampening * g;
  p -= c.lr * (c.nesterov ? g + c.momentum * buf : buf);
}

// ---- Adam, AdamW (and the state math of Adam8bit) -----------------------------------------
template <class T>
struct AdamConsts {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  T weight_decay;  // L2 penalty added to the gradient (Adam); 0 for decoupled decay
  T decay;         // p *= decay before the step: 1 - lr * weight_decay (AdamW), else 1
  T step_size;     // lr / (1 - beta1^t)
  T bc2_sqrt;      // sqrt(1 - beta2^t)
  bool maximize;
};

// m and v updated with gradient g (after maximize and the L2 penalty).
template <class T>
STRATA_HOST_DEVICE void adam_moments(T g, T& m, T& v, const AdamConsts<T>& c) {
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
}

template <class T>
STRATA_HOST_DEVICE T adam_grad(T p, T g, const AdamConsts<T>& c) {
  if (c.maximize) g = -g;
  return g + c.weight_decay * p;
}

// p -= lr/(1-beta1^t) * m / (sqrt(vhat)/sqrt(1-beta2^t) + eps), vhat = v or its running max.
template <class T>
STRATA_HOST_DEVICE void adam_apply(T& p, T m, T vhat, const AdamConsts<T>& c) {
  using std::sqrt;
  p = p * c.decay - c.step_size * m / (sqrt(vhat) / c.bc2_sqrt + c.eps);
}

template <class T>
STRATA_HOST_DEVICE void adam_update(T& p, T g, T& m, T& v, const AdamConsts<T>& c) {
  adam_moments(adam_grad(p, g, c), m, v, c);
  adam_apply(p, m, v, c);
}

// AMSGrad: the denominator uses the running maximum of v (not bias-corrected), as torch does.
template <class T>
STRATA_HOST_DEVICE void adam_amsgrad_update(T& p, T g, T& m, T& v, T& vmax, const AdamConsts<T>& c) {
  adam_moments(adam_grad(p, g, c), m, v, c);
  vmax = (vmax >= v || vmax != vmax) ? vmax : v;  // NaN-propagating max, as torch.maximum
  adam_apply(p, m, vmax, c);
}

// ---- LAMB (You et al. 2019, Algorithm 2) -------------------------------------------------
template <class T>
struct LambConsts {
  T beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  T bc1, bc2;  // 1 - beta^t, or 1 without bias correction
  bool maximize;
};

template <class T>
STRATA_HOST_DEVICE void lamb_moments(T g, T& m, T& v, const LambConsts<T>& c) {
  if (c.maximize) g = -g;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
}

// The update direction before the trust ratio: mhat / (sqrt(vhat) + eps) + weight_decay * p.
template <class T>
STRATA_HOST_DEVICE T lamb_direction(T p, T m, T v, const LambConsts<T>& c) {
  using std::sqrt;
  return (m / c.bc1) / (sqrt(v / c.bc2) + c.eps) + c.weight_decay * p;
}

// phi(||w||) / ||u|| with phi clamping to [lo, hi]; 1 when either norm is zero (the paper's
// reference implementation), so a zero-initialised tensor still moves.
STRATA_HOST_DEVICE double lamb_trust_ratio(double w_norm, double u_norm, double lo, double hi) {
  double phi = w_norm < lo ? lo : (w_norm > hi ? hi : w_norm);
  return (phi > 0 && u_norm > 0) ? phi / u_norm : 1.0;
}

// ---- Adagrad -----------------------------------------------------------------------------
template <class T>
struct AdagradConsts {
  T clr;  // lr / (1 + (t - 1) * lr_decay)
  T weight_decay, eps;
  bool maximize;
};

template <class T>
STRATA_HOST_DEVICE void adagrad_update(T& p, T g, T& sum, const AdagradConsts<T>& c) {
  using std::sqrt;
  if (c.maximize) g = -g;
  g += c.weight_decay * p;
  sum += g * g;
  p -= c.clr * g / (sqrt(sum) + c.eps);
}

// ---- RMSprop -----------------------------------------------------------------------------
template <class T>
struct RmspropConsts {
  T lr, alpha, one_minus_alpha, eps, weight_decay, momentum;
  bool maximize;
};

// `gavg` is read only when kCentered, `buf` only when kMomentum.
template <bool kCentered, bool kMomentum, class T>
STRATA_HOST_DEVICE void rmsprop_update(T& p, T g, T& sq, T& gavg, T& buf, const RmspropConsts<T>& c) {
  using std::sqrt;
  if (c.maximize) g = -g;
  g += c.weight_decay * p;
  sq = c.alpha * sq + c.one_minus_alpha * g * g;
  T avg = sq;
  if constexpr (kCentered) {
    gavg = c.alpha * gavg + c.one_minus_alpha * g;
    avg = sq - gavg * gavg;
  }
  T denom = sqrt(avg) + c.eps;
  if constexpr (kMomentum) {
    buf = c.momentum * buf + g / denom;
    p -= c.lr * buf;
  } else {
    p -= c.lr * g / denom;
  }
}

}  // namespace strata::math
