// Shared by the optimizer tests: a fixed problem (parameters in several groups, and the whole
// gradient sequence generated up front, with gaps where a parameter gets no grad), and a
// driver that runs an optimizer over it beside a float64 reference written in the test.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "testing.h"

namespace strata::testing {

/// Parameters with their group and initial values, and grads[step][param] (empty: no grad
/// that step).
struct OptimProblem {
  std::vector<Shape> shapes;
  std::vector<size_t> group;
  std::vector<std::vector<double>> init;
  std::vector<std::vector<std::vector<double>>> grads;
  size_t num_groups = 0;
};

inline int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

/// Five parameters in three groups: (7, 13) and (5) in group 0, (300) in group 1, (4, 4) and
/// a scalar-like (1) in group 2. Parameter 1 gets no grad every fifth step. Values are
/// rounded to float32 so float32 and float64 runs start from the same numbers.
inline OptimProblem make_problem(int steps, uint32_t seed = 7) {
  OptimProblem pr;
  pr.shapes = {{7, 13}, {5}, {300}, {4, 4}, {1}};
  pr.group = {0, 0, 1, 2, 2};
  pr.num_groups = 3;
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto f32 = [](double x) { return static_cast<double>(static_cast<float>(x)); };
  for (const Shape& s : pr.shapes) {
    std::vector<double> v(static_cast<size_t>(numel_of(s)));
    for (double& x : v) x = f32(normal(rng));
    pr.init.push_back(v);
  }
  pr.grads.resize(static_cast<size_t>(steps));
  for (int t = 0; t < steps; ++t) {
    for (size_t i = 0; i < pr.shapes.size(); ++i) {
      std::vector<double> g;
      if (!(i == 1 && t % 5 == 3)) {
        g.resize(static_cast<size_t>(numel_of(pr.shapes[i])));
        double scale = 0.5 + 0.5 * static_cast<double>(i);  // parameters see different gradient scales
        for (double& x : g) x = f32(scale * normal(rng));
      }
      pr.grads[static_cast<size_t>(t)].push_back(g);
    }
  }
  return pr;
}

inline std::vector<Tensor> make_params(const OptimProblem& pr, DType dtype) {
  std::vector<Tensor> ps;
  for (size_t i = 0; i < pr.shapes.size(); ++i) {
    Tensor p = from_vector(pr.init[i], pr.shapes[i]).to(dtype);
    p.requires_grad_();
    ps.push_back(p);
  }
  return ps;
}

/// Sets every parameter's grad for `step` (undefined where the problem has none). Parameter 3
/// gets its grad in transposed memory, so the optimizer must handle a non-contiguous grad.
inline void set_grads(const std::vector<Tensor>& ps, const OptimProblem& pr, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<double>& g = pr.grads[static_cast<size_t>(step)][i];
    if (g.empty()) {
      ps[i].set_grad(Tensor());
      continue;
    }
    Tensor t = from_vector(g, pr.shapes[i]).to(ps[i].dtype());
    ps[i].set_grad(i == 3 ? with_layout(t, Layout::Transposed) : t);
  }
}

template <class Options>
std::vector<optim::ParamGroup<Options>> make_groups(const OptimProblem& pr, const std::vector<Tensor>& ps,
                                                    const std::vector<Options>& opts) {
  std::vector<optim::ParamGroup<Options>> groups;
  for (size_t g = 0; g < pr.num_groups; ++g) groups.emplace_back(std::vector<Tensor>{}, opts[g]);
  for (size_t i = 0; i < ps.size(); ++i) groups[pr.group[i]].params.push_back(ps[i]);
  return groups;
}

constexpr double kF32Rtol = 1e-6, kF32Atol = 1e-6;  // parameters are O(1)
constexpr double kF64Rtol = 1e-12, kF64Atol = 1e-13;

inline double sgn(bool maximize) { return maximize ? -1.0 : 1.0; }

/// A reference optimizer's state for one parameter: its update count and named vectors.
struct RefState {
  int64_t t = 0;
  std::map<std::string, std::vector<double>> s;
  std::vector<double>& get(const std::string& name, size_t n, double fill = 0) {
    auto it = s.find(name);
    if (it == s.end()) it = s.emplace(name, std::vector<double>(n, fill)).first;
    return it->second;
  }
};

/// ref(p, g, state, options): one float64 step of the published rule on one parameter.
template <class Options>
using RefStep = std::function<void(std::vector<double>&, const std::vector<double>&, RefState&, const Options&)>;

/// Runs `steps` steps of optimizer Opt over the problem beside `ref` and checks every
/// parameter and every state tensor the reference keeps under the same name. With float32
/// parameters the reference still computes in float64 but stores the parameter rounded to
/// float32 after each step, as the optimizer must; its state stays in float64.
template <class Opt, class Options>
void expect_matches_reference(DType dtype, const std::vector<Options>& opts,
                              const std::type_identity_t<RefStep<Options>>& ref,
                              double rtol, double atol, double state_rtol, double state_atol, int steps = 200) {
  OptimProblem pr = make_problem(steps);
  std::vector<Tensor> ps = make_params(pr, dtype);
  Opt opt(make_groups(pr, ps, opts));
  std::vector<std::vector<double>> want = pr.init;
  std::vector<RefState> states(ps.size());
  for (int t = 0; t < steps; ++t) {
    set_grads(ps, pr, t);
    opt.step();
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::vector<double>& g = pr.grads[static_cast<size_t>(t)][i];
      if (g.empty()) continue;
      ++states[i].t;
      ref(want[i], g, states[i], opts[pr.group[i]]);
      if (dtype == kFloat32)
        for (double& x : want[i]) x = static_cast<double>(static_cast<float>(x));
    }
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i) + " (" + std::string(dtype_name(dtype)) + ")");
    EXPECT_TRUE(all_close(ps[i], want[i], rtol, atol));
    const optim::ParamState* st = opt.state(ps[i]);
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->step, states[i].t);
    for (const auto& [name, v] : states[i].s) {
      SCOPED_TRACE("state " + name);
      auto it = st->tensors.find(name);
      ASSERT_NE(it, st->tensors.end());
      EXPECT_TRUE(all_close(it->second, v, state_rtol, state_atol));
    }
  }
}

}  // namespace strata::testing
