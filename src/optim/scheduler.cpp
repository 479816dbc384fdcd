// LRScheduler and the closed-form schedules: LambdaLR, StepLR, MultiStepLR, ExponentialLR,
// CosineAnnealingLR, LinearLR, ConstantLR, MultiplicativeLR, PolynomialLR and the warmup-decay
// family.
#include <strata/optim/scheduler.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numbers>

namespace strata::optim {

namespace {

std::string key(const char* what, size_t g) { return fmt::format("{}.{}", what, g); }

double get_scalar(const StateDict& d, const std::string& k, const std::string& who) {
  auto it = d.scalars.find(k);
  STRATA_CHECK(it != d.scalars.end(), "[{}] load_state_dict: the state dict has no '{}'", who, k);
  return it->second;
}

double get_lr(const StateDict& d, const std::string& k, const std::string& who) {
  const double lr = get_scalar(d, k, who);
  STRATA_CHECK(std::isfinite(lr) && lr >= 0, "[{}] load_state_dict: '{}' is {}, not an lr (must be finite and >= 0)",
               who, k, lr);
  return lr;
}

// gamma 0 is allowed: the lr drops to 0, a valid lr, as PyTorch allows any gamma
void check_gamma(const char* who, double gamma) {
  STRATA_CHECK(std::isfinite(gamma) && gamma >= 0, "[{}] gamma must be finite and >= 0, got {}", who, gamma);
}

}  // namespace

// ---- LRScheduler -------------------------------------------------------------------------

namespace {
std::atomic<uint64_t> next_scheduler_id{1};
}  // namespace

LRScheduler::LRScheduler(Optimizer& opt, std::string name)
    : opt_(&opt), name_(std::move(name)), id_(next_scheduler_id.fetch_add(1)) {
  for (size_t g = 0; g < opt.num_param_groups(); ++g) {
    if (!opt.initial_lr(g)) opt.set_initial_lr(g, opt.lr(g));
    base_lrs_.push_back(*opt.initial_lr(g));
  }
}

LRScheduler::~LRScheduler() = default;

void LRScheduler::initial_step() {
  last_epoch_ = -1;
  advance();
}

void LRScheduler::advance() {
  STRATA_CHECK(opt_->num_param_groups() == base_lrs_.size(),
               "[{}] the optimizer has {} param groups but the scheduler was built for {}", name_,
               opt_->num_param_groups(), base_lrs_.size());
  apply(last_epoch_ + 1);
  last_epoch_ += 1;
}

void LRScheduler::step() {
  // Two schedulers stepped in turn would overwrite each other's lr (each is a closed form); one
  // that replaces another is fine, as the replaced one is not stepped again.
  STRATA_CHECK(!stepped_ || opt_->last_scheduler_ == id_,
               "[{}] another scheduler stepped this optimizer since this one's last step; the lr would be "
               "whichever stepped last, not both schedules. Step one scheduler: compose several with "
               "ChainedScheduler (the product of their factors) or SequentialLR (one after another)",
               name_);
  advance();
  stepped_ = true;
  opt_->last_scheduler_ = id_;
}

void LRScheduler::apply(int64_t epoch) {
  std::vector<double> lrs(base_lrs_.size());
  for (size_t g = 0; g < lrs.size(); ++g) {  // may raise: set nothing before
    lrs[g] = lr_at(epoch, g);
    // caught here rather than as the optimizer's "invalid lr" at its next step
    STRATA_CHECK(std::isfinite(lrs[g]) && lrs[g] >= 0,
                 "[{}] step {} gives param group {} the lr {} (base lr {}); an lr must be finite and >= 0", name_,
                 epoch, g, lrs[g], base_lrs_[g]);
  }
  for (size_t g = 0; g < lrs.size(); ++g) opt_->set_lr(g, lrs[g]);
  last_lr_ = std::move(lrs);
}

StateDict LRScheduler::state_dict() const {
  StateDict d;
  d.type = name_;
  d.scalars["last_epoch"] = static_cast<double>(last_epoch_);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    d.scalars[key("base_lr", g)] = base_lrs_[g];
    if (g < last_lr_.size()) d.scalars[key("last_lr", g)] = last_lr_[g];
  }
  save_extra(d);
  return d;
}

void LRScheduler::load_state_dict(const StateDict& d) {
  STRATA_CHECK(d.type == name_, "[{}] load_state_dict: the state dict was saved by '{}', not by {}", name_, d.type,
               name_);
  const size_t groups = base_lrs_.size();
  STRATA_CHECK(!d.scalars.count(key("base_lr", groups)) && (groups == 0 || d.scalars.count(key("base_lr", groups - 1))),
               "[{}] load_state_dict: the state dict is for another number of param groups (this scheduler has {})",
               name_, groups);
  double epoch = get_scalar(d, "last_epoch", name_);
  STRATA_CHECK(epoch >= -1 && epoch < 9e15 && epoch == std::floor(epoch), "[{}] load_state_dict: bad last_epoch {}",
               name_, epoch);
  std::vector<double> base(groups), last(groups);
  for (size_t g = 0; g < groups; ++g) {
    base[g] = get_lr(d, key("base_lr", g), name_);
    last[g] = get_lr(d, key("last_lr", g), name_);
  }
  load_extra(d);
  last_epoch_ = static_cast<int64_t>(epoch);
  base_lrs_ = std::move(base);
  last_lr_ = std::move(last);
}

// ---- closed forms ------------------------------------------------------------------------

LambdaLR::LambdaLR(Optimizer& opt, Lambda lambda) : LambdaLR(opt, std::vector<Lambda>(opt.num_param_groups(), lambda)) {}

LambdaLR::LambdaLR(Optimizer& opt, std::vector<Lambda> lambdas) : LRScheduler(opt, "LambdaLR"), lambdas_(std::move(lambdas)) {
  STRATA_CHECK(lambdas_.size() == base_lrs_.size(), "[LambdaLR] got {} lambdas for {} param groups", lambdas_.size(),
               base_lrs_.size());
  for (const Lambda& f : lambdas_) STRATA_CHECK(static_cast<bool>(f), "[LambdaLR] a lambda is empty");
  initial_step();
}

double LambdaLR::lr_at(int64_t epoch, size_t g) const {
  const double f = lambdas_.at(g)(epoch);
  STRATA_CHECK(std::isfinite(f) && f >= 0,
               "[LambdaLR] the lambda of param group {} returned {} at step {}; the factor must be finite and >= 0", g,
               f, epoch);
  return base_lrs_.at(g) * f;
}

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma)
    : LRScheduler(opt, "StepLR"), step_size_(step_size), gamma_(gamma) {
  STRATA_CHECK(step_size > 0, "[StepLR] step_size must be > 0, got {}", step_size);
  check_gamma("StepLR", gamma);
  initial_step();
}

double StepLR::lr_at(int64_t epoch, size_t g) const {
  return base_lrs_.at(g) * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

MultiStepLR::MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(opt, "MultiStepLR"), milestones_(std::move(milestones)), gamma_(gamma) {
  STRATA_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()), "[MultiStepLR] milestones must be ascending");
  check_gamma("MultiStepLR", gamma);
  initial_step();
}

double MultiStepLR::lr_at(int64_t epoch, size_t g) const {
  auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  return base_lrs_.at(g) * std::pow(gamma_, static_cast<double>(passed));
}

ExponentialLR::ExponentialLR(Optimizer& opt, double gamma) : LRScheduler(opt, "ExponentialLR"), gamma_(gamma) {
  check_gamma("ExponentialLR", gamma);
  initial_step();
}

double ExponentialLR::lr_at(int64_t epoch, size_t g) const {
  return base_lrs_.at(g) * std::pow(gamma_, static_cast<double>(epoch));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t T_max, double eta_min)
    : LRScheduler(opt, "CosineAnnealingLR"), t_max_(T_max), eta_min_(eta_min) {
  STRATA_CHECK(T_max > 0, "[CosineAnnealingLR] T_max must be > 0, got {}", T_max);
  STRATA_CHECK(std::isfinite(eta_min) && eta_min >= 0, "[CosineAnnealingLR] eta_min must be finite and >= 0, got {}",
               eta_min);
  initial_step();
}

double CosineAnnealingLR::lr_at(int64_t epoch, size_t g) const {
  double x = std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(t_max_);
  return eta_min_ + (base_lrs_.at(g) - eta_min_) * (1 + std::cos(x)) / 2;
}

LinearLR::LinearLR(Optimizer& opt, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(opt, "LinearLR"), start_(start_factor), end_(end_factor), total_(total_iters) {
  STRATA_CHECK(start_factor > 0 && start_factor <= 1, "[LinearLR] start_factor must be in (0, 1], got {}",
               start_factor);
  STRATA_CHECK(end_factor >= 0 && end_factor <= 1, "[LinearLR] end_factor must be in [0, 1], got {}", end_factor);
  STRATA_CHECK(total_iters > 0, "[LinearLR] total_iters must be > 0, got {}", total_iters);
  initial_step();
}

double LinearLR::lr_at(int64_t epoch, size_t g) const {
  double t = static_cast<double>(std::min(epoch, total_)) / static_cast<double>(total_);
  return base_lrs_.at(g) * (start_ + (end_ - start_) * t);
}

ConstantLR::ConstantLR(Optimizer& opt, double factor, int64_t total_iters)
    : LRScheduler(opt, "ConstantLR"), factor_(factor), total_(total_iters) {
  STRATA_CHECK(factor >= 0 && factor <= 1, "[ConstantLR] factor must be in [0, 1], got {}", factor);
  STRATA_CHECK(total_iters >= 0, "[ConstantLR] total_iters must be >= 0, got {}", total_iters);
  initial_step();
}

double ConstantLR::lr_at(int64_t epoch, size_t g) const { return base_lrs_.at(g) * (epoch < total_ ? factor_ : 1.0); }

MultiplicativeLR::MultiplicativeLR(Optimizer& opt, Lambda lambda)
    : MultiplicativeLR(opt, std::vector<Lambda>(opt.num_param_groups(), lambda)) {}

MultiplicativeLR::MultiplicativeLR(Optimizer& opt, std::vector<Lambda> lambdas)
    : LRScheduler(opt, "MultiplicativeLR"), lambdas_(std::move(lambdas)) {
  STRATA_CHECK(lambdas_.size() == base_lrs_.size(), "[MultiplicativeLR] got {} lambdas for {} param groups",
               lambdas_.size(), base_lrs_.size());
  for (const Lambda& f : lambdas_) STRATA_CHECK(static_cast<bool>(f), "[MultiplicativeLR] a lambda is empty");
  products_.assign(lambdas_.size(), {0, 1.0});
  initial_step();
}

double MultiplicativeLR::lr_at(int64_t epoch, size_t g) const {
  STRATA_CHECK(epoch >= 0, "[MultiplicativeLR] step {} is negative", epoch);
  auto& [at, prod] = products_.at(g);
  if (epoch < at) at = 0, prod = 1.0;
  while (at < epoch) {
    const int64_t e = at + 1;
    const double f = lambdas_[g](e);
    STRATA_CHECK(std::isfinite(f) && f >= 0,
                 "[MultiplicativeLR] the lambda of param group {} returned {} at step {}; the factor must be finite "
                 "and >= 0",
                 g, f, e);
    prod *= f;
    at = e;
  }
  return base_lrs_[g] * prod;
}

PolynomialLR::PolynomialLR(Optimizer& opt, int64_t total_iters, double power)
    : LRScheduler(opt, "PolynomialLR"), total_(total_iters), power_(power) {
  STRATA_CHECK(total_iters > 0, "[PolynomialLR] total_iters must be > 0, got {}", total_iters);
  STRATA_CHECK(std::isfinite(power) && power >= 0, "[PolynomialLR] power must be finite and >= 0, got {}", power);
  initial_step();
}

double PolynomialLR::lr_at(int64_t epoch, size_t g) const {
  const double t = static_cast<double>(std::min(epoch, total_)) / static_cast<double>(total_);
  return base_lrs_.at(g) * std::pow(1 - t, power_);
}

WarmupDecayLR::WarmupDecayLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double min_lr, Decay decay)
    : LRScheduler(opt, decay == Decay::None ? "LinearWarmup" : decay == Decay::Linear ? "WarmupLinear" : "WarmupCosine"),
      warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr), decay_(decay) {
  STRATA_CHECK(warmup_steps >= 0, "[{}] warmup_steps must be >= 0, got {}", name_, warmup_steps);
  STRATA_CHECK(decay == Decay::None || total_steps > warmup_steps,
               "[{}] total_steps ({}) must be greater than warmup_steps ({})", name_, total_steps, warmup_steps);
  STRATA_CHECK(std::isfinite(min_lr) && min_lr >= 0, "[{}] min_lr must be finite and >= 0, got {}", name_, min_lr);
  initial_step();
}

double WarmupDecayLR::lr_at(int64_t epoch, size_t g) const {
  const double base = base_lrs_.at(g);
  if (epoch < warmup_) return base * static_cast<double>(epoch) / static_cast<double>(warmup_);
  if (decay_ == Decay::None) return base;
  double progress = static_cast<double>(epoch - warmup_) / static_cast<double>(total_ - warmup_);
  progress = std::clamp(progress, 0.0, 1.0);
  double f = decay_ == Decay::Linear ? 1 - progress : 0.5 * (1 + std::cos(std::numbers::pi * progress));
  return min_lr_ + (base - min_lr_) * f;
}

}  // namespace strata::optim
