// Per-element math of the activation gradients, shared by the CPU and CUDA kernels of the
// *_backward ops: each functor maps (incoming gradient g, saved value) to the gradient of the
// activation's input in one pass, where the composed form would run three to eight passes.
// The saved value is the input x or the output y, whichever the formula needs.
#pragma once

#include <cmath>

#include "half.h"
#include "host_device.h"
#include "vec_exp.h"

namespace strata::math {

// The constants of GELU's two forms.
inline constexpr double kGeluSqrt1_2 = 0.70710678118654752440;     // 1 / sqrt(2)
inline constexpr double kGeluInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
inline constexpr double kGeluTanhK = 0.79788456080286535588;       // sqrt(2 / pi)
inline constexpr double kGeluTanhC = 0.044715;

// relu(x) = max(x, 0), from its output y: 0 where y <= 0, else g (a NaN passes g, as PyTorch's
// threshold_backward).
struct ReluBackward {
  template <class T> STRATA_HOST_DEVICE T operator()(T g, T y) const { return y <= T(0) ? T(0) : g; }
};
// Element off of u as its compute type, read through a ReLU's mask when there is one: the
// gradient of a ReLU's output y, ReluBackward(u, y) (batch norm's backward after a fused ReLU).
template <class T>
STRATA_HOST_DEVICE compute_t<T> relu_masked(const T* u, const T* mask, int64_t off) {
  using C = compute_t<T>;
  return mask ? ReluBackward{}(static_cast<C>(u[off]), static_cast<C>(mask[off])) : static_cast<C>(u[off]);
}
// tanh, from its output y: g (1 - y^2).
struct TanhBackward {
  template <class T> STRATA_HOST_DEVICE T operator()(T g, T y) const { return g * (T(1) - y * y); }
};
// sigmoid, from its output y: g y (1 - y).
struct SigmoidBackward {
  template <class T> STRATA_HOST_DEVICE T operator()(T g, T y) const { return g * y * (T(1) - y); }
};
// silu(x) = x s(x), from its input: g s (1 + x (1 - s)).
struct SiluBackward {
  template <class T> STRATA_HOST_DEVICE T operator()(T g, T x) const {
    T s = T(1) / (T(1) + fast_exp(-x));
    return g * s * (T(1) + x * (T(1) - s));
  }
};
// gelu(x) = x Phi(x), from its input: g (Phi(x) + x phi(x)).
struct GeluBackward {
  template <class T> STRATA_HOST_DEVICE T operator()(T g, T x) const {
    T cdf = T(0.5) * (T(1) + fast_erf(x * T(kGeluSqrt1_2)));
    T pdf = fast_exp(T(-0.5) * x * x) * T(kGeluInvSqrt2Pi);
    return g * (cdf + x * pdf);
  }
};
// gelu, tanh form: with u = k (x + c x^3) and t = tanh(u),
// d/dx 0.5 x (1 + t) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2).
// 1 + t and 1 - t vanish in the tails, and taking them from t would cancel (a few ulps of t
// near -1 are a large part of 1 + t at x = -4). With e = exp(-2|u|), they are p = 2 / (1 + e)
// and q = e p, in the order the sign of u sets, and 1 - t^2 = p q: no cancellation.
struct GeluTanhBackward {
  template <class T> STRATA_HOST_DEVICE T operator()(T g, T x) const {
    const T k = T(kGeluTanhK), c = T(kGeluTanhC);
    const T x2 = x * x;
    const T u = k * (x + c * x2 * x);
    const T e = fast_exp(T(-2) * (u < T(0) ? -u : u));
    const T p = T(2) / (T(1) + e), q = e * p;
    const T one_plus_t = u < T(0) ? q : p;
    return g * (T(0.5) * one_plus_t + T(0.5) * x * (p * q) * k * (T(1) + T(3) * c * x2));
  }
};

}  // namespace strata::math
