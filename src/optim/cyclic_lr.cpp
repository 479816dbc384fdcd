// CosineAnnealingWarmRestarts and CyclicLR.
#include <strata/optim/cyclic_lr.hpp>

#include <cmath>
#include <limits>
#include <numbers>

namespace strata::optim {

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(Optimizer& opt, int64_t T_0, int64_t T_mult, double eta_min)
    : LRScheduler(opt, "CosineAnnealingWarmRestarts"), t0_(T_0), t_mult_(T_mult), eta_min_(eta_min) {
  STRATA_CHECK(T_0 > 0, "[CosineAnnealingWarmRestarts] T_0 must be > 0, got {}", T_0);
  STRATA_CHECK(T_mult >= 1, "[CosineAnnealingWarmRestarts] T_mult must be >= 1, got {}", T_mult);
  STRATA_CHECK(std::isfinite(eta_min) && eta_min >= 0,
               "[CosineAnnealingWarmRestarts] eta_min must be finite and >= 0, got {}", eta_min);
  initial_step();
}

double CosineAnnealingWarmRestarts::lr_at(int64_t epoch, size_t g) const {
  // the position in the current period, counted in integers (PyTorch's log form rounds)
  int64_t t_cur = epoch, t_i = t0_;
  double period = static_cast<double>(t0_);
  if (t_mult_ == 1) {
    t_cur = epoch % t0_;
  } else {
    while (t_cur >= t_i) {
      t_cur -= t_i;
      // a period longer than int64 can count outlasts any step: t_cur is in it (no overflow)
      if (t_i > std::numeric_limits<int64_t>::max() / t_mult_) {
        period = static_cast<double>(t_i) * static_cast<double>(t_mult_);
        break;
      }
      t_i *= t_mult_;
      period = static_cast<double>(t_i);
    }
  }
  const double x = std::numbers::pi * static_cast<double>(t_cur) / period;
  return eta_min_ + (base_lrs_.at(g) - eta_min_) * (1 + std::cos(x)) / 2;
}

CyclicLR::CyclicLR(Optimizer& opt, double base_lr, double max_lr, CyclicLROptions options)
    : CyclicLR(opt, std::vector<double>(opt.num_param_groups(), base_lr),
               std::vector<double>(opt.num_param_groups(), max_lr), std::move(options)) {}

CyclicLR::CyclicLR(Optimizer& opt, std::vector<double> base_lrs, std::vector<double> max_lrs, CyclicLROptions o)
    : LRScheduler(opt, "CyclicLR"), max_lrs_(std::move(max_lrs)), o_(std::move(o)) {
  STRATA_CHECK(base_lrs.size() == base_lrs_.size() && max_lrs_.size() == base_lrs_.size(),
               "[CyclicLR] got {} base_lrs and {} max_lrs for {} param groups", base_lrs.size(), max_lrs_.size(),
               base_lrs_.size());
  for (size_t g = 0; g < base_lrs.size(); ++g) {
    STRATA_CHECK(std::isfinite(base_lrs[g]) && base_lrs[g] >= 0,
                 "[CyclicLR] base_lr of param group {} must be finite and >= 0, got {}", g, base_lrs[g]);
    STRATA_CHECK(std::isfinite(max_lrs_[g]) && max_lrs_[g] >= 0,
                 "[CyclicLR] max_lr of param group {} must be finite and >= 0, got {}", g, max_lrs_[g]);
  }
  const int64_t down = o_.step_size_down.value_or(o_.step_size_up);
  STRATA_CHECK(o_.step_size_up > 0, "[CyclicLR] step_size_up must be > 0, got {}", o_.step_size_up);
  STRATA_CHECK(down > 0, "[CyclicLR] step_size_down must be > 0, got {}", down);
  STRATA_CHECK(std::isfinite(o_.gamma) && o_.gamma > 0, "[CyclicLR] gamma must be finite and > 0, got {}", o_.gamma);
  STRATA_CHECK(!o_.cycle_momentum || opt.has_momentum(),
               "[CyclicLR] {} has no momentum or betas to cycle; pass cycle_momentum = false", opt.name());
  // either may be the larger (PyTorch allows both); each must be a valid momentum or beta1
  STRATA_CHECK(!o_.cycle_momentum || (o_.base_momentum >= 0 && o_.base_momentum < 1 && o_.max_momentum >= 0 &&
                                      o_.max_momentum < 1),
               "[CyclicLR] base_momentum ({}) and max_momentum ({}) must be in [0, 1)", o_.base_momentum,
               o_.max_momentum);
  total_size_ = static_cast<double>(o_.step_size_up + down);
  step_ratio_ = static_cast<double>(o_.step_size_up) / total_size_;
  for (size_t g = 0; g < base_lrs.size(); ++g) {
    base_lrs_[g] = base_lrs[g];
    opt.set_initial_lr(g, base_lrs[g]);
  }
  initial_step();
}

double CyclicLR::height(int64_t epoch) const {
  const double e = static_cast<double>(epoch);
  const double cycle = std::floor(1 + e / total_size_), x = 1 + e / total_size_ - cycle;
  const double rise = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
  double scale = 1;
  if (o_.scale_fn) {
    scale = o_.scale_fn(o_.scale_mode == CyclicLROptions::ScaleMode::Cycle ? cycle : e);
    STRATA_CHECK(std::isfinite(scale), "[CyclicLR] scale_fn returned {} at step {}", scale, epoch);
  } else if (o_.mode == CyclicLROptions::Mode::Triangular2) {
    scale = 1 / std::pow(2.0, cycle - 1);
  } else if (o_.mode == CyclicLROptions::Mode::ExpRange) {
    scale = std::pow(o_.gamma, e);
  }
  return rise * scale;
}

double CyclicLR::lr_at(int64_t epoch, size_t g) const {
  return base_lrs_.at(g) + (max_lrs_.at(g) - base_lrs_.at(g)) * height(epoch);
}

double CyclicLR::momentum_at(int64_t epoch) const {
  return o_.max_momentum - (o_.max_momentum - o_.base_momentum) * height(epoch);
}

void CyclicLR::apply(int64_t epoch) {
  LRScheduler::apply(epoch);
  if (o_.cycle_momentum) {
    const double m = momentum_at(epoch);
    for (size_t g = 0; g < base_lrs_.size(); ++g) opt_->set_momentum(g, m);
  }
}

}  // namespace strata::optim
