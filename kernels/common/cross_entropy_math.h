// Per-row math of the fused softmax cross-entropy, shared by the CPU and CUDA kernels.
//
// Note [Online logsumexp]: a row's logsumexp is kept as a running maximum m and a sum s of
// exp(x - m), so the row is read once. On the GPU each element costs one exp: with
// d = x - m, e = exp(-|d|) is exp(x - m) when x <= m, and exp(m - x) (the factor that
// rescales s to the new maximum) when x > m. m starts at the lowest finite value rather
// than -inf, so a row of -inf logits gives s = 0 and lse = -inf instead of NaN. Partial
// states (one per GPU thread) merge by rescaling both sums to the larger maximum; the merge
// is commutative, so a butterfly reduction leaves every lane with the same value. The CPU
// kernel (kernels/cpu/cross_entropy.h) rescales once per block of logits instead.
//
// With class indices (Note [Cross entropy in one node] in src/nn/loss.cpp) the loss of a row
// with target t, class weights w (all 1 without weights, W = sum_j w_j), smoothing eps over C
// classes is
//   l = (1 - eps) w_t (lse - x_t) + eps / C (W (lse - k) - sum_j w_j (x_j - k))
// for any shift k (the row's first finite logit keeps the sum small), and 0 when ignored.
// Its gradient is dl/dx_j = g (exp(x_j - lse) Q - q_j) with
//   q_j = (1 - eps) w_t [j == t] + eps w_j / C,   Q = sum_j q_j = (1 - eps) w_t + eps W / C.
#pragma once

#include <cmath>
#include <cstdint>

#include "half.h"
#include "host_device.h"
#include "reduce_ops.h"

namespace strata::math {

// e^x in float for the host loops of these kernels, where x <= 0 but for rounding (an
// exponent of a logit minus a larger value): Cephes' polynomial as vec_exp, but results
// below e^-87 (the smallest normal floats) are flushed to 0 and x is clamped at 88, so 2^n
// is one normal float and no range checks or subnormal steps remain. Subnormal arithmetic
// costs x86 a microcode assist of ~100 cycles, and the online logsumexp meets e^-|x - m| with
// a huge |x - m| at the start of every row; terms that small cannot change a logsumexp.
// NaN stays NaN.
STRATA_HOST_DEVICE float exp_flush(float x) {
  const float kLow = -87.0f, kHigh = 88.0f;
  float xc = x >= kLow ? x : kLow;  // NaN -> kLow, so the int conversion below is defined
  xc = xc <= kHigh ? xc : kHigh;
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float kRound = 12582912.0f;  // 1.5 * 2^23: adding and removing it rounds to an integer
  const float n = (xc * kLog2e + kRound) - kRound;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // n in [-126, 127]; at n = -126, r > 0.33 and p > 1, so the product stays normal
  const float y = p * halfbits::bits_f32(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23);
  return x >= kLow ? y : (x != x ? x : 0.0f);
}

// exp in the cross-entropy kernels: exp_flush for float on the host, the library's exp for
// double and on the device (CUDA's is fast there, subnormals included).
template <class C> STRATA_HOST_DEVICE C ce_exp(C x) {
#if defined(__CUDA_ARCH__)
  return std::exp(x);
#else
  if constexpr (sizeof(C) == sizeof(float)) return exp_flush(x);
  else return std::exp(x);
#endif
}

/// Running logsumexp of a row, see Note [Online logsumexp].
template <class C> struct OnlineLse {
  C max, sum;
};

// (numeric_limits is host-only code for nvcc without --expt-relaxed-constexpr)
template <class C> STRATA_HOST_DEVICE OnlineLse<C> lse_start() {
  if constexpr (sizeof(C) == sizeof(float)) return {C(-3.40282346638528859812e+38F), C(0)};
  else return {C(-1.79769313486231570815e+308), C(0)};
}

template <class C> STRATA_HOST_DEVICE void lse_push(OnlineLse<C>& a, C x) {
  const C d = x - a.max;
  const C e = ce_exp(d > C(0) ? -d : d);  // NaN stays NaN
  a.sum = d > C(0) ? a.sum * e + C(1) : a.sum + e;
  a.max = x > a.max ? x : a.max;  // a NaN x leaves max but makes sum NaN, for good
}

template <class C> STRATA_HOST_DEVICE OnlineLse<C> lse_merge(OnlineLse<C> a, OnlineLse<C> b) {
  const C m = max_nan(a.max, b.max);
  const C sa = a.max == m ? a.sum : a.sum * ce_exp(a.max - m);
  const C sb = b.max == m ? b.sum : b.sum * ce_exp(b.max - m);
  return {m, sa + sb};
}

template <class C> STRATA_HOST_DEVICE C lse_value(OnlineLse<C> a) { return a.max + std::log(a.sum); }

/// The shift k of the smoothing sum: the first logit when finite, else 0.
template <class C> STRATA_HOST_DEVICE C ce_shift(C x0) { return (x0 - x0 == C(0)) ? x0 : C(0); }

/// Loss of a row that is not ignored; wx_shifted = sum_j w_j (x_j - shift).
template <class A>
STRATA_HOST_DEVICE A ce_row_loss(A lse, A x_t, A w_t, A wx_shifted, A shift, A total_w, A eps, int64_t classes) {
  A l = (A(1) - eps) * w_t * (lse - x_t);
  if (eps > A(0)) l += eps / static_cast<A>(classes) * (total_w * (lse - shift) - wx_shifted);
  return l;
}

/// Per-row factors of the gradient: dx_j = gq exp(x_j - lse) - smooth w_j - [j == t] target.
template <class C> struct CeGradRow {
  C gq, smooth, target;
};

/// g is the row's output gradient; valid is false for ignored rows (their gradient is 0).
template <class C>
STRATA_HOST_DEVICE CeGradRow<C> ce_grad_row(C g, bool valid, C w_t, C total_w, C eps, int64_t classes) {
  if (!valid) return {C(0), C(0), C(0)};
  const C target = g * (C(1) - eps) * w_t;
  const C smooth = g * eps / static_cast<C>(classes);
  return {target + smooth * total_w, smooth, target};
}

template <class C> STRATA_HOST_DEVICE C ce_grad(const CeGradRow<C>& r, C x, C lse, C w_j, bool is_target) {
  C v = r.gq * ce_exp(x - lse) - r.smooth * w_j;
  return is_target ? v - r.target : v;
}

/// Whether a target that is not ignore_index names one of the classes.
STRATA_HOST_DEVICE bool ce_in_range(int64_t t, int64_t classes) { return t >= 0 && t < classes; }

}  // namespace strata::math
