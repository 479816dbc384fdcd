// The schedules with more than a formula of the step: OneCycleLR (phases, momentum),
// SequentialLR (composition) and ReduceLROnPlateau (driven by a metric).
#include <strata/optim/scheduler.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace strata::optim {

// ---- OneCycleLR --------------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& opt, double max_lr, int64_t total_steps, OneCycleOptions options)
    : OneCycleLR(opt, std::vector<double>(opt.num_param_groups(), max_lr), total_steps, options) {}

OneCycleLR::OneCycleLR(Optimizer& opt, std::vector<double> max_lrs, int64_t total_steps, OneCycleOptions o)
    : LRScheduler(opt, "OneCycleLR"), max_lrs_(std::move(max_lrs)), total_(total_steps), o_(o) {
  STRATA_CHECK(total_steps > 0, "[OneCycleLR] total_steps must be > 0, got {}", total_steps);
  STRATA_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "[OneCycleLR] pct_start must be in [0, 1], got {}", o.pct_start);
  STRATA_CHECK(max_lrs_.size() == base_lrs_.size(), "[OneCycleLR] got {} max_lrs for {} param groups",
               max_lrs_.size(), base_lrs_.size());
  for (size_t g = 0; g < max_lrs_.size(); ++g)
    STRATA_CHECK(std::isfinite(max_lrs_[g]) && max_lrs_[g] >= 0,
                 "[OneCycleLR] max_lr of param group {} must be finite and >= 0, got {}", g, max_lrs_[g]);
  STRATA_CHECK(o.div_factor > 0 && o.final_div_factor > 0, "[OneCycleLR] div_factor and final_div_factor must be > 0");
  STRATA_CHECK(!o.cycle_momentum || opt.has_momentum(),
               "[OneCycleLR] {} has no momentum or betas to cycle; pass cycle_momentum = false", opt.name());
  const double pct = o.pct_start * static_cast<double>(total_steps), end = static_cast<double>(total_steps) - 1;
  if (o.three_phase)
    phases_ = {{pct - 1, 0, 1}, {2 * pct - 2, 1, 0}, {end, 0, 2}};
  else
    phases_ = {{pct - 1, 0, 1}, {end, 1, 2}};
  // the cycle starts from max_lr / div_factor, whatever lr the optimizer had
  for (size_t g = 0; g < max_lrs_.size(); ++g) {
    base_lrs_[g] = max_lrs_[g] / o.div_factor;
    opt.set_initial_lr(g, base_lrs_[g]);
  }
  initial_step();
}

void OneCycleLR::load_extra(const StateDict& d) {
  auto it = d.scalars.find("last_epoch");
  STRATA_CHECK(it == d.scalars.end() || it->second <= static_cast<double>(total_),
               "[OneCycleLR] load_state_dict: last_epoch {} is past the schedule's {} total steps", it->second, total_);
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (o_.anneal_strategy == OneCycleOptions::Anneal::Linear) return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
}

const OneCycleLR::Phase& OneCycleLR::phase_at(int64_t epoch, double& pct) const {
  STRATA_CHECK(epoch <= total_, "[OneCycleLR] tried to step {} times; the schedule has {} total steps", epoch, total_);
  double start = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& ph = phases_[i];
    if (static_cast<double>(epoch) <= ph.end_step || i + 1 == phases_.size()) {
      // A phase of zero length (pct_start * total_steps == 1, say) is at its end at once, where
      // PyTorch divides by zero. Step total_steps, one past the last phase, stays at the final
      // values, where PyTorch extrapolates (to a negative lr with linear annealing).
      const double len = ph.end_step - start;
      pct = len == 0 ? 1.0 : std::min(1.0, (static_cast<double>(epoch) - start) / len);
      return ph;
    }
    start = ph.end_step;
  }
  return phases_.back();  // unreachable: the last phase always matches
}

double OneCycleLR::lr_at(int64_t epoch, size_t g) const {
  double pct = 0;
  const Phase& ph = phase_at(epoch, pct);
  const double initial = max_lrs_.at(g) / o_.div_factor;
  const double lrs[3] = {initial, max_lrs_.at(g), initial / o_.final_div_factor};
  return anneal(lrs[ph.start_lr], lrs[ph.end_lr], pct);
}

double OneCycleLR::momentum_at(int64_t epoch) const {
  double pct = 0;
  const Phase& ph = phase_at(epoch, pct);
  // momentum moves against the lr: max momentum at the initial and min lrs, base at max_lr
  auto m = [&](int lr_index) { return lr_index == 1 ? o_.base_momentum : o_.max_momentum; };
  return anneal(m(ph.start_lr), m(ph.end_lr), pct);
}

void OneCycleLR::apply(int64_t epoch) {
  LRScheduler::apply(epoch);
  if (o_.cycle_momentum) {
    double m = momentum_at(epoch);
    for (size_t g = 0; g < base_lrs_.size(); ++g) opt_->set_momentum(g, m);
  }
}

// ---- ComposedLR, SequentialLR, ChainedScheduler -----------------------------------------

ComposedLR::ComposedLR(Optimizer& opt, std::string name, std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : LRScheduler(opt, std::move(name)), schedulers_(std::move(schedulers)) {
  STRATA_CHECK(!schedulers_.empty(), "[{}] needs at least one scheduler", name_);
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    STRATA_CHECK(schedulers_[i] != nullptr, "[{}] scheduler {} is null", name_, i);
    STRATA_CHECK(&schedulers_[i]->optimizer() == &opt, "[{}] scheduler {} ({}) is attached to another optimizer",
                 name_, i, schedulers_[i]->name());
  }
}

void ComposedLR::apply_child(size_t i, int64_t epoch) {
  LRScheduler& s = *schedulers_[i];
  s.apply(epoch);
  s.set_epoch(epoch);
}

void ComposedLR::save_extra(StateDict& d) const {
  for (size_t i = 0; i < schedulers_.size(); ++i)
    for (const auto& [k, v] : schedulers_[i]->state_dict().scalars) d.scalars[fmt::format("scheduler.{}.{}", i, k)] = v;
}

// All children load, or none changes. A dict without children's state (written before they
// were saved) leaves them as constructed, as loading it did then.
void ComposedLR::load_extra(const StateDict& d) {
  std::vector<StateDict> parts(schedulers_.size());
  bool any = false;
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    const std::string prefix = fmt::format("scheduler.{}.", i);
    parts[i].type = schedulers_[i]->name();
    for (auto it = d.scalars.lower_bound(prefix); it != d.scalars.end() && it->first.rfind(prefix, 0) == 0; ++it)
      parts[i].scalars[it->first.substr(prefix.size())] = it->second;
    any = any || !parts[i].scalars.empty();
  }
  if (!any) return;
  std::vector<StateDict> before;
  for (const auto& s : schedulers_) before.push_back(s->state_dict());
  size_t i = 0;
  try {
    for (; i < schedulers_.size(); ++i) {
      STRATA_CHECK(!parts[i].scalars.empty(), "[{}] load_state_dict: no state for scheduler {} ({})", name_, i,
                   schedulers_[i]->name());
      schedulers_[i]->load_state_dict(parts[i]);
    }
  } catch (...) {
    for (size_t j = 0; j < i; ++j) schedulers_[j]->load_state_dict(before[j]);
    throw;
  }
}

SequentialLR::SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : ComposedLR(opt, "SequentialLR", std::move(schedulers)), milestones_(std::move(milestones)) {
  STRATA_CHECK(milestones_.size() + 1 == schedulers_.size(),
               "[SequentialLR] got {} schedulers and {} milestones; there must be one milestone fewer",
               schedulers_.size(), milestones_.size());
  STRATA_CHECK(std::is_sorted(milestones_.begin(), milestones_.end()), "[SequentialLR] milestones must be ascending");
  initial_step();
}

size_t SequentialLR::index_at(int64_t epoch, int64_t& local) const {
  size_t idx = static_cast<size_t>(std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  local = idx == 0 ? epoch : epoch - milestones_[idx - 1];
  return idx;
}

double SequentialLR::lr_at(int64_t epoch, size_t g) const {
  int64_t local = 0;
  size_t idx = index_at(epoch, local);
  return schedulers_[idx]->lr_at(local, g);
}

void SequentialLR::apply(int64_t epoch) {
  int64_t local = 0;
  const size_t idx = index_at(epoch, local);
  apply_child(idx, local);
  last_lr_ = schedulers_[idx]->get_last_lr();
}

ChainedScheduler::ChainedScheduler(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers)
    : ComposedLR(opt, "ChainedScheduler", std::move(schedulers)) {
  initial_step();
}

double ChainedScheduler::lr_at(int64_t epoch, size_t g) const {
  double lr = base_lrs_.at(g);
  for (const auto& s : schedulers_) {
    const double base = s->base_lrs().at(g);
    lr *= base == 0 ? 0.0 : s->lr_at(epoch, g) / base;
  }
  return lr;
}

// The children first, for what else they set (momentum); then the product of their factors.
void ChainedScheduler::apply(int64_t epoch) {
  for (size_t i = 0; i < schedulers_.size(); ++i) apply_child(i, epoch);
  LRScheduler::apply(epoch);
}

// ---- ReduceLROnPlateau -------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& opt, ReduceLROnPlateauOptions o) : opt_(&opt), o_(std::move(o)) {
  STRATA_CHECK(o_.factor < 1.0 && o_.factor >= 0, "[ReduceLROnPlateau] factor must be in [0, 1), got {}", o_.factor);
  STRATA_CHECK(o_.patience >= 0 && o_.cooldown >= 0, "[ReduceLROnPlateau] patience and cooldown must be >= 0");
  if (o_.min_lrs.empty()) o_.min_lrs.assign(opt.num_param_groups(), o_.min_lr);
  STRATA_CHECK(o_.min_lrs.size() == opt.num_param_groups(), "[ReduceLROnPlateau] got {} min_lrs for {} param groups",
               o_.min_lrs.size(), opt.num_param_groups());
  best_ = o_.mode == ReduceLROnPlateauOptions::Mode::Min ? std::numeric_limits<double>::infinity()
                                                         : -std::numeric_limits<double>::infinity();
  for (size_t g = 0; g < opt.num_param_groups(); ++g) last_lr_.push_back(opt.lr(g));
}

bool ReduceLROnPlateau::is_better(double a) const {
  using M = ReduceLROnPlateauOptions::Mode;
  const bool rel = o_.threshold_mode == ReduceLROnPlateauOptions::ThresholdMode::Rel;
  if (o_.mode == M::Min) return rel ? a < best_ * (1 - o_.threshold) : a < best_ - o_.threshold;
  return rel ? a > best_ * (1 + o_.threshold) : a > best_ + o_.threshold;
}

void ReduceLROnPlateau::step(double metric) {
  STRATA_CHECK(opt_->num_param_groups() == o_.min_lrs.size(),
               "[ReduceLROnPlateau] the optimizer has {} param groups but the scheduler was built for {}",
               opt_->num_param_groups(), o_.min_lrs.size());
  ++last_epoch_;
  if (is_better(metric)) {
    best_ = metric;
    num_bad_ = 0;
  } else {
    ++num_bad_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_ = 0;  // no bad epochs counted during cooldown
  }
  if (num_bad_ > o_.patience) {
    for (size_t g = 0; g < o_.min_lrs.size(); ++g) {
      double old_lr = opt_->lr(g), new_lr = std::max(old_lr * o_.factor, o_.min_lrs[g]);
      if (old_lr - new_lr > o_.eps) opt_->set_lr(g, new_lr);
    }
    cooldown_counter_ = o_.cooldown;
    num_bad_ = 0;
  }
  last_lr_.clear();
  for (size_t g = 0; g < o_.min_lrs.size(); ++g) last_lr_.push_back(opt_->lr(g));
}

StateDict ReduceLROnPlateau::state_dict() const {
  StateDict d;
  d.type = "ReduceLROnPlateau";
  d.scalars = {{"best", best_},
               {"num_bad_epochs", static_cast<double>(num_bad_)},
               {"cooldown_counter", static_cast<double>(cooldown_counter_)},
               {"last_epoch", static_cast<double>(last_epoch_)}};
  for (size_t g = 0; g < last_lr_.size(); ++g) d.scalars[fmt::format("last_lr.{}", g)] = last_lr_[g];
  return d;
}

void ReduceLROnPlateau::load_state_dict(const StateDict& d) {
  STRATA_CHECK(d.type == "ReduceLROnPlateau",
               "[ReduceLROnPlateau] load_state_dict: the state dict was saved by '{}', not by ReduceLROnPlateau", d.type);
  auto get = [&](const std::string& k) {
    auto it = d.scalars.find(k);
    STRATA_CHECK(it != d.scalars.end(), "[ReduceLROnPlateau] load_state_dict: the state dict has no '{}'", k);
    return it->second;
  };
  auto count = [&](const std::string& k) {
    double v = get(k);
    STRATA_CHECK(v >= 0 && v < 9e15 && v == std::floor(v), "[ReduceLROnPlateau] load_state_dict: bad '{}': {}", k, v);
    return static_cast<int64_t>(v);
  };
  STRATA_CHECK(!d.scalars.count(fmt::format("last_lr.{}", last_lr_.size())),
               "[ReduceLROnPlateau] load_state_dict: the state dict is for more than {} param groups", last_lr_.size());
  std::vector<double> lrs;
  for (size_t g = 0; g < last_lr_.size(); ++g) lrs.push_back(get(fmt::format("last_lr.{}", g)));
  for (double lr : lrs)
    STRATA_CHECK(std::isfinite(lr) && lr >= 0, "[ReduceLROnPlateau] load_state_dict: last_lr {} is not an lr (must "
                 "be finite and >= 0)", lr);
  double best = get("best");
  STRATA_CHECK(!std::isnan(best), "[ReduceLROnPlateau] load_state_dict: best is NaN");
  int64_t bad = count("num_bad_epochs"), cool = count("cooldown_counter"), epoch = count("last_epoch");
  best_ = best, num_bad_ = bad, cooldown_counter_ = cool, last_epoch_ = epoch, last_lr_ = std::move(lrs);
}

}  // namespace strata::optim
