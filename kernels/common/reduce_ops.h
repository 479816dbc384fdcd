// Per-element math of the reductions, shared by the CPU and CUDA kernels. A reduction is
// identity(), map(x, o, r) -> Acc and combine(Acc, Acc) -> Acc, where `o` is the output the
// element folds into (in the kernel's output order) and `r` its index along the reduced
// dims; only the arg-reductions and the shifted ones (var, logsumexp) look at them. An
// optional fold(acc, x, o, r) is a faster combine(acc, map(x, o, r)) for elements that
// arrive in increasing r; fold_element() picks it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "half.h"
#include "host_device.h"
#include "vec_exp.h"

namespace strata::math {

// Accumulator of sums and products, as PyTorch's CPU acc_type: double for float32 and
// float64, float for the 16-bit floats, int64 for integers and bool.
template <class T> struct acc_type {
  using type = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
};
template <> struct acc_type<Half> { using type = float; };
template <> struct acc_type<BFloat16> { using type = float; };
template <class T> using acc_t = typename acc_type<T>::type;

template <class T> STRATA_HOST_DEVICE bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) return x != x;
  else return false;
}

// Integer sums and products wrap around, as PyTorch's do, without signed-overflow UB.
template <class A> STRATA_HOST_DEVICE A wrapping_add(A a, A b) {
  if constexpr (std::is_integral_v<A>) return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  else return a + b;
}
template <class A> STRATA_HOST_DEVICE A wrapping_mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) return static_cast<A>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  else return a * b;
}

// max / min that return NaN when either side is NaN (as torch.max does). `|`, not `||`:
// without a branch the compiler turns it into a vector compare and blend.
template <class C> STRATA_HOST_DEVICE C max_nan(C a, C b) { return ((a > b) | is_nan(a)) ? a : b; }
template <class C> STRATA_HOST_DEVICE C min_nan(C a, C b) { return ((a < b) | is_nan(a)) ? a : b; }

// The identities of max / min. Written without std::numeric_limits, whose constexpr host
// functions device code may not call (nvcc runs without --expt-relaxed-constexpr).
template <class C> STRATA_HOST_DEVICE C lowest() {
  if constexpr (std::is_floating_point_v<C>) return -static_cast<C>(INFINITY);
  else if constexpr (std::is_same_v<C, bool>) return false;
  else if constexpr (std::is_signed_v<C>) return static_cast<C>(std::make_unsigned_t<C>(1) << (sizeof(C) * 8 - 1));
  else return C(0);
}
template <class C> STRATA_HOST_DEVICE C highest() {
  if constexpr (std::is_floating_point_v<C>) return static_cast<C>(INFINITY);
  else if constexpr (std::is_same_v<C, bool>) return true;
  else return static_cast<C>(~lowest<C>());
}

// Whether Op has fold(acc, x, o, r); detected the C++17 way, since nvcc compiles the .cu files
// that include this header as C++17.
template <class Op, class Acc, class T, class = void> struct has_fold : std::false_type {};
template <class Op, class Acc, class T>
struct has_fold<Op, Acc, T,
                std::void_t<decltype(std::declval<const Op&>().fold(std::declval<Acc>(), std::declval<T>(),
                                                                     int64_t(0), int64_t(0)))>> : std::true_type {};

template <class Op, class Acc, class T>
STRATA_HOST_DEVICE Acc fold_element(const Op& op, Acc acc, T x, int64_t o, int64_t r) {
  if constexpr (has_fold<Op, Acc, T>::value) return op.fold(acc, x, o, r);
  else return op.combine(acc, op.map(x, o, r));
}

// Lane: the type a kernel may add one short run of elements in (a few hundred per lane, Note
// [Float lanes] in kernels/cpu/reduce.h) before the run's total joins the double Acc. For
// float32 that is float, as PyTorch's cascade sum does: converting every element to double
// halved the speed, and a few hundred float additions lose under 1e-6 relative.
template <class T> struct SumReduce {
  using Acc = acc_t<T>;
  using Lane = std::conditional_t<std::is_same_v<T, float>, float, Acc>;
  STRATA_HOST_DEVICE Acc identity() const { return Acc(0); }
  STRATA_HOST_DEVICE Acc map(T x, int64_t, int64_t) const { return static_cast<Acc>(static_cast<compute_t<T>>(x)); }
  STRATA_HOST_DEVICE Acc combine(Acc a, Acc b) const { return wrapping_add(a, b); }
  template <class L> STRATA_HOST_DEVICE L fold(L a, T x, int64_t, int64_t) const {
    return wrapping_add(a, static_cast<L>(static_cast<compute_t<T>>(x)));
  }
};

template <class T> struct ProdReduce {
  using Acc = acc_t<T>;
  STRATA_HOST_DEVICE Acc identity() const { return Acc(1); }
  STRATA_HOST_DEVICE Acc map(T x, int64_t, int64_t) const { return static_cast<Acc>(static_cast<compute_t<T>>(x)); }
  STRATA_HOST_DEVICE Acc combine(Acc a, Acc b) const { return wrapping_mul(a, b); }
};

template <class T> struct MaxReduce {
  using Acc = compute_t<T>;
  STRATA_HOST_DEVICE Acc identity() const { return lowest<Acc>(); }
  STRATA_HOST_DEVICE Acc map(T x, int64_t, int64_t) const { return static_cast<Acc>(x); }
  STRATA_HOST_DEVICE Acc combine(Acc a, Acc b) const { return max_nan(a, b); }
};

template <class T> struct MinReduce {
  using Acc = compute_t<T>;
  STRATA_HOST_DEVICE Acc identity() const { return highest<Acc>(); }
  STRATA_HOST_DEVICE Acc map(T x, int64_t, int64_t) const { return static_cast<Acc>(x); }
  STRATA_HOST_DEVICE Acc combine(Acc a, Acc b) const { return min_nan(a, b); }
};

template <class C> struct ValueIndex {
  C value;
  int64_t index;
};

// argmax / argmin: the first index of the extreme value; a NaN beats every number, and the
// first NaN wins. combine() does not depend on the order partial results meet in; index -1
// marks the identity (no element yet).
template <class T, bool IsMax> struct ArgReduce {
  using C = compute_t<T>;
  using Acc = ValueIndex<C>;
  STRATA_HOST_DEVICE Acc identity() const { return {IsMax ? lowest<C>() : highest<C>(), -1}; }
  STRATA_HOST_DEVICE Acc map(T x, int64_t, int64_t r) const { return {static_cast<C>(x), r}; }
  STRATA_HOST_DEVICE Acc combine(Acc a, Acc b) const {
    if (a.index < 0 || b.index < 0) return a.index < 0 ? b : a;
    bool an = is_nan(a.value), bn = is_nan(b.value);
    if (an || bn) return (an && (!bn || a.index < b.index)) ? a : b;
    if (a.value == b.value) return a.index < b.index ? a : b;
    return (IsMax ? a.value > b.value : a.value < b.value) ? a : b;
  }
  // Folding elements in increasing index order, only a strictly better value (or the first
  // NaN) replaces the accumulator; written without branches.
  STRATA_HOST_DEVICE Acc fold(Acc a, T x, int64_t, int64_t r) const {
    C v = static_cast<C>(x);
    bool take = ((IsMax ? v > a.value : v < a.value) | (is_nan(v) & !is_nan(a.value))) | (a.index < 0);
    return take ? Acc{v, r} : a;
  }
};

// Sum of squared deviations from a per-output mean (the second pass of var).
template <class T> struct SquaredDeviationReduce {
  using Acc = acc_t<T>;
  const Acc* mean;
  STRATA_HOST_DEVICE Acc identity() const { return Acc(0); }
  STRATA_HOST_DEVICE Acc map(T x, int64_t o, int64_t) const {
    Acc d = static_cast<Acc>(static_cast<compute_t<T>>(x)) - mean[o];
    return d * d;
  }
  STRATA_HOST_DEVICE Acc combine(Acc a, Acc b) const { return a + b; }
};

// Sum of exp(x - shift) with a per-output shift (the second pass of logsumexp).
template <class T> struct ShiftedExpReduce {
  using C = compute_t<T>;
  using Acc = acc_t<T>;
  const C* shift;
  STRATA_HOST_DEVICE Acc identity() const { return Acc(0); }
  STRATA_HOST_DEVICE Acc map(T x, int64_t o, int64_t) const {
    return static_cast<Acc>(vec_exp(static_cast<C>(x) - shift[o]));
  }
  STRATA_HOST_DEVICE Acc combine(Acc a, Acc b) const { return a + b; }
};

// The sums behind vector norms: p = 1 (|x|), 2 (x^2), 0 (count of nonzeros), other p (|x|^p).
enum class NormKind : uint8_t { Zero, One, Two, Inf, NegInf, General };

template <class T, NormKind K> struct NormReduce {
  using Acc = acc_t<T>;
  Acc p = 2;
  STRATA_HOST_DEVICE Acc identity() const {
    if constexpr (K == NormKind::Inf) return Acc(0);
    else if constexpr (K == NormKind::NegInf) return highest<Acc>();
    else return Acc(0);
  }
  STRATA_HOST_DEVICE Acc map(T x, int64_t, int64_t) const {
    Acc v = static_cast<Acc>(static_cast<compute_t<T>>(x));
    Acc a;
    if constexpr (std::is_floating_point_v<Acc>) a = std::fabs(v);  // -0.0 too: pow(-0, -3) is -inf
    else a = v < Acc(0) ? -v : v;
    if constexpr (K == NormKind::Zero) return v != Acc(0) ? Acc(1) : Acc(0);
    else if constexpr (K == NormKind::Two) return v * v;
    else if constexpr (K == NormKind::General) return std::pow(a, p);
    else return a;  // a NaN stays NaN
  }
  STRATA_HOST_DEVICE Acc combine(Acc a, Acc b) const {
    if constexpr (K == NormKind::Inf) return max_nan(a, b);
    else if constexpr (K == NormKind::NegInf) return min_nan(a, b);
    else return a + b;
  }
};

}  // namespace strata::math
