// Every optimizer against an independent float64 implementation of its published update rule
// (torch.optim's documented algorithms; LAMB from You et al. 2019), over 200 steps of a fixed
// gradient sequence on parameters in three groups with different hyperparameters, weight
// decay on and off, a parameter that skips steps, and a non-contiguous grad. float32
// parameters must match to 1e-6 relative to their O(1) scale, float64 parameters to 1e-12.
#include <algorithm>
#include <cmath>

#include "optim/optim_testing.h"

namespace strata {
namespace {

using testing::RefState;

using testing::kF32Atol;
using testing::kF32Rtol;
using testing::kF64Atol;
using testing::kF64Rtol;
using testing::sgn;

// ---- SGD ---------------------------------------------------------------------------------
void sgd_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st, const optim::SGDOptions& o) {
  bool first = !st.s.count("momentum_buffer");
  std::vector<double>* b = o.momentum != 0 ? &st.get("momentum_buffer", p.size()) : nullptr;
  for (size_t i = 0; i < p.size(); ++i) {
    double g = sgn(o.maximize) * grad[i];
    if (o.weight_decay != 0) g += o.weight_decay * p[i];
    if (b) {
      double& bi = (*b)[i];
      bi = first ? g : o.momentum * bi + (1 - o.dampening) * g;
      g = o.nesterov ? g + o.momentum * bi : bi;
    }
    p[i] -= o.lr * g;
  }
}

const std::vector<optim::SGDOptions> kSgdGroups = {
    {.lr = 0.01, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true},
    {.lr = 0.02, .momentum = 0.5, .dampening = 0.1},
    {.lr = 0.01, .weight_decay = 0.1, .maximize = true},
};

TEST(Optim, SGDMatchesReference) {
  testing::expect_matches_reference<optim::SGD>(kFloat32, kSgdGroups, sgd_ref, kF32Rtol, kF32Atol, 1e-5, 1e-6);
  testing::expect_matches_reference<optim::SGD>(kFloat64, kSgdGroups, sgd_ref, kF64Rtol, kF64Atol, 1e-11, 1e-12);
}

// ---- Adam / AdamW ------------------------------------------------------------------------
template <class O>
void adam_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st, const O& o, bool decoupled) {
  auto& m = st.get("exp_avg", p.size());
  auto& v = st.get("exp_avg_sq", p.size());
  std::vector<double>* vmax = o.amsgrad ? &st.get("max_exp_avg_sq", p.size()) : nullptr;
  const double t = static_cast<double>(st.t);
  const double bc1 = 1 - std::pow(o.betas[0], t), bc2 = 1 - std::pow(o.betas[1], t);
  for (size_t i = 0; i < p.size(); ++i) {
    double g = sgn(o.maximize) * grad[i];
    if (decoupled) p[i] *= 1 - o.lr * o.weight_decay;
    else g += o.weight_decay * p[i];
    m[i] = o.betas[0] * m[i] + (1 - o.betas[0]) * g;
    v[i] = o.betas[1] * v[i] + (1 - o.betas[1]) * g * g;
    double vhat = v[i];
    if (vmax) vhat = (*vmax)[i] = std::max((*vmax)[i], v[i]);
    p[i] -= o.lr * (m[i] / bc1) / (std::sqrt(vhat / bc2) + o.eps);
  }
}

TEST(Optim, AdamMatchesReference) {
  const std::vector<optim::AdamOptions> groups = {
      {.lr = 1e-3, .weight_decay = 0.01},
      {.lr = 2e-3, .betas = {0.8, 0.99}, .amsgrad = true},
      {.lr = 1e-3, .eps = 1e-6, .maximize = true},
  };
  auto ref = [](std::vector<double>& p, const std::vector<double>& g, RefState& st, const optim::AdamOptions& o) {
    adam_ref(p, g, st, o, false);
  };
  testing::expect_matches_reference<optim::Adam>(kFloat32, groups, ref, kF32Rtol, kF32Atol, 1e-5, 1e-7);
  testing::expect_matches_reference<optim::Adam>(kFloat64, groups, ref, kF64Rtol, kF64Atol, 1e-11, 1e-13);
}

TEST(Optim, AdamWMatchesReference) {
  const std::vector<optim::AdamWOptions> groups = {
      {.lr = 1e-3, .betas = {0.9, 0.999}, .weight_decay = 0.1},
      {.lr = 3e-3, .weight_decay = 0, .amsgrad = true},
      {.lr = 1e-3, .betas = {0.95, 0.98}, .weight_decay = 0.01, .maximize = true},
  };
  auto ref = [](std::vector<double>& p, const std::vector<double>& g, RefState& st, const optim::AdamWOptions& o) {
    adam_ref(p, g, st, o, true);
  };
  testing::expect_matches_reference<optim::AdamW>(kFloat32, groups, ref, kF32Rtol, kF32Atol, 1e-5, 1e-7);
  testing::expect_matches_reference<optim::AdamW>(kFloat64, groups, ref, kF64Rtol, kF64Atol, 1e-11, 1e-13);
}

// ---- LAMB --------------------------------------------------------------------------------
void lamb_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st, const optim::LAMBOptions& o) {
  auto& m = st.get("exp_avg", p.size());
  auto& v = st.get("exp_avg_sq", p.size());
  const double t = static_cast<double>(st.t);
  const double bc1 = o.bias_correction ? 1 - std::pow(o.betas[0], t) : 1;
  const double bc2 = o.bias_correction ? 1 - std::pow(o.betas[1], t) : 1;
  std::vector<double> u(p.size());
  double w2 = 0, u2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    double g = sgn(o.maximize) * grad[i];
    m[i] = o.betas[0] * m[i] + (1 - o.betas[0]) * g;
    v[i] = o.betas[1] * v[i] + (1 - o.betas[1]) * g * g;
    u[i] = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + o.eps) + o.weight_decay * p[i];
    w2 += p[i] * p[i];
    u2 += u[i] * u[i];
  }
  double phi = std::min(std::max(std::sqrt(w2), o.clamp_min), o.clamp_max);
  double ratio = (phi > 0 && u2 > 0) ? phi / std::sqrt(u2) : 1.0;
  for (size_t i = 0; i < p.size(); ++i) p[i] -= o.lr * ratio * u[i];
}

TEST(Optim, LAMBMatchesReference) {
  const std::vector<optim::LAMBOptions> groups = {
      {.lr = 1e-2, .weight_decay = 0.01},
      {.lr = 5e-3, .betas = {0.8, 0.99}, .bias_correction = false},
      // ||w|| of the (4, 4) parameter is about 4: the clamp is active
      {.lr = 1e-2, .weight_decay = 0.1, .clamp_min = 0.1, .clamp_max = 0.5, .maximize = true},
  };
  testing::expect_matches_reference<optim::LAMB>(kFloat32, groups, lamb_ref, kF32Rtol, kF32Atol, 1e-5, 1e-7);
  testing::expect_matches_reference<optim::LAMB>(kFloat64, groups, lamb_ref, kF64Rtol, kF64Atol, 1e-11, 1e-13);
}

TEST(Optim, LAMBTrustRatioIsOneForZeroWeights) {
  Tensor p = zeros({64});
  p.requires_grad_();
  optim::LAMB opt({p}, {.lr = 0.1});
  p.set_grad(full({64}, 2.0));
  opt.step();
  EXPECT_EQ(opt.last_trust_ratio(p), 1.0);
  // first step: mhat / sqrt(vhat) = sign(g) = 1, so p = -lr * 1 / (1 + eps)
  EXPECT_TRUE(testing::all_close(p, std::vector<double>(64, -0.1 / (1 + 1e-6)), 1e-6, 0));
  // a zero gradient after a zero moment history: ||u|| = 0, ratio 1, and nothing moves
  Tensor q = ones({8});
  q.requires_grad_();
  optim::LAMB opt2({q});
  q.set_grad(zeros({8}));
  opt2.step();
  EXPECT_EQ(opt2.last_trust_ratio(q), 1.0);
  EXPECT_TRUE(testing::all_close(q, std::vector<double>(8, 1.0), 0, 0));
}

// ---- Adagrad -----------------------------------------------------------------------------
void adagrad_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st,
                 const optim::AdagradOptions& o) {
  auto& sum = st.get("sum", p.size(), o.initial_accumulator_value);
  const double clr = o.lr / (1 + static_cast<double>(st.t - 1) * o.lr_decay);
  for (size_t i = 0; i < p.size(); ++i) {
    double g = sgn(o.maximize) * grad[i] + o.weight_decay * p[i];
    sum[i] += g * g;
    p[i] -= clr * g / (std::sqrt(sum[i]) + o.eps);
  }
}

TEST(Optim, AdagradMatchesReference) {
  const std::vector<optim::AdagradOptions> groups = {
      {.lr = 0.05, .lr_decay = 0.01, .weight_decay = 0.01},
      {.lr = 0.02, .initial_accumulator_value = 0.1},
      {.lr = 0.01, .eps = 1e-8, .maximize = true},
  };
  testing::expect_matches_reference<optim::Adagrad>(kFloat32, groups, adagrad_ref, kF32Rtol, kF32Atol, 1e-5, 1e-6);
  testing::expect_matches_reference<optim::Adagrad>(kFloat64, groups, adagrad_ref, kF64Rtol, kF64Atol, 1e-11, 1e-12);
}

// ---- RMSprop -----------------------------------------------------------------------------
void rmsprop_ref(std::vector<double>& p, const std::vector<double>& grad, RefState& st,
                 const optim::RMSpropOptions& o) {
  auto& sq = st.get("square_avg", p.size());
  std::vector<double>* gavg = o.centered ? &st.get("grad_avg", p.size()) : nullptr;
  std::vector<double>* buf = o.momentum > 0 ? &st.get("momentum_buffer", p.size()) : nullptr;
  for (size_t i = 0; i < p.size(); ++i) {
    double g = sgn(o.maximize) * grad[i] + o.weight_decay * p[i];
    sq[i] = o.alpha * sq[i] + (1 - o.alpha) * g * g;
    double avg = sq[i];
    if (gavg) {
      (*gavg)[i] = o.alpha * (*gavg)[i] + (1 - o.alpha) * g;
      avg -= (*gavg)[i] * (*gavg)[i];
    }
    double denom = std::sqrt(avg) + o.eps;
    if (buf) {
      (*buf)[i] = o.momentum * (*buf)[i] + g / denom;
      p[i] -= o.lr * (*buf)[i];
    } else {
      p[i] -= o.lr * g / denom;
    }
  }
}

TEST(Optim, RMSpropMatchesReference) {
  const std::vector<optim::RMSpropOptions> groups = {
      {.lr = 1e-3, .momentum = 0.9, .centered = true},
      {.lr = 2e-3, .alpha = 0.9, .weight_decay = 0.01},
      {.lr = 1e-3, .weight_decay = 0.01, .momentum = 0.5, .maximize = true},
  };
  testing::expect_matches_reference<optim::RMSprop>(kFloat32, groups, rmsprop_ref, kF32Rtol, kF32Atol, 1e-5, 1e-6);
  testing::expect_matches_reference<optim::RMSprop>(kFloat64, groups, rmsprop_ref, kF64Rtol, kF64Atol, 1e-11, 1e-12);
  const std::vector<optim::RMSpropOptions> centered_only = {
      {.lr = 1e-3, .centered = true}, {.lr = 1e-3, .eps = 1e-6}, {.lr = 5e-4, .alpha = 0.5, .centered = true}};
  testing::expect_matches_reference<optim::RMSprop>(kFloat32, centered_only, rmsprop_ref, kF32Rtol, kF32Atol, 1e-5,
                                                    1e-6);
}

// ---- shared behaviour --------------------------------------------------------------------
TEST(Optim, StepSkipsParamsWithoutGradAndBumpsVersion) {
  Tensor a = ones({3}), b = ones({3});
  a.requires_grad_();
  b.requires_grad_();
  optim::SGD opt({a, b}, {.lr = 0.5});
  a.set_grad(full({3}, 1.0));
  int64_t va = a.version(), vb = b.version();
  opt.step();
  EXPECT_TRUE(testing::all_close(a, {0.5, 0.5, 0.5}, 0, 0));
  EXPECT_TRUE(testing::all_close(b, {1, 1, 1}, 0, 0));
  EXPECT_GT(a.version(), va);
  EXPECT_EQ(b.version(), vb);
  EXPECT_NE(opt.state(a), nullptr);
  EXPECT_EQ(opt.state(b), nullptr);
}

TEST(Optim, ZeroGrad) {
  Tensor a = ones({4});
  a.requires_grad_();
  optim::Adam opt({a});
  a.set_grad(full({4}, 3.0));
  opt.zero_grad(false);
  ASSERT_TRUE(a.grad().defined());
  EXPECT_TRUE(testing::all_close(a.grad(), {0, 0, 0, 0}, 0, 0));
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  opt.step();  // no grads: nothing happens
  EXPECT_TRUE(testing::all_close(a, {1, 1, 1, 1}, 0, 0));
  // a gradient the user set as an expanded view cannot be zeroed in place: it becomes dense
  // zeros, and every parameter is cleared (none is left behind by a failing write)
  Tensor b = ones({2, 3});
  b.requires_grad_();
  optim::SGD two({a, b});
  a.set_grad(full({1}, 2.0).expand({4}));
  b.set_grad(full({3}, 5.0).expand({2, 3}));
  two.zero_grad(false);
  for (const Tensor& p : {a, b}) {
    EXPECT_TRUE(testing::all_close(p.grad(), std::vector<double>(static_cast<size_t>(p.numel()), 0), 0, 0));
    EXPECT_TRUE(p.grad().is_contiguous());
  }
}

TEST(Optim, ClosureRunsWithGradEnabledAndItsLossIsReturned) {
  Tensor a = ones({2});
  a.requires_grad_();
  optim::SGD opt({a}, {.lr = 1.0});
  bool grad_mode_in_closure = false;
  Tensor loss = opt.step([&] {
    grad_mode_in_closure = autograd::is_grad_enabled();
    a.set_grad(full({2}, 0.25));
    return scalar_tensor(7.0);
  });
  EXPECT_TRUE(grad_mode_in_closure);
  EXPECT_EQ(loss.item<double>(), 7.0);
  EXPECT_TRUE(testing::all_close(a, {0.75, 0.75}, 0, 0));
  EXPECT_TRUE(autograd::is_grad_enabled());
}

TEST(Optim, EmptyAndTinyParameters) {
  Tensor e = zeros({0, 3});
  e.requires_grad_();
  Tensor a = ones({3});
  a.requires_grad_();
  optim::Adam8bit opt({e, a}, {.min_8bit_size = 0});
  e.set_grad(zeros({0, 3}));
  a.set_grad(ones({3}));
  opt.step();
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(opt.is_quantized(a));
  // first step of Adam: every element moves by lr (to within eps)
  EXPECT_TRUE(testing::all_close(a, std::vector<double>(3, 1 - 1e-3), 1e-6, 0));
}

}  // namespace
}  // namespace strata
