// Optimizer: parameter checks, the step loop, zero_grad, and state dicts.
//
// Note [Option changes]
// Options may change between steps, and some change what state a parameter keeps (AdamW's
// amsgrad, RMSprop's centered and momentum, Adam8bit's 8-bit storage and block size). Each
// step first brings every state to the layout of the current options (converted_state): a
// state the options no longer use is dropped, one they newly use is created by update() as at
// a first step (zeros, as PyTorch), and Adam8bit carries its moments across storage formats.
// The step count is kept. state_dict() saves states in the current layout too (a state the
// options newly use is absent until a step creates it, so load_state_dict takes such states
// as optional), so a dict taken after a change loads into an optimizer built with the new
// options, and the next step creates the same state in both.
#include <strata/optim/optimizer.hpp>

#include <cmath>
#include <map>
#include <tuple>
#include <unordered_set>

#include <strata/autograd/grad_mode.hpp>

#include "core/tensor_internal.h"
#include "optim/state_keys.h"
#include "optim/update_util.h"

namespace strata::optim {

namespace {

// `st` with each floating state in the dtype state_specs() gives it, or nullopt when all are:
// a parameter converted by Module::to(dtype) after some steps takes its states along (as
// load_state_dict converts a dict's). Never writes into a tensor: `st` may share them.
std::optional<ParamState> retyped(const std::vector<StateSpec>& specs, const ParamState& st) {
  std::optional<ParamState> out;
  for (const StateSpec& spec : specs) {
    auto it = st.tensors.find(spec.name);
    if (it == st.tensors.end() || !it->second.defined()) continue;
    const Tensor& t = it->second;
    if (t.dtype() == spec.dtype || !is_floating(t.dtype()) || !is_floating(spec.dtype)) continue;
    if (!out) out = st;
    out->tensors[spec.name] = t.to(spec.dtype);
  }
  return out;
}

using detail::parse_state_key;
using detail::state_key;

std::string group_scalar(size_t g, const char* field) { return fmt::format("group.{}.{}", g, field); }

}  // namespace

Optimizer::~Optimizer() = default;

std::vector<Tensor> Optimizer::params() const {
  std::vector<Tensor> all;
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : group_params(g)) all.push_back(p);
  return all;
}

double Optimizer::momentum(size_t) const {
  strata::detail::throw_error("[{}] has no momentum or betas hyperparameter", name_);
}
void Optimizer::set_momentum(size_t, double) {
  strata::detail::throw_error("[{}] has no momentum or betas hyperparameter", name_);
}

std::optional<double> Optimizer::initial_lr(size_t group) const {
  return group < initial_lrs_.size() ? initial_lrs_[group] : std::nullopt;
}

void Optimizer::set_initial_lr(size_t group, double lr) {
  STRATA_CHECK(group < num_param_groups(), "[{}] param group {} out of range (the optimizer has {})", name_, group,
               num_param_groups());
  STRATA_CHECK(std::isfinite(lr) && lr >= 0, "[{}] invalid initial_lr of param group {}: {} (must be finite and >= 0)",
               name_, group, lr);
  if (initial_lrs_.size() < num_param_groups()) initial_lrs_.resize(num_param_groups());
  initial_lrs_[group] = lr;
}

const ParamState* Optimizer::state(const Tensor& param) const {
  if (!param.defined()) return nullptr;
  auto it = state_.find(param.impl_ptr().get());
  return it == state_.end() ? nullptr : &it->second.state;
}

void Optimizer::check_param(const Tensor& p, size_t g, size_t i) const {
  STRATA_CHECK(p.defined(), "[{}] parameter {} of group {} is an undefined tensor", name_, i, g);
  STRATA_CHECK(is_floating(p.dtype()), "[{}] parameter {} of group {} has dtype {}: only floating tensors can be optimized",
               name_, i, g, p.dtype());
  STRATA_CHECK(p.dtype() == kFloat32 || p.dtype() == kFloat64,
               "[{}] parameter {} of group {} is {}: optimizers update float32 and float64 parameters; train {} "
               "models with float32 master weights",
               name_, i, g, p.dtype(), p.dtype());
  STRATA_CHECK(p.is_leaf(),
               "[{}] parameter {} of group {} is not a leaf tensor (it was computed by a recorded op); optimize the "
               "tensor it was computed from",
               name_, i, g);
  STRATA_CHECK(p.device().is_cpu() || p.device().is_cuda(),
               "[{}] parameter {} of group {} is on {}: optimizers update CPU and CUDA parameters", name_, i, g,
               p.device());
  STRATA_CHECK(p.is_contiguous(detail::param_format(p)),
               "[{}] parameter {} of group {} is neither contiguous nor channels-last (shape {}, strides {}): the "
               "fused update needs one of those layouts",
               name_, i, g, p.shape(), p.strides());
}

void Optimizer::check_params() const {
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> seen;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const std::vector<Tensor>& ps = group_params(g);
    for (size_t i = 0; i < ps.size(); ++i) {
      check_param(ps[i], g, i);
      auto [it, inserted] = seen.emplace(ps[i].impl_ptr().get(), std::make_pair(g, i));
      STRATA_CHECK(inserted, "[{}] parameter {} of group {} is listed twice (also parameter {} of group {})", name_, i,
                   g, it->second.second, it->second.first);
    }
  }
}

std::optional<ParamState> Optimizer::converted_state(size_t g, const Tensor& p, const ParamState& st) const {
  const std::vector<StateSpec> specs = state_specs(g, p);
  std::optional<ParamState> out;
  for (const auto& [name, t] : st.tensors) {
    bool used = false;
    for (const StateSpec& s : specs) used = used || s.name == name;
    if (used) continue;
    if (!out) out = st;
    out->tensors.erase(name);
  }
  return out;
}

void Optimizer::check_state(const Tensor& p, size_t g, const ParamState& st) const {
  for (const StateSpec& spec : state_specs(g, p)) {
    auto it = st.tensors.find(spec.name);
    if (it == st.tensors.end()) continue;  // update() creates missing state
    const Tensor& t = it->second;
    STRATA_CHECK(t.shape() == spec.shape && t.dtype() == spec.dtype,
                 "[{}] state '{}' of a parameter is {} {} but the parameter (shape {}, {}) needs {} {}: was the "
                 "parameter replaced after the optimizer was built?",
                 name_, spec.name, t.shape(), t.dtype(), p.shape(), p.dtype(), spec.shape, spec.dtype);
  }
}

Tensor Optimizer::step(const std::function<Tensor()>& closure) {
  Tensor loss;
  if (closure) {
    EnableGradGuard enable;
    loss = closure();
  }
  NoGradGuard no_grad;
  check_all_options();
  check_params();
  // every grad is checked before any parameter changes, so bad input leaves no half step
  struct Work {
    size_t group;
    Tensor param, grad;
  };
  std::vector<Work> work;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const std::vector<Tensor>& ps = group_params(g);
    for (size_t i = 0; i < ps.size(); ++i) {
      const Tensor& p = ps[i];
      const Tensor& grad = p.grad();
      if (!grad.defined()) continue;
      STRATA_CHECK(grad.shape() == p.shape() && grad.dtype() == p.dtype() && grad.device() == p.device(),
                   "[{}] the grad of parameter {} of group {} is {} {} on {}, but the parameter is {} {} on {}", name_,
                   i, g, grad.shape(), grad.dtype(), grad.device(), p.shape(), p.dtype(), p.device());
      work.push_back({g, p, detail::in_format(grad, detail::param_format(p))});  // Note [Parameter layouts]
    }
  }
  // every state in the layout of the current options (Note [Option changes]), committed only
  // once all are converted and checked
  std::vector<std::pair<ParamState*, ParamState>> converted;
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : group_params(g)) {
      auto it = state_.find(p.impl_ptr().get());
      if (it == state_.end()) continue;
      std::optional<ParamState> c = converted_state(g, p, it->second.state);
      if (auto r = retyped(state_specs(g, p), c ? *c : it->second.state)) c = std::move(r);
      if (p.grad().defined()) check_state(p, g, c ? *c : it->second.state);  // the states this step updates
      if (c) converted.emplace_back(&it->second.state, std::move(*c));
    }
  for (auto& [st, c] : converted) *st = std::move(c);
  mark_synced();
  // CPU parameters one at a time (one fused pass each); CUDA parameters in batches of one
  // group, device and dtype, each a few multi-tensor launches
  std::map<std::tuple<size_t, int, DType>, std::vector<ParamUpdate>> batches;
  for (Work& w : work) {
    Entry& e = state_[w.param.impl_ptr().get()];  // node-based: the reference outlives rehashing
    if (!e.param.defined()) e.param = w.param;
    for (auto& [name, t] : e.state.tensors) {  // the parameter moved or was laid out anew (Module::to)
      if (t.device() != w.param.device()) t = t.to(w.param.device());
      t = detail::state_layout(t, w.param);
    }
    if (w.param.device().is_cpu()) {
      update(w.group, w.param, w.grad, e.state);
      w.param.storage()->bump_version();
    } else {
      batches[{w.group, w.param.device().index, w.param.dtype()}].push_back({w.param, w.grad, &e.state});
    }
  }
  for (const auto& [key, batch] : batches) {
    update_cuda(std::get<0>(key), batch);
    for (const ParamUpdate& u : batch) u.param.storage()->bump_version();
  }
  return loss;
}

void Optimizer::update_cuda(size_t group, const std::vector<ParamUpdate>& batch) {
  for (const ParamUpdate& u : batch) update(group, u.param, u.grad, *u.state);
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : group_params(g)) strata::detail::clear_grad(p, set_to_none);
}

StateDict Optimizer::state_dict() const {
  NoGradGuard no_grad;
  StateDict d;
  d.type = name_;
  save_options(d.scalars);
  size_t index = 0;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const std::vector<Tensor>& ps = group_params(g);
    d.scalars[group_scalar(g, "num_params")] = static_cast<double>(ps.size());
    if (auto lr0 = initial_lr(g)) d.scalars[group_scalar(g, "initial_lr")] = *lr0;
    for (const Tensor& p : ps) {
      if (const ParamState* st = state(p)) {
        std::optional<ParamState> c = converted_state(g, p, *st);  // options changed since the last step
        if (auto r = retyped(state_specs(g, p), c ? *c : *st)) c = std::move(r);  // the parameter's dtype changed
        if (c) st = &*c;
        d.scalars[state_key(index, "step")] = static_cast<double>(st->step);
        for (const auto& [name, t] : st->tensors) d.tensors[state_key(index, name)] = t.clone();
      }
      ++index;
    }
  }
  return d;
}

std::function<void()> Optimizer::restore_point() {
  return [this, saved = state_dict()] { load_state_dict(saved); };
}

void Optimizer::load_state_dict(const StateDict& d) {
  NoGradGuard no_grad;
  STRATA_CHECK(d.type == name_, "[{}] load_state_dict: the state dict was saved by '{}', not by {}", name_, d.type,
               name_);
  const size_t groups = num_param_groups();
  for (size_t g = 0; g <= groups; ++g) {
    auto it = d.scalars.find(group_scalar(g, "num_params"));
    if (g == groups) {
      STRATA_CHECK(it == d.scalars.end(), "[{}] load_state_dict: the state dict has more than {} param groups", name_,
                   groups);
      break;
    }
    STRATA_CHECK(it != d.scalars.end(), "[{}] load_state_dict: the state dict has {} param groups, the optimizer {}",
                 name_, g, groups);
    STRATA_CHECK(it->second == static_cast<double>(group_params(g).size()),
                 "[{}] load_state_dict: param group {} has {} parameters in the state dict but {} here", name_, g,
                 it->second, group_params(g).size());
  }

  load_options(d.scalars);  // validated; nothing changes on Error
  std::unordered_map<const TensorImpl*, Entry> loaded;
  std::vector<std::optional<double>> lrs(groups);
  try {
    std::vector<std::vector<StateSpec>> specs;  // by global parameter index
    std::vector<const Tensor*> by_index;
    std::vector<size_t> group_of;
    for (size_t g = 0; g < groups; ++g) {
      if (auto it = d.scalars.find(group_scalar(g, "initial_lr")); it != d.scalars.end()) {
        STRATA_CHECK(std::isfinite(it->second) && it->second >= 0,
                     "[{}] load_state_dict: '{}' is {}, not an lr (must be finite and >= 0)", name_, it->first,
                     it->second);
        lrs[g] = it->second;
      }
      for (const Tensor& p : group_params(g)) {
        specs.push_back(state_specs(g, p));
        by_index.push_back(&p);
        group_of.push_back(g);
      }
    }
    // the dict's tensors by parameter: each must belong to a parameter with a step count
    std::map<size_t, std::map<std::string, Tensor>> dict_state;
    for (const auto& [key, t] : d.tensors) {
      size_t i = 0;
      std::string name;
      const bool known = parse_state_key(key, i, name) && i < specs.size() && d.scalars.count(state_key(i, "step"));
      STRATA_CHECK(known, "[{}] load_state_dict: unexpected entry '{}' in the state dict", name_, key);
      dict_state[i][name] = t;
    }
    for (size_t i = 0; i < by_index.size(); ++i) {
      auto step = d.scalars.find(state_key(i, "step"));
      if (step == d.scalars.end()) continue;
      const Tensor& p = *by_index[i];
      double s = step->second;
      STRATA_CHECK(std::isfinite(s) && s >= 0 && s == std::floor(s) && s < 9e15,
                   "[{}] load_state_dict: '{}' is {}, not a step count", name_, step->first, s);
      const ParamState from_dict =
          state_from_dict(group_of[i], p, ParamState{static_cast<int64_t>(s), std::move(dict_state[i])});
      Entry e{p, ParamState{from_dict.step, {}}};
      for (const StateSpec& spec : specs[i]) {
        const std::string key = state_key(i, spec.name);
        auto it = from_dict.tensors.find(spec.name);
        if (it == from_dict.tensors.end()) {
          STRATA_CHECK(!spec.required, "[{}] load_state_dict: the state dict has no '{}' for parameter {} (shape {})",
                       name_, key, i, p.shape());
          continue;
        }
        const Tensor& src = it->second;
        STRATA_CHECK(src.defined() && src.shape() == spec.shape,
                     "[{}] load_state_dict: '{}' has shape {} but parameter {} needs {}", name_, key,
                     src.defined() ? src.shape() : Shape{}, i, spec.shape);
        STRATA_CHECK(src.dtype() == spec.dtype || (is_floating(src.dtype()) && is_floating(spec.dtype)),
                     "[{}] load_state_dict: '{}' has dtype {} but parameter {} needs {}", name_, key, src.dtype(), i,
                     spec.dtype);
        Tensor t = detail::state_layout(src.to(p.device(), spec.dtype), p);
        if (t.storage() == src.storage()) t = t.clone();
        e.state.tensors[spec.name] = t;
      }
      // nothing in the dict may go unused: a stray entry means it came from another layout
      for (const auto& [name, t] : from_dict.tensors)
        STRATA_CHECK(e.state.tensors.count(name) > 0, "[{}] load_state_dict: unexpected entry '{}' in the state dict",
                     name_, state_key(i, name));
      loaded[p.impl_ptr().get()] = std::move(e);
    }
    for (const auto& [key, v] : d.scalars) {
      size_t i = 0;
      std::string name;
      if (parse_state_key(key, i, name))
        STRATA_CHECK(name == "step" && i < specs.size(), "[{}] load_state_dict: unexpected entry '{}' in the state dict",
                     name_, key);
    }
  } catch (...) {
    restore_options();
    throw;
  }
  state_ = std::move(loaded);
  initial_lrs_ = std::move(lrs);
  mark_synced();
}

}  // namespace strata::optim
