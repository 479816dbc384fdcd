// GradScaler: torch.amp.GradScaler's stages (ready, unscaled, stepped per optimizer, reset by
// update) and its scale update rule, _amp_update_scale_: on an inf/NaN the scale is multiplied
// by backoff_factor and the tracker reset; otherwise the tracker counts clean steps and, at
// growth_interval, the scale is multiplied by growth_factor (kept only when finite) and the
// tracker reset. Products are taken in double and rounded to float, as PyTorch's kernels do.
// The host keeps the authoritative scale and tracker; the device copy of the scale only
// multiplies the loss and divides the gradients, so the update never reads the device.
#include <strata/amp/grad_scaler.hpp>

#include <cmath>
#include <string>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

namespace strata::amp {

namespace {

void check_options(const GradScalerOptions& o, const char* where) {
  STRATA_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0,
               "[GradScaler] {}init_scale must be finite and > 0, got {}", where, o.init_scale);
  STRATA_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1,
               "[GradScaler] {}growth_factor must be finite and > 1, got {}", where, o.growth_factor);
  STRATA_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1, "[GradScaler] {}backoff_factor must be in (0, 1), got {}",
               where, o.backoff_factor);
  STRATA_CHECK(o.growth_interval > 0, "[GradScaler] {}growth_interval must be > 0, got {}", where, o.growth_interval);
}

float rounded_scale(double value) { return static_cast<float>(value); }

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  if (options_.enabled) check_options(options_, "");
  scale_value_ = rounded_scale(options_.init_scale);
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  STRATA_CHECK(loss.defined(), "[GradScaler] scale: the loss is undefined");
  STRATA_CHECK(is_floating(loss.dtype()), "[GradScaler] scale: the loss must be floating, got {}", loss.dtype());
  if (!scale_.defined() || !(scale_.device() == loss.device()))
    scale_ = full({}, static_cast<double>(scale_value_), TensorOptions(kFloat32, loss.device()));
  return loss * scale_;
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  OptimizerState& st = per_optimizer_[&optimizer];
  STRATA_CHECK(st.stage != Stage::Unscaled,
               "[GradScaler] unscale_() has already been called on this optimizer since the last update()");
  STRATA_CHECK(st.stage != Stage::Stepped, "[GradScaler] unscale_() is being called after step()");
  NoGradGuard no_grad;
  // 1 / scale in double, rounded to float, as PyTorch's scale.double().reciprocal().float(); filled
  // on each device rather than copied there, so no copy waits for the device
  const double inv = static_cast<float>(1.0 / static_cast<double>(scale_value_));
  std::vector<Tensor> inv_by_device;
  const std::vector<Tensor> params = optimizer.params();
  for (size_t i = 0; i < params.size(); ++i)  // all checked before any gradient changes
    STRATA_CHECK(!params[i].grad().defined() || params[i].grad().dtype() != kFloat16,
                 "[GradScaler] unscale_: parameter {} has a float16 gradient; keep parameters in float32 and let "
                 "autocast cast them",
                 i);
  for (const Tensor& p : params) {
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    size_t d = 0;
    while (d < st.found_inf.size() && !(st.found_inf[d].device() == g.device())) ++d;
    if (d == st.found_inf.size()) {  // the first gradient on this device (found_inf starts empty)
      st.found_inf.push_back(full({}, false, TensorOptions(kBool, g.device())));
      inv_by_device.push_back(full({}, inv, TensorOptions(kFloat32, g.device())));
    }
    // the scaled values are checked, as PyTorch does
    st.found_inf[d] = logical_or(st.found_inf[d], any(logical_not(isfinite(g))));
    g.mul_(inv_by_device[d]);
  }
  st.stage = Stage::Unscaled;
  st.found_inf_host = -1;
}

bool GradScaler::local_found_inf(const OptimizerState& st) {
  bool any_inf = false;
  for (const Tensor& f : st.found_inf) any_inf = any_inf || f.item<bool>();  // one sync per device
  return any_inf;
}

bool GradScaler::found_inf(OptimizerState& st) {
  if (st.found_inf_host < 0) st.found_inf_host = agree_on_found_inf(local_found_inf(st), verdict_device()) ? 1 : 0;
  return st.found_inf_host == 1;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  OptimizerState* st = &per_optimizer_[&optimizer];
  STRATA_CHECK(st->stage != Stage::Stepped, "[GradScaler] step() has already been called since the last update()");
  if (st->stage == Stage::Ready) unscale_(optimizer);
  st = &per_optimizer_[&optimizer];
  const bool skip = found_inf(*st);
  if (!skip) optimizer.step();
  st->stage = Stage::Stepped;
  return !skip;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  bool any_record = false, inf = false, any_unread = false, unread_inf = false;
  for (auto& [opt, st] : per_optimizer_) {
    if (st.stage == Stage::Ready) continue;
    any_record = true;
    if (st.found_inf_host >= 0) {
      inf = inf || st.found_inf_host == 1;
    } else {  // unscaled, never stepped
      any_unread = true;
      unread_inf = local_found_inf(st) || unread_inf;
    }
  }
  STRATA_CHECK(any_record, "[GradScaler] update: no inf checks were recorded before update() (call step() or "
                           "unscale_() first)");
  // One verdict for all the unread ones, so every rank of a ShardedGradScaler issues the same
  // collectives whatever order this map (keyed by each rank's own pointers) iterates in.
  if (any_unread) inf = agree_on_found_inf(unread_inf, verdict_device()) || inf;
  if (inf) {
    scale_value_ = rounded_scale(static_cast<double>(scale_value_) * options_.backoff_factor);
    growth_tracker_ = 0;
  } else if (growth_tracker_ + 1 == options_.growth_interval) {
    const float grown = rounded_scale(static_cast<double>(scale_value_) * options_.growth_factor);
    if (std::isfinite(grown)) scale_value_ = grown;
    growth_tracker_ = 0;
  } else {
    ++growth_tracker_;
  }
  if (scale_.defined()) scale_.fill_(static_cast<double>(scale_value_));
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  STRATA_CHECK(std::isfinite(new_scale) && new_scale > 0,
               "[GradScaler] update: new_scale must be finite and > 0, got {}", new_scale);
  scale_value_ = rounded_scale(new_scale);
  if (scale_.defined()) scale_.fill_(static_cast<double>(scale_value_));
  per_optimizer_.clear();
}

double GradScaler::get_scale() const { return options_.enabled ? static_cast<double>(scale_value_) : 1.0; }

optim::StateDict GradScaler::state_dict() const {
  optim::StateDict d{"GradScaler", {}, {}};
  if (!options_.enabled) return d;
  d.scalars = {{"scale", static_cast<double>(scale_value_)},
               {"growth_factor", options_.growth_factor},
               {"backoff_factor", options_.backoff_factor},
               {"growth_interval", static_cast<double>(options_.growth_interval)},
               {"_growth_tracker", static_cast<double>(growth_tracker_)}};
  return d;
}

void GradScaler::load_state_dict(const optim::StateDict& dict) {
  if (!options_.enabled) return;
  STRATA_CHECK(dict.type == "GradScaler", "[GradScaler] load_state_dict: the state dict is a {}'s, not a GradScaler's",
               dict.type);
  STRATA_CHECK(!dict.scalars.empty(),
               "[GradScaler] load_state_dict: the state dict is empty, possibly because it was saved from a disabled "
               "GradScaler");
  auto get = [&](const std::string& key) {
    auto it = dict.scalars.find(key);
    STRATA_CHECK(it != dict.scalars.end(), "[GradScaler] load_state_dict: the state dict has no '{}'", key);
    return it->second;
  };
  auto integer = [&](const std::string& key) {
    const double v = get(key);
    STRATA_CHECK(v >= 0 && v < 9e18 && v == std::floor(v), "[GradScaler] load_state_dict: '{}' is {}, not an integer "
                 ">= 0", key, v);
    return static_cast<int64_t>(v);
  };
  GradScalerOptions o = options_;
  o.init_scale = get("scale");
  o.growth_factor = get("growth_factor");
  o.backoff_factor = get("backoff_factor");
  o.growth_interval = integer("growth_interval");
  const int64_t tracker = integer("_growth_tracker");
  check_options(o, "load_state_dict: ");
  STRATA_CHECK(static_cast<double>(rounded_scale(o.init_scale)) == o.init_scale,
               "[GradScaler] load_state_dict: scale {} is not a float32 value", o.init_scale);
  options_ = o;
  scale_value_ = rounded_scale(o.init_scale);
  growth_tracker_ = tracker;
  if (scale_.defined()) scale_.fill_(static_cast<double>(scale_value_));
}

}  // namespace strata::amp
