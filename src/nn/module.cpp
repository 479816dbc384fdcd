// Module bookkeeping: registration, traversal with dotted names, device/dtype moves in place,
// and state_dict loading that reports every mismatch at once.
#include <algorithm>
#include <set>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/module.hpp>

#include "core/tensor_internal.h"
#include "nn/module_state_hooks.h"

namespace strata::nn {

Tensor Module::forward(const Tensor&) {
  detail::throw_error("[{}] this module does not take a single tensor input", name());
}

void Module::check_new_name(const std::string& name) const {
  STRATA_CHECK(!name.empty() && name.find('.') == std::string::npos,
               "[{}] invalid name \"{}\": names are non-empty and contain no '.'", this->name(), name);
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.first == name; });
  };
  bool child = std::any_of(children_.begin(), children_.end(), [&](const Child& c) { return c.name == name; });
  STRATA_CHECK(!taken(params_) && !taken(buffers_) && !child, "[{}] name \"{}\" is already registered", this->name(),
               name);
}

Tensor Module::register_parameter(std::string name, Tensor value, bool requires_grad) {
  check_new_name(name);
  STRATA_CHECK(value.defined(), "[{}] parameter \"{}\" is undefined", this->name(), name);
  STRATA_CHECK(is_floating(value.dtype()), "[{}] parameter \"{}\" must be floating, got {}", this->name(), name,
               value.dtype());
  Tensor p = value.is_leaf() ? value : value.detach();
  p.requires_grad_(requires_grad);
  params_.emplace_back(std::move(name), p);
  return p;
}

Tensor Module::register_buffer(std::string name, Tensor value, bool persistent) {
  check_new_name(name);
  buffers_.emplace_back(std::move(name), value);
  buffer_persistent_.push_back(persistent);
  return value;
}

Tensor Module::remove_buffer(const std::string& name) {
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].first == name) {
      Tensor value = buffers_[i].second;
      buffers_.erase(buffers_.begin() + static_cast<std::ptrdiff_t>(i));
      buffer_persistent_.erase(buffer_persistent_.begin() + static_cast<std::ptrdiff_t>(i));
      return value;
    }
  detail::throw_error("[{}] no buffer named \"{}\"", this->name(), name);
}

bool Module::is_persistent_buffer(const std::string& name) const {
  for (size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].first == name) return buffer_persistent_[i];
  return false;
}

void Module::set_tensor(const std::string& name, const Tensor& value) {
  for (auto* list : {&params_, &buffers_})
    for (auto& [n, t] : *list)
      if (n == name) {
        // set_data changes the value every handle shares; an undefined tensor has none to share,
        // so the module's own member would not see a new value
        STRATA_CHECK(t.defined(), "[{}] \"{}\" was registered undefined and cannot take a value: register it with "
                     "a tensor", this->name(), name);
        t.set_data(value);
        return;
      }
  detail::throw_error("[{}] no parameter or buffer named \"{}\"", this->name(), name);
}

std::unique_ptr<Module> Module::unregister(const std::string& name) {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].first == name) {
      params_.erase(params_.begin() + static_cast<std::ptrdiff_t>(i));
      return nullptr;
    }
  for (auto it = children_.begin(); it != children_.end(); ++it)
    if (it->name == name) {
      STRATA_CHECK(it->owned != nullptr, "[{}] child \"{}\" is a data member and cannot be removed", this->name(),
                   name);
      std::unique_ptr<Module> child = std::move(it->owned);
      children_.erase(it);
      return child;
    }
  detail::throw_error("[{}] no parameter or child named \"{}\"", this->name(), name);
}

Module& Module::get_submodule(const std::string& target) const {
  if (target.empty()) return const_cast<Module&>(*this);
  auto [parent, child] = find_child(target);
  STRATA_CHECK(child != nullptr, "[{}] no submodule \"{}\"", parent->name(), target);
  return *parent->child_at(*child);
}

std::pair<Module*, Module::Child*> Module::find_child(const std::string& target) const {
  Module* parent = const_cast<Module*>(this);
  size_t start = 0;
  for (;;) {
    const size_t dot = target.find('.', start);
    const std::string part = target.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    Child* found = nullptr;
    for (Child& c : parent->children_)
      if (c.name == part) found = &c;
    if (dot == std::string::npos || found == nullptr) return {parent, found};
    parent = parent->child_at(*found);
    start = dot + 1;
  }
}

bool Module::owns_submodule(const std::string& target) const {
  if (target.empty()) return false;
  auto [parent, child] = find_child(target);
  return child != nullptr && child->owned != nullptr;
}

std::unique_ptr<Module> Module::set_submodule(const std::string& target, std::unique_ptr<Module> module) {
  STRATA_CHECK(module != nullptr, "[{}] set_submodule(\"{}\"): the module is null", name(), target);
  auto [parent, child] = find_child(target);
  STRATA_CHECK(child != nullptr, "[{}] set_submodule: no submodule \"{}\"", name(), target);
  STRATA_CHECK(child->owned != nullptr, "[{}] set_submodule: \"{}\" ({}) is a data member of its parent and cannot "
               "be replaced (Note [Member children]); hold it in a container or register it as a std::unique_ptr",
               name(), target, parent->child_at(*child)->name());
  parent->replacing_child(child->owned.get(), module.get());
  std::swap(child->owned, module);
  return module;
}

void Module::add_member_child(std::string name, Module& child) {
  check_new_name(name);
  STRATA_CHECK(&child != this, "[{}] a module cannot be its own child", this->name());
  // Note [Member children]: the offset is only meaningful for a data member of this module
  const std::ptrdiff_t offset = reinterpret_cast<char*>(&child) - reinterpret_cast<char*>(this);
  STRATA_CHECK(offset >= static_cast<std::ptrdiff_t>(sizeof(Module)) && offset <= kMaxMemberOffset,
               "[{}] child \"{}\" ({}) is not a data member of this module (it lies {} bytes from it), so moving "
               "the module would lose it; register a module that lives elsewhere as a std::unique_ptr, or keep "
               "several in an nn::ModuleList",
               this->name(), name, child.name(), offset);
  children_.push_back(Child{std::move(name), offset, nullptr});
}

void Module::add_owned_child(std::string name, std::unique_ptr<Module> child) {
  check_new_name(name);
  STRATA_CHECK(child != nullptr, "[{}] child \"{}\" is null", this->name(), name);
  children_.push_back(Child{std::move(name), 0, std::move(child)});
}

Module* Module::child_at(const Child& c) const {
  if (c.owned) return c.owned.get();
  return reinterpret_cast<Module*>(const_cast<char*>(reinterpret_cast<const char*>(this)) + c.offset);
}

std::vector<std::pair<std::string, Module*>> Module::registered_children() const {
  std::vector<std::pair<std::string, Module*>> out;
  for (const Child& c : children_) out.emplace_back(c.name, child_at(c));
  return out;
}

namespace {

// The entries of `all` whose object (key(entry)) has not come before: a module or tensor
// registered under two names is listed once, under the first, as PyTorch lists it. Entries
// without an object (key null: an undefined tensor) are all kept.
template <class T, class Key>
std::vector<T> first_of_each(std::vector<T> all, Key key) {
  std::set<const void*> seen;
  std::vector<T> out;
  for (T& e : all) {
    const void* k = key(e);
    if (!k || seen.insert(k).second) out.push_back(std::move(e));
  }
  return out;
}

const void* tensor_key(const std::pair<std::string, Tensor>& e) {
  return e.second.defined() ? e.second.impl_ptr().get() : nullptr;
}

}  // namespace

std::vector<std::pair<std::string, Module*>> Module::named_children() const {
  return first_of_each(registered_children(), [](const auto& e) -> const void* { return e.second; });
}

std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (auto& [name, m] : named_children()) out.push_back(m);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  std::vector<std::pair<std::string, Module*>> stack{{"", this}};
  std::set<const Module*> seen;
  while (!stack.empty()) {  // pre-order, children in registration order
    auto [prefix, m] = stack.back();
    stack.pop_back();
    if (!seen.insert(m).second) continue;  // a module registered twice is listed once
    out.emplace_back(prefix, m);
    auto kids = m->named_children();
    for (auto it = kids.rbegin(); it != kids.rend(); ++it)
      stack.emplace_back(prefix.empty() ? it->first : prefix + "." + it->first, it->second);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::registered_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out = params_;
  for (const auto& [cname, child] : registered_children())
    for (auto& [n, t] : child->registered_parameters()) out.emplace_back(cname + "." + n, t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  return first_of_each(recurse ? registered_parameters() : params_, tensor_key);
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out = buffers_;
  if (recurse)
    for (const auto& [cname, child] : named_children())
      for (auto& [n, t] : child->named_buffers(true)) out.emplace_back(cname + "." + n, t);
  std::erase_if(out, [](const auto& e) { return !e.second.defined(); });  // a None buffer is not listed
  return first_of_each(std::move(out), tensor_key);
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (Module* c : children()) c->apply(fn);
  fn(*this);
  return *this;
}

Module& Module::train(bool on) {
  training_ = on;
  for (Module* c : children()) c->train(on);
  return *this;
}

template <class F> void Module::for_each_tensor(F&& f) {
  for (auto& [n, m] : named_modules()) {
    for (auto& [pn, p] : m->params_) f(p, true);
    for (auto& [bn, b] : m->buffers_)
      if (b.defined()) f(b, false);  // an undefined buffer (PyTorch's None) stays so
  }
}

namespace {
// t (a parameter or buffer) and its grad replaced by convert of each, in place: handles held
// elsewhere (an optimizer's) see the change.
// A converted tensor keeps a channels-last layout (unless the conversion is to a layout), as
// PyTorch's to() keeps the memory format: model.to(ChannelsLast) then to(kFloat16) or to a
// device still reads NHWC weights.
template <class Convert>
void replace_in_place(Tensor& t, Convert convert, bool keep_channels_last = true) {
  auto keep_layout = [&](const Tensor& from) {
    Tensor to = convert(from);
    const bool channels_last = keep_channels_last && from.dim() == 4 && !from.is_contiguous() &&
                               from.is_contiguous(MemoryFormat::ChannelsLast);
    return channels_last && !to.is_contiguous(MemoryFormat::ChannelsLast) ? to.to(MemoryFormat::ChannelsLast) : to;
  };
  Tensor data = keep_layout(t), grad = t.grad().defined() ? keep_layout(t.grad()) : Tensor();
  t.set_data(data);
  if (grad.defined()) t.set_grad(grad);
}
}  // namespace

Module& Module::to(Device device, DType dtype) {
  STRATA_CHECK(is_floating(dtype), "[{}] to(): parameters can only be converted to a floating dtype, got {}", name(),
               dtype);
  NoGradGuard no_grad;
  for_each_tensor([&](Tensor& t, bool) {
    DType target = is_floating(t.dtype()) ? dtype : t.dtype();
    if (t.device() == device && t.dtype() == target) return;
    replace_in_place(t, [&](const Tensor& x) { return x.to(device, target); });
  });
  return *this;
}

Module& Module::to(Device device) {
  NoGradGuard no_grad;
  for_each_tensor([&](Tensor& t, bool) {
    if (t.device() != device) replace_in_place(t, [&](const Tensor& x) { return x.to(device); });
  });
  return *this;
}

Module& Module::to(DType dtype) {
  STRATA_CHECK(is_floating(dtype), "[{}] to(): parameters can only be converted to a floating dtype, got {}", name(),
               dtype);
  NoGradGuard no_grad;
  for_each_tensor([&](Tensor& t, bool) {
    if (is_floating(t.dtype()) && t.dtype() != dtype) replace_in_place(t, [&](const Tensor& x) { return x.to(dtype); });
  });
  return *this;
}

Module& Module::to(MemoryFormat format) {
  NoGradGuard no_grad;
  for_each_tensor([&](Tensor& t, bool) {
    if (t.dim() == 4 && !t.is_contiguous(format))
      replace_in_place(t, [&](const Tensor& x) { return x.to(format); }, false);
  });
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) strata::detail::clear_grad(p, set_to_none);
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

StateDict Module::state_dict() const {
  StateDictHooks::state_dict_pre(*this);
  StateDict out = own_state_dict();
  StateDictHooks::state_dict_post(*this, out);
  return out;
}

StateDict Module::own_state_dict() const {
  // detached aliases, as PyTorch's state_dict(keep_vars=False): writing into them changes the
  // module, but they are not graph leaves, so in-place edits need no no_grad
  StateDict out;
  for (auto& [n, t] : registered_parameters()) out.emplace(n, t.detach());
  // persistent buffers only
  visit_prefixed([&](const std::string& prefix, const Module& m) {
    for (size_t i = 0; i < m.buffers_.size(); ++i) {
      const auto& [bn, b] = m.buffers_[i];
      if (m.buffer_persistent_[i] && b.defined()) out.emplace(prefix + bn, b.detach());
    }
  });
  return out;
}

void Module::visit_prefixed(const std::function<void(const std::string&, const Module&)>& f) const {
  std::vector<std::pair<std::string, const Module*>> stack{{"", this}};
  while (!stack.empty()) {
    auto [prefix, m] = stack.back();
    stack.pop_back();
    f(prefix, *m);
    for (auto& [cn, c] : m->registered_children()) stack.emplace_back(prefix + cn + ".", c);
  }
}

namespace {
// A load's findings, before anything is written.
struct StateDictCheck {
  LoadResult keys;  // missing (optional keys excluded) and unexpected
  std::vector<std::string> mismatches, unwritable;
  std::vector<std::string> problems(bool strict) const {
    std::vector<std::string> out;
    if (strict && !keys.missing_keys.empty())
      out.push_back(fmt::format("missing keys: {}", fmt::join(keys.missing_keys, ", ")));
    if (strict && !keys.unexpected_keys.empty())
      out.push_back(fmt::format("unexpected keys: {}", fmt::join(keys.unexpected_keys, ", ")));
    if (!mismatches.empty()) out.push_back(fmt::format("shape mismatches: {}", fmt::join(mismatches, "; ")));
    if (!unwritable.empty()) out.push_back(fmt::format("cannot be written: {}", fmt::join(unwritable, "; ")));
    return out;
  }
};

StateDictCheck compare_state_dict(const StateDict& own, const StateDict& dict, const std::set<std::string>& optional) {
  StateDictCheck c;
  for (const auto& [k, t] : own) {
    auto it = dict.find(k);
    if (it == dict.end()) {
      if (!optional.count(k)) c.keys.missing_keys.push_back(k);
    } else if (!it->second.defined()) {
      c.mismatches.push_back(fmt::format("{} is undefined in the state dict", k));
    } else if (!Module::shape_loads_into(it->second, t)) {
      c.mismatches.push_back(fmt::format("{} is {} {} in the state dict, {} {} in the module", k, it->second.dtype(),
                                         it->second.shape(), t.dtype(), t.shape()));
    } else {
      try {  // a destination copy_ would refuse (an expanded buffer) is found before anything is written
        strata::detail::check_writable(t, "load_state_dict");
      } catch (const Error& e) {
        c.unwritable.push_back(fmt::format("{}: {}", k, e.what()));
      }
    }
  }
  for (const auto& [k, t] : dict)
    if (!own.count(k)) c.keys.unexpected_keys.push_back(k);
  return c;
}
}  // namespace

bool Module::shape_loads_into(const Tensor& saved, const Tensor& into) {
  return saved.shape() == into.shape() || (into.dim() == 0 && saved.shape() == Shape{1});
}

std::set<std::string> Module::all_optional_state_keys() const {
  std::set<std::string> optional;
  visit_prefixed([&](const std::string& prefix, const Module& m) {
    for (const std::string& k : m.optional_state_keys()) optional.insert(prefix + k);
  });
  return optional;
}

namespace {
// The dict a load compares with the module: `given` after the load pre-hooks, which edit a copy
// (kept in `edited`) so that the caller's dict stays as it was.
const StateDict& after_load_pre_hooks(Module& m, const StateDict& given, StateDict& edited) {
  if (!StateDictHooks::has_load_pre(m)) return given;
  edited = given;
  StateDictHooks::load_pre(m, edited);
  return edited;
}
}  // namespace

std::vector<std::string> Module::check_state_dict(const StateDict& given, bool strict) const {
  // judged as load_state_dict judges: after the load pre-hooks (they get the module as a load
  // gives it to them), and missing or unexpected keys left to the load when post-hooks may clear them
  StateDict edited;
  const StateDict& dict = after_load_pre_hooks(const_cast<Module&>(*this), given, edited);
  const bool post_hooks = StateDictHooks::has_load_post(*this);
  return compare_state_dict(own_state_dict(), dict, all_optional_state_keys()).problems(strict && !post_hooks);
}

LoadResult Module::load_state_dict(const StateDict& given, bool strict) {
  StateDict edited;
  const StateDict& dict = after_load_pre_hooks(*this, given, edited);
  StateDict own = own_state_dict();
  StateDictCheck check = compare_state_dict(own, dict, all_optional_state_keys());
  // with post-hooks, missing and unexpected keys are judged after them (they may clear some)
  const bool post_hooks = StateDictHooks::has_load_post(*this);
  auto raise_for = [&](const std::vector<std::string>& problems) {
    if (!problems.empty())
      throw Error(fmt::format("[load_state_dict] {} does not match the state dict:\n  {}", name(),
                              fmt::join(problems, "\n  ")));
  };
  raise_for(check.problems(strict && !post_hooks));  // nothing has been written yet
  std::vector<std::pair<Tensor, Tensor>> written;     // (destination, its old value), kept for the post-hooks
  {
    NoGradGuard no_grad;
    for (auto& [k, t] : own) {
      auto it = dict.find(k);
      if (it == dict.end()) continue;
      if (post_hooks) written.emplace_back(t, t.clone());
      t.copy_(it->second.reshape(t.shape()));
    }
  }
  if (!post_hooks) return check.keys;
  LoadResult keys = check.keys;
  try {
    StateDictHooks::load_post(*this, keys);
    raise_for(StateDictCheck{keys, {}, {}}.problems(strict));
  } catch (...) {
    // last written first: a tensor under two names (tied weights) ends with the value it had
    NoGradGuard no_grad;
    for (auto it = written.rbegin(); it != written.rend(); ++it) it->first.copy_(it->second);
    throw;
  }
  return keys;
}

}  // namespace strata::nn
