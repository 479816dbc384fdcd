// NAdam, RAdam, Adamax and Adadelta against float64 implementations of torch.optim's documented
// algorithms, over 200 steps of the shared problem (three groups, weight decay coupled and
// decoupled, maximize, a parameter that skips steps); and bad options raising Error naming the
// option.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "optim/optim_testing.h"

namespace strata {
namespace {

using testing::kF32Atol;
using testing::kF32Rtol;
using testing::kF64Atol;
using testing::kF64Rtol;
using testing::RefState;
using testing::sgn;

// g with the L2 term, or p decayed first when decoupled (the rule every optimizer here shares)
double decayed_grad(double& p, double grad, double lr, double wd, bool decoupled, bool maximize) {
  double g = sgn(maximize) * grad;
  if (decoupled) p *= 1 - lr * wd;
  else g += wd * p;
  return g;
}

// ---- NAdam -------------------------------------------------------------------------------
void nadam_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st, const optim::NAdamOptions& o) {
  auto& m = st.get("exp_avg", p.size());
  auto& v = st.get("exp_avg_sq", p.size());
  auto& prod = st.get("mu_product", 1, 1.0);
  const double b1 = o.betas[0], b2 = o.betas[1], t = static_cast<double>(st.t);
  const double mu = b1 * (1 - 0.5 * std::pow(0.96, t * o.momentum_decay));
  const double mu_next = b1 * (1 - 0.5 * std::pow(0.96, (t + 1) * o.momentum_decay));
  prod[0] *= mu;
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = decayed_grad(p[i], grad[i], o.lr, o.weight_decay, o.decoupled_weight_decay, o.maximize);
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    const double denom = std::sqrt(v[i] / (1 - std::pow(b2, t))) + o.eps;
    p[i] -= o.lr * (1 - mu) / (1 - prod[0]) * g / denom;
    p[i] -= o.lr * mu_next / (1 - prod[0] * mu_next) * m[i] / denom;
  }
}

TEST(OptimVariants, NAdamMatchesReference) {
  const std::vector<optim::NAdamOptions> groups = {
      {.lr = 2e-3, .weight_decay = 0.01},
      {.lr = 1e-3, .betas = {0.8, 0.99}, .weight_decay = 0.1, .decoupled_weight_decay = true},
      {.lr = 3e-3, .momentum_decay = 0.01, .maximize = true},
  };
  testing::expect_matches_reference<optim::NAdam>(kFloat32, groups, nadam_ref, kF32Rtol, kF32Atol, 1e-5, 1e-6);
  testing::expect_matches_reference<optim::NAdam>(kFloat64, groups, nadam_ref, kF64Rtol, kF64Atol, 1e-11, 1e-12);
}

// ---- RAdam -------------------------------------------------------------------------------
void radam_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st, const optim::RAdamOptions& o) {
  auto& m = st.get("exp_avg", p.size());
  auto& v = st.get("exp_avg_sq", p.size());
  const double b1 = o.betas[0], b2 = o.betas[1], t = static_cast<double>(st.t);
  const double rho_inf = 2 / (1 - b2) - 1;
  const double rho_t = rho_inf - 2 * t * std::pow(b2, t) / (1 - std::pow(b2, t));
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = decayed_grad(p[i], grad[i], o.lr, o.weight_decay, o.decoupled_weight_decay, o.maximize);
    m[i] = b1 * m[i] + (1 - b1) * g;
    v[i] = b2 * v[i] + (1 - b2) * g * g;
    const double m_hat = m[i] / (1 - std::pow(b1, t));
    if (rho_t > 5) {
      const double l = std::sqrt(1 - std::pow(b2, t)) / (std::sqrt(v[i]) + o.eps);
      const double r = std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t));
      p[i] -= o.lr * m_hat * l * r;
    } else {
      p[i] -= o.lr * m_hat;
    }
  }
}

TEST(OptimVariants, RAdamMatchesReference) {
  // beta2 0.9: rho_t passes 5 at step 6, so both branches run
  const std::vector<optim::RAdamOptions> groups = {
      {.lr = 1e-3, .betas = {0.9, 0.9}, .weight_decay = 0.01},
      {.lr = 2e-3, .weight_decay = 0.1, .decoupled_weight_decay = true},
      {.lr = 1e-3, .betas = {0.5, 0.9}, .maximize = true},
  };
  testing::expect_matches_reference<optim::RAdam>(kFloat32, groups, radam_ref, kF32Rtol, kF32Atol, 1e-5, 1e-6);
  testing::expect_matches_reference<optim::RAdam>(kFloat64, groups, radam_ref, kF64Rtol, kF64Atol, 1e-11, 1e-12);
}

// ---- Adamax ------------------------------------------------------------------------------
void adamax_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st,
                const optim::AdamaxOptions& o) {
  auto& m = st.get("exp_avg", p.size());
  auto& u = st.get("exp_inf", p.size());
  const double b1 = o.betas[0], b2 = o.betas[1];
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = decayed_grad(p[i], grad[i], o.lr, o.weight_decay, false, o.maximize);
    m[i] = b1 * m[i] + (1 - b1) * g;
    u[i] = std::max(b2 * u[i], std::abs(g) + o.eps);
    p[i] -= o.lr / (1 - std::pow(b1, static_cast<double>(st.t))) * m[i] / u[i];
  }
}

TEST(OptimVariants, AdamaxMatchesReference) {
  const std::vector<optim::AdamaxOptions> groups = {
      {.lr = 2e-3, .weight_decay = 0.01},
      {.lr = 1e-3, .betas = {0.8, 0.9}, .eps = 1e-3},
      {.lr = 2e-3, .maximize = true},
  };
  testing::expect_matches_reference<optim::Adamax>(kFloat32, groups, adamax_ref, kF32Rtol, kF32Atol, 1e-5, 1e-6);
  testing::expect_matches_reference<optim::Adamax>(kFloat64, groups, adamax_ref, kF64Rtol, kF64Atol, 1e-11, 1e-12);
}

// ---- Adadelta ----------------------------------------------------------------------------
void adadelta_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st,
                  const optim::AdadeltaOptions& o) {
  auto& s = st.get("square_avg", p.size());
  auto& a = st.get("acc_delta", p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    const double g = decayed_grad(p[i], grad[i], o.lr, o.weight_decay, false, o.maximize);
    s[i] = o.rho * s[i] + (1 - o.rho) * g * g;
    const double d = std::sqrt(a[i] + o.eps) / std::sqrt(s[i] + o.eps) * g;
    a[i] = o.rho * a[i] + (1 - o.rho) * d * d;
    p[i] -= o.lr * d;
  }
}

TEST(OptimVariants, AdadeltaMatchesReference) {
  const std::vector<optim::AdadeltaOptions> groups = {
      {.lr = 1.0, .weight_decay = 0.01},
      {.lr = 0.5, .rho = 0.5, .eps = 1e-4},
      {.lr = 1.0, .maximize = true},
  };
  testing::expect_matches_reference<optim::Adadelta>(kFloat32, groups, adadelta_ref, kF32Rtol, kF32Atol, 1e-5, 1e-6);
  testing::expect_matches_reference<optim::Adadelta>(kFloat64, groups, adadelta_ref, kF64Rtol, kF64Atol, 1e-11,
                                                     1e-12);
}

// ---- bad options -------------------------------------------------------------------------
void expect_error_naming(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no Error for " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(OptimVariants, BadOptionsRaiseNamingTheOption) {
  Tensor w = zeros({3});
  w.requires_grad_();
  const std::vector<Tensor> ps{w};
  expect_error_naming([&] { optim::NAdam(ps, {.lr = -1}); }, "lr");
  expect_error_naming([&] { optim::NAdam(ps, {.betas = {1.0, 0.9}}); }, "beta1");
  expect_error_naming([&] { optim::NAdam(ps, {.momentum_decay = -0.1}); }, "momentum_decay");
  expect_error_naming([&] { optim::RAdam(ps, {.betas = {0.9, -0.1}}); }, "beta2");
  expect_error_naming([&] { optim::RAdam(ps, {.weight_decay = -1}); }, "weight_decay");
  expect_error_naming([&] { optim::Adamax(ps, {.eps = -1e-8}); }, "eps");
  expect_error_naming([&] { optim::Adadelta(ps, {.rho = 1.5}); }, "rho");
  expect_error_naming([&] { optim::Adadelta(ps, {.lr = std::nan("")}); }, "lr");
  // a bad option set between steps is caught at the next step, before any parameter changes
  optim::NAdam opt(ps, {.lr = 0.1});
  w.set_grad(ones({3}));
  opt.param_groups()[0].options.betas[1] = 1.0;
  expect_error_naming([&] { opt.step(); }, "beta2");
  EXPECT_TRUE(testing::all_close(w, {0, 0, 0}, 0, 0));
}

}  // namespace
}  // namespace strata
