// Finite-difference gradient checks in float64: the analytic vector-Jacobian product from
// autograd against central differences of <v, f(x)> for a random v.
#pragma once

#include <functional>

#include "testing.h"

namespace strata::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

/// One row of a table of gradient checks: f of float64 inputs of these shapes.
struct GradCase {
  const char* name;
  Fn f;
  std::vector<Shape> shapes;
};

/// An int64 index tensor of shape s.
inline Tensor indices(std::vector<int64_t> v, Shape s) { return from_vector(v, s); }

// Offsets (in elements, from the storage start) of every element of t, in C order.
inline std::vector<int64_t> element_offsets(const Tensor& t) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    auto idx = unravel(i, t.shape());
    int64_t off = t.storage_offset();
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
    out.push_back(off);
  }
  return out;
}

inline double weighted_sum(const Tensor& y, const std::vector<double>& v) {
  std::vector<double> vy = values(y);
  double s = 0;
  for (size_t i = 0; i < vy.size(); ++i) s += vy[i] * v[i];
  return s;
}

/// Inputs must be float64 leaves that require grad (any layout without overlap).
inline ::testing::AssertionResult gradcheck(const Fn& f, const std::vector<Tensor>& inputs, double eps = 1e-6,
                                            double atol = 1e-6, double rtol = 1e-5) {
  Tensor y = f(inputs);
  if (!y.requires_grad()) return ::testing::AssertionFailure() << "output does not require grad";
  Generator g(123);
  Tensor v = randn(y.shape(), kFloat64, &g);
  std::vector<double> vv = values(v);
  std::vector<Tensor> analytic = autograd::grad({y}, inputs, {v}, std::nullopt, false, true);
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    double* base = static_cast<double*>(x.storage()->data());
    std::vector<int64_t> offs = element_offsets(x);
    std::vector<double> numeric(offs.size());
    for (size_t i = 0; i < offs.size(); ++i) {
      double keep = base[offs[i]];
      NoGradGuard no_grad;
      base[offs[i]] = keep + eps;
      double up = weighted_sum(f(inputs), vv);
      base[offs[i]] = keep - eps;
      double down = weighted_sum(f(inputs), vv);
      base[offs[i]] = keep;
      numeric[i] = (up - down) / (2 * eps);
    }
    std::vector<double> got = analytic[k].defined() ? values(analytic[k]) : std::vector<double>(numeric.size(), 0.0);
    auto r = all_close(got, numeric, rtol, atol);
    if (!r) return r << " (input " << k << " of shape " << fmt::format("{}", x.shape()) << ")";
  }
  return ::testing::AssertionSuccess();
}

/// Checks the gradient of the gradient: for each input k, gradcheck of
/// x -> d<v, f(x)>/dx_k computed with create_graph.
inline ::testing::AssertionResult gradgradcheck(const Fn& f, const std::vector<Tensor>& inputs) {
  Tensor y0 = f(inputs);
  Generator g(321);
  Tensor v = randn(y0.shape(), kFloat64, &g);
  for (size_t k = 0; k < inputs.size(); ++k) {
    Fn first = [&](const std::vector<Tensor>& xs) {
      EnableGradGuard grad_mode;  // also while gradcheck perturbs inputs under NoGradGuard
      Tensor gk = autograd::grad({f(xs)}, xs, {v}, true, true, true)[k];
      return gk.defined() ? gk : zeros_like(xs[k]);
    };
    Tensor probe = first(inputs);
    if (!probe.defined() || !probe.requires_grad()) continue;  // gradient constant in x: nothing to check
    auto r = gradcheck(first, inputs, 1e-5, 1e-5, 1e-4);
    if (!r) return r << " (second derivative, through input " << k << ")";
  }
  return ::testing::AssertionSuccess();
}

/// A float64 leaf requiring grad with the given values and layout.
inline Tensor leaf(const Tensor& values, Layout layout = Layout::Contiguous) {
  Tensor t = with_layout(values.to(kFloat64).detach(), layout);
  t.requires_grad_();
  return t;
}

/// gradcheck, and gradgradcheck through a square, of every case on float64 inputs drawn from
/// `seed`.
inline void check_cases_to_second_order(const std::vector<GradCase>& cases, uint64_t seed) {
  Generator g(seed);
  for (const GradCase& c : cases) {
    std::vector<Tensor> in;
    for (const Shape& s : c.shapes) in.push_back(leaf(randn(s, kFloat64, &g)));
    SCOPED_TRACE(c.name);
    EXPECT_TRUE(gradcheck(c.f, in));
    Fn squared = [&c](const std::vector<Tensor>& x) { return square(c.f(x)); };
    EXPECT_TRUE(gradgradcheck(squared, in));
  }
}

}  // namespace strata::testing
