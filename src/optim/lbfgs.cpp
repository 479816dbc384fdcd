// LBFGS: PyTorch's algorithm (torch/optim/lbfgs.py, line_search_fn None) on a flat float64
// copy of the parameters' gradients.
#include <strata/optim/lbfgs.hpp>

#include <algorithm>
#include <cmath>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/creation.hpp>

#include "optim/update_util.h"

namespace strata::optim {

namespace {
double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
double abs_max(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}
Tensor to_tensor(const std::vector<double>& v) { return from_vector(v, Shape{static_cast<int64_t>(v.size())}); }
std::vector<double> to_vector(const Tensor& t) {
  Tensor c = t.to(kCPU, kFloat64).contiguous();
  const double* p = static_cast<const double*>(c.data());
  return std::vector<double>(p, p + c.numel());
}
}  // namespace

void validate_options(const LBFGSOptions& o) {
  detail::check_nonneg("LBFGS", "lr", o.lr);
  detail::check_nonneg("LBFGS", "tolerance_grad", o.tolerance_grad);
  detail::check_nonneg("LBFGS", "tolerance_change", o.tolerance_change);
  STRATA_CHECK(o.max_iter >= 1, "[LBFGS] invalid max_iter: {} (must be >= 1)", o.max_iter);
  STRATA_CHECK(o.max_eval >= 0, "[LBFGS] invalid max_eval: {} (must be >= 0; 0 for the default)", o.max_eval);
  STRATA_CHECK(o.history_size >= 1, "[LBFGS] invalid history_size: {} (must be >= 1)", o.history_size);
}

LBFGS::LBFGS(std::vector<Tensor> params, LBFGSOptions options)
    : OptimizerFor("LBFGS", {Group{std::move(params), options}}, options) {}

void LBFGS::update(size_t, const Tensor&, const Tensor&, ParamState&) {
  STRATA_CHECK(false, "[LBFGS] updates all parameters at once in step(closure)");
}

std::vector<double> LBFGS::flat_grad() const {
  std::vector<double> g;
  for (const Tensor& p : group_params(0)) {
    if (p.grad().defined()) {
      const std::vector<double> v = to_vector(p.grad());
      g.insert(g.end(), v.begin(), v.end());
    } else {
      g.insert(g.end(), static_cast<size_t>(p.numel()), 0.0);
    }
  }
  return g;
}

void LBFGS::add_to_params(double t, const std::vector<double>& d) {
  NoGradGuard no_grad;
  size_t offset = 0;
  for (const Tensor& p : group_params(0)) {
    const size_t n = static_cast<size_t>(p.numel());
    std::vector<double> part(d.begin() + static_cast<std::ptrdiff_t>(offset),
                             d.begin() + static_cast<std::ptrdiff_t>(offset + n));
    p.add_(from_vector(part, p.shape()).to(p.device(), p.dtype()), t);
    offset += n;
  }
}

Tensor LBFGS::step(const std::function<Tensor()>& closure) {
  STRATA_CHECK(static_cast<bool>(closure), "[LBFGS] step needs a closure that recomputes the loss and its grads");
  STRATA_CHECK(num_param_groups() == 1, "[LBFGS] takes one parameter group, got {}", num_param_groups());
  check_all_options();
  check_params();
  const LBFGSOptions& o = param_groups()[0].options;
  const int64_t max_eval = o.max_eval > 0 ? o.max_eval : o.max_iter * 5 / 4;
  auto evaluate = [&] {
    EnableGradGuard enable;
    Tensor l = closure();
    STRATA_CHECK(l.defined() && l.numel() == 1, "[LBFGS] the closure must return the loss, a one-element tensor");
    return l;
  };
  const Tensor orig_loss = evaluate();
  double loss = orig_loss.item<double>();
  int64_t current_evals = 1;
  ++func_evals_;
  std::vector<double> g = flat_grad();
  if (abs_max(g) <= o.tolerance_grad) return orig_loss;
  for (int64_t iter = 1; iter <= o.max_iter; ++iter) {
    ++n_iter_;
    if (n_iter_ == 1) {
      d_.resize(g.size());
      for (size_t i = 0; i < g.size(); ++i) d_[i] = -g[i];
      old_dirs_.clear(), old_stps_.clear(), ro_.clear();
      h_diag_ = 1;
    } else {
      std::vector<double> y(g.size()), s(g.size());
      for (size_t i = 0; i < g.size(); ++i) y[i] = g[i] - prev_flat_grad_[i], s[i] = d_[i] * t_;
      const double ys = dot(y, s);
      if (ys > 1e-10) {  // keeps the curvature pairs that leave the inverse Hessian positive definite
        if (static_cast<int64_t>(old_dirs_.size()) >= o.history_size) {
          old_dirs_.erase(old_dirs_.begin()), old_stps_.erase(old_stps_.begin()), ro_.erase(ro_.begin());
        }
        old_dirs_.push_back(y), old_stps_.push_back(s), ro_.push_back(1 / ys);
        h_diag_ = ys / dot(y, y);
      }
      // two-loop recursion: d = -H g
      const size_t k = old_dirs_.size();
      std::vector<double> al(k), q(g.size());
      for (size_t i = 0; i < g.size(); ++i) q[i] = -g[i];
      for (size_t i = k; i-- > 0;) {
        al[i] = dot(old_stps_[i], q) * ro_[i];
        for (size_t j = 0; j < q.size(); ++j) q[j] -= al[i] * old_dirs_[i][j];
      }
      for (double& x : q) x *= h_diag_;
      for (size_t i = 0; i < k; ++i) {
        const double be = dot(old_dirs_[i], q) * ro_[i];
        for (size_t j = 0; j < q.size(); ++j) q[j] += (al[i] - be) * old_stps_[i][j];
      }
      d_ = std::move(q);
    }
    prev_flat_grad_ = g;
    prev_loss_ = loss;
    double grad_l1 = 0;
    for (double x : g) grad_l1 += std::abs(x);
    t_ = n_iter_ == 1 ? std::min(1.0, 1.0 / grad_l1) * o.lr : o.lr;
    if (dot(g, d_) > -o.tolerance_change) break;  // not a descent direction
    add_to_params(t_, d_);
    bool converged = false;
    if (iter != o.max_iter) {
      loss = evaluate().item<double>();
      g = flat_grad();
      converged = abs_max(g) <= o.tolerance_grad;
      ++current_evals, ++func_evals_;
    }
    if (iter == o.max_iter || current_evals >= max_eval || converged) break;
    if (abs_max(d_) * std::abs(t_) <= o.tolerance_change) break;
    if (std::abs(loss - prev_loss_) < o.tolerance_change) break;
  }
  return orig_loss;
}

// ---- state dict -------------------------------------------------------------------------

StateDict LBFGS::state_dict() const {
  StateDict d = Optimizer::state_dict();
  d.scalars["lbfgs.n_iter"] = static_cast<double>(n_iter_);
  d.scalars["lbfgs.func_evals"] = static_cast<double>(func_evals_);
  d.scalars["lbfgs.t"] = t_;
  d.scalars["lbfgs.H_diag"] = h_diag_;
  d.scalars["lbfgs.prev_loss"] = prev_loss_;
  d.scalars["lbfgs.history"] = static_cast<double>(old_dirs_.size());
  d.tensors["lbfgs.d"] = to_tensor(d_);
  d.tensors["lbfgs.prev_flat_grad"] = to_tensor(prev_flat_grad_);
  d.tensors["lbfgs.ro"] = to_tensor(ro_);
  for (size_t i = 0; i < old_dirs_.size(); ++i) {
    d.tensors["lbfgs.old_dirs." + std::to_string(i)] = to_tensor(old_dirs_[i]);
    d.tensors["lbfgs.old_stps." + std::to_string(i)] = to_tensor(old_stps_[i]);
  }
  return d;
}

void LBFGS::load_state_dict(const StateDict& dict) {
  StateDict base = dict;
  auto take_scalar = [&](const std::string& k) {
    auto it = base.scalars.find(k);
    STRATA_CHECK(it != base.scalars.end(), "[LBFGS] load_state_dict: the state dict has no '{}'", k);
    const double v = it->second;
    base.scalars.erase(it);
    return v;
  };
  // n: the size the vector must have (SIZE_MAX: any); empty: whether it may instead be empty
  auto take_vector = [&](const std::string& k, size_t n, bool empty) {
    auto it = base.tensors.find(k);
    STRATA_CHECK(it != base.tensors.end(), "[LBFGS] load_state_dict: the state dict has no '{}'", k);
    std::vector<double> v = to_vector(it->second);
    STRATA_CHECK(n == SIZE_MAX || v.size() == n || (empty && v.empty()),
                 "[LBFGS] load_state_dict: '{}' has {} elements but the parameters have {}", k, v.size(), n);
    base.tensors.erase(it);
    return v;
  };
  size_t numel = 0;
  for (const Tensor& p : group_params(0)) numel += static_cast<size_t>(p.numel());
  const double history = take_scalar("lbfgs.history");
  STRATA_CHECK(history >= 0 && history <= 1e9 && history == std::floor(history),
               "[LBFGS] load_state_dict: 'lbfgs.history' is {}, not a count", history);
  // everything is read and checked before anything changes
  const auto n_iter = static_cast<int64_t>(take_scalar("lbfgs.n_iter"));
  const auto func_evals = static_cast<int64_t>(take_scalar("lbfgs.func_evals"));
  const double t = take_scalar("lbfgs.t"), h_diag = take_scalar("lbfgs.H_diag");
  const double prev_loss = take_scalar("lbfgs.prev_loss");
  // after the first iteration the next one reads the direction and the last grad
  STRATA_CHECK(n_iter >= 0 && func_evals >= 0, "[LBFGS] load_state_dict: negative counters (n_iter {}, func_evals {})",
               n_iter, func_evals);
  std::vector<double> d = take_vector("lbfgs.d", numel, n_iter == 0);
  std::vector<double> prev = take_vector("lbfgs.prev_flat_grad", numel, n_iter == 0);
  std::vector<double> ro = take_vector("lbfgs.ro", SIZE_MAX, true);
  STRATA_CHECK(ro.size() == static_cast<size_t>(history), "[LBFGS] load_state_dict: 'lbfgs.ro' has {} elements, not {}",
               ro.size(), history);
  std::vector<std::vector<double>> dirs, stps;
  for (size_t i = 0; i < static_cast<size_t>(history); ++i) {
    dirs.push_back(take_vector("lbfgs.old_dirs." + std::to_string(i), numel, false));
    stps.push_back(take_vector("lbfgs.old_stps." + std::to_string(i), numel, false));
  }
  Optimizer::load_state_dict(base);
  n_iter_ = n_iter, func_evals_ = func_evals, t_ = t, h_diag_ = h_diag, prev_loss_ = prev_loss;
  d_ = std::move(d), prev_flat_grad_ = std::move(prev), ro_ = std::move(ro);
  old_dirs_ = std::move(dirs), old_stps_ = std::move(stps);
}

}  // namespace strata::optim
