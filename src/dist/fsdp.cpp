// FullyShardedDataParallel: the choice and checks of the units, the wrappers nested in the
// module, construction and the forward's saved-tensor hooks. The per-unit steps are in
// fsdp_runtime.cpp, no_sync, summon_full_params and clipping in fsdp_guards.cpp, the state dicts
// in fsdp_state.cpp.
#include <strata/dist/fsdp.hpp>

#include <algorithm>
#include <mutex>
#include <set>
#include <unordered_map>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/creation.hpp>

#include "dist/fsdp_runtime.h"
#include "dist/model_sync.h"
#include "dist/working_copy.h"

namespace strata::dist {

namespace {

// Every module inside a live wrapper, so that no module is wrapped twice, and the root module of
// each, so that a wrapper built around it later nests it.
std::mutex wrapped_mutex;
std::set<const nn::Module*>& wrapped_modules() {
  static std::set<const nn::Module*> modules;
  return modules;
}
std::unordered_map<const nn::Module*, std::weak_ptr<detail::FsdpRuntime>>& wrapper_roots() {
  static std::unordered_map<const nn::Module*, std::weak_ptr<detail::FsdpRuntime>> roots;
  return roots;
}

// A saved tensor the caller's saved-tensor hooks packed.
struct OuterSave {
  std::any packed;
};

bool is_inside(const std::string& name, const std::string& ancestor) {
  return ancestor.empty() || name.rfind(ancestor + ".", 0) == 0;
}

// The wrappers nested in the module tree: their root modules' names and runtimes.
struct Nested {
  std::vector<std::string> names;
  std::vector<std::weak_ptr<detail::FsdpRuntime>> runtimes;
  bool contains(const std::string& name) const {
    return std::any_of(names.begin(), names.end(), [&](const auto& n) { return name == n || is_inside(name, n); });
  }
};

Nested find_nested(const std::vector<std::pair<std::string, nn::Module*>>& modules) {
  Nested nested;
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  for (const auto& [name, m] : modules) {
    if (nested.contains(name) || !wrapped_modules().count(m)) continue;
    const auto root = wrapper_roots().find(m);
    STRATA_CHECK(!name.empty() && root != wrapper_roots().end(),
                 "[FullyShardedDataParallel] module '{}' ({}) is already inside another FullyShardedDataParallel; a "
                 "wrapper may hold wrappers built before it over its submodules (nested wrappers), but not lie "
                 "inside one: build the inner wrappers first, or make inner modules units with wrap_modules or "
                 "auto_wrap_policy",
                 name.empty() ? "<root>" : name, m->name());
    nested.names.push_back(name);
    nested.runtimes.push_back(root->second);
  }
  return nested;
}

// The unit of module `name`: its parameters not in units below it (`mine`), checked.
detail::FlatUnit make_unit(const std::string& name, nn::Module& m, std::vector<std::pair<std::string, Tensor>> mine,
                           int64_t shards) {
  detail::FlatUnit unit;
  unit.name = name;
  unit.module = &m;
  const Tensor& first = mine.front().second;
  unit.requires_grad = first.requires_grad();
  unit.device = first.device();
  for (auto& [pname, p] : mine) {
    const std::string full_name = name.empty() ? pname : name + "." + pname;
    STRATA_CHECK(is_floating(p.dtype()) && p.dtype() == first.dtype() && p.device() == first.device(),
                 "[FullyShardedDataParallel] unit '{}' holds parameters of different dtypes or devices ('{}' is {} "
                 "on {}, '{}' is {} on {}); one unit's parameters form one flat parameter of one floating dtype",
                 name, unit.param_names.empty() ? full_name : unit.param_names.front(), first.dtype(),
                 first.device(), full_name, p.dtype(), p.device());
    STRATA_CHECK(p.requires_grad() == unit.requires_grad,
                 "[FullyShardedDataParallel] unit '{}' mixes parameters that require grad and frozen ones ('{}'); "
                 "wrap the frozen ones in a unit of their own",
                 name, full_name);
    unit.params.push_back(p);
    unit.param_names.push_back(full_name);
    unit.offsets.push_back(unit.numel);
    unit.shapes.push_back(p.shape());
    unit.numels.push_back(p.numel());
    unit.numel += p.numel();
  }
  unit.padded = std::max<int64_t>(1, (unit.numel + shards - 1) / shards) * shards;
  return unit;
}

// A parameter must lie in one unit with every module that registers it (a tied weight, a shared
// submodule), or that module's forward would meet it freed; and two parameters must not share
// memory (flattening would untie them). Every registration name is in the state dict.
void check_ties(nn::Module& root, const std::vector<std::pair<std::string, nn::Module*>>& modules,
                const std::vector<std::vector<std::pair<std::string, Tensor>>>& unit_params) {
  std::unordered_map<const Storage*, std::pair<size_t, std::string>> unit_of_memory;  // -> (module, name)
  for (size_t i = 0; i < unit_params.size(); ++i)
    for (const auto& [pname, p] : unit_params[i]) {
      const auto [it, fresh] = unit_of_memory.try_emplace(p.storage().get(), i, pname);
      STRATA_CHECK(fresh,
                   "[FullyShardedDataParallel] parameters '{}' (of '{}') and '{}' (of '{}') are two tensors sharing "
                   "memory; flattening would untie them: register one tensor object in both modules instead",
                   it->second.second, modules[it->second.first].first, pname, modules[i].first);
    }
  for (const auto& [key, t] : root.state_dict()) {
    if (!t.defined()) continue;
    const auto it = unit_of_memory.find(t.storage().get());
    if (it == unit_of_memory.end()) continue;  // a buffer
    const size_t dot = key.rfind('.');
    const std::string path = dot == std::string::npos ? "" : key.substr(0, dot);
    const std::string& unit = modules[it->second.first].first;
    STRATA_CHECK(path == unit || is_inside(path, unit),
                 "[FullyShardedDataParallel] parameter '{}' belongs to unit '{}', which does not contain '{}': a "
                 "parameter shared between modules (a tied weight, a shared submodule) must lie inside one unit "
                 "with every module that uses it; make their common ancestor the unit instead",
                 key, unit.empty() ? "<root>" : unit, path.empty() ? "<root>" : path);
  }
}

// The units: the root, the modules in wrap_modules and those the policy picks (children before
// parents), each with the parameters no unit below it holds; in pre-order of the module tree.
std::vector<detail::FlatUnit> choose_units(nn::Module& root, const FSDPOptions& o, int64_t shards,
                                           const Nested& nested) {
  const auto modules = root.named_modules();
  std::vector<bool> is_unit(modules.size(), false);
  is_unit[0] = true;
  for (size_t i = 0; i < o.wrap_modules.size(); ++i) {
    const nn::Module* m = o.wrap_modules[i];
    STRATA_CHECK(m != nullptr, "[FullyShardedDataParallel] wrap_modules[{}] is null", i);
    const auto it = std::find_if(modules.begin(), modules.end(), [&](const auto& e) { return e.second == m; });
    STRATA_CHECK(it != modules.end(),
                 "[FullyShardedDataParallel] wrap_modules[{}] ({}) is not a submodule of the wrapped module ({}): a "
                 "unit must lie inside the module the wrapper is given",
                 i, m->name(), root.name());
    const auto index = static_cast<size_t>(it - modules.begin());
    STRATA_CHECK(index > 0, "[FullyShardedDataParallel] wrap_modules[{}] is the wrapped module itself, which is "
                 "always the root unit", i);
    STRATA_CHECK(!is_unit[index], "[FullyShardedDataParallel] wrap_modules lists '{}' twice", it->first);
    STRATA_CHECK(!nested.contains(it->first), "[FullyShardedDataParallel] wrap_modules[{}] ('{}') lies inside a "
                 "nested wrapper, which manages its parameters", i, it->first);
    is_unit[index] = true;
  }
  std::unordered_map<const TensorImpl*, size_t> owner;  // parameter -> the module index of its unit
  std::vector<std::vector<std::pair<std::string, Tensor>>> unit_params(modules.size());
  for (const auto& [name, m] : modules)  // a nested wrapper's parameters are its own
    if (nested.contains(name))
      for (const Tensor& p : m->parameters()) owner[p.impl_ptr().get()] = SIZE_MAX;
  for (size_t i = modules.size(); i-- > 0;) {  // reverse pre-order: every module after those below it
    const auto& [name, m] = modules[i];
    if (nested.contains(name)) continue;
    std::vector<std::pair<std::string, Tensor>> mine;
    int64_t numel = 0;
    for (auto& [pname, p] : m->named_parameters()) {
      if (owner.count(p.impl_ptr().get())) continue;  // in a unit below
      mine.emplace_back(pname, p);
      numel += p.numel();
    }
    if (!is_unit[i] && !(i > 0 && o.auto_wrap_policy && o.auto_wrap_policy(name, *m, numel))) continue;
    is_unit[i] = true;
    for (auto& [pname, p] : mine) owner[p.impl_ptr().get()] = i;
    unit_params[i] = std::move(mine);
  }
  check_ties(root, modules, unit_params);
  std::vector<detail::FlatUnit> units;
  for (size_t i = 0; i < modules.size(); ++i)
    if (is_unit[i] && !unit_params[i].empty())
      units.push_back(make_unit(modules[i].first, *modules[i].second, std::move(unit_params[i]), shards));
  STRATA_CHECK(!units.empty(), "[FullyShardedDataParallel] the wrapped module ({}) has no parameters{}", root.name(),
               nested.names.empty() ? "" : " outside the wrappers nested in it");
  return units;
}

void check_mixed_precision(const MixedPrecision& mp) {
  const std::pair<const char*, const std::optional<DType>*> fields[] = {
      {"param_dtype", &mp.param_dtype}, {"reduce_dtype", &mp.reduce_dtype}, {"buffer_dtype", &mp.buffer_dtype}};
  for (const auto& [name, dtype] : fields)
    STRATA_CHECK(!*dtype || is_floating(**dtype),
                 "[FullyShardedDataParallel] mixed_precision.{} must be a floating dtype, got {}", name, **dtype);
}

}  // namespace

AutoWrapPolicy size_based_auto_wrap_policy(int64_t min_num_params) {
  STRATA_CHECK(min_num_params > 0, "[size_based_auto_wrap_policy] min_num_params must be positive, got {}",
               min_num_params);
  return [min_num_params](const std::string&, nn::Module&, int64_t unwrapped) { return unwrapped >= min_num_params; };
}

FullyShardedDataParallel::FullyShardedDataParallel(nn::Module& module, FSDPOptions options) : module_(module) {
  check_mixed_precision(options.mixed_precision);
  const auto modules = module_.named_modules();
  const Nested nested = find_nested(modules);
  std::set<const TensorImpl*> nested_params;
  for (const auto& [name, m] : modules)
    if (nested.contains(name))
      for (const Tensor& p : m->parameters()) nested_params.insert(p.impl_ptr().get());
  std::vector<Tensor> own_params;  // the nested wrappers' are theirs to check and broadcast
  for (const Tensor& p : module_.parameters())
    if (!nested_params.count(p.impl_ptr().get())) own_params.push_back(p);
  std::vector<Tensor> state = own_params;
  for (const Tensor& b : module_.buffers())
    if (b.defined()) state.push_back(b);
  const auto [group, replicate] = detail::resolve_groups(options, state.empty() ? Device() : state.front().device());
  std::vector<ProcessGroup*> groups{group.get()};
  if (replicate) groups.insert(groups.begin(), replicate.get());  // (r, s) <- (r, 0) <- (0, 0)
  detail::check_same_model(groups, state, "FullyShardedDataParallel");
  if (options.sync_module_states) {
    NoGradGuard no_grad;
    for (ProcessGroup* g : groups) {
      if (g->size() == 1) continue;
      detail::broadcast_from_rank0(*g, own_params);
      detail::broadcast_from_rank0(*g, module_.buffers());
    }
  }
  const int64_t shards = options.sharding_strategy == ShardingStrategy::NoShard ? 1 : group->size();
  runtime_ = std::make_shared<detail::FsdpRuntime>(module_, group, replicate, options,
                                                   choose_units(module_, options, shards, nested));
  runtime_->nested = nested.runtimes;
  runtime_->install();
  runtime_->cast_buffers(/*original=*/false);
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  for (const auto& [name, m] : modules)
    if (!nested.contains(name)) runtime_->own_modules.push_back(m);
  for (const nn::Module* m : runtime_->own_modules) wrapped_modules().insert(m);
  wrapper_roots()[&module_] = runtime_;
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  runtime_->uninstall();
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  for (const nn::Module* m : runtime_->own_modules) wrapped_modules().erase(m);
  wrapper_roots().erase(&module_);
}

std::unique_ptr<autograd::SavedTensorHooksGuard> FullyShardedDataParallel::begin_forward() {
  STRATA_CHECK(!runtime_->summoned, "[FullyShardedDataParallel] forward inside summon_full_params(); run it outside");
  // the nested wrappers too: one without a root unit learns of a new pass from nothing else, and
  // one whose last backward raised would otherwise trace nothing in this forward
  for (const auto& r : runtime_->with_nested()) {
    r->reset();
    r->begin_forward_pass();
  }
  // The wrapper keeps the tensors aliasing gathered parameters itself and hands every other one to
  // the caller's hooks, if any are active (activation checkpointing or compression around it).
  auto [outer_pack, outer_unpack] = autograd::current_saved_tensor_hooks();
  std::weak_ptr<detail::FsdpRuntime> weak = runtime_;
  return std::make_unique<autograd::SavedTensorHooksGuard>(
      [weak, outer_pack = std::move(outer_pack)](const Tensor& t) -> std::any {
        std::any packed = t;
        if (auto self = weak.lock()) packed = self->pack(t);
        if (outer_pack && std::any_cast<Tensor>(&packed)) return OuterSave{outer_pack(t)};
        return packed;
      },
      [weak, outer_unpack = std::move(outer_unpack)](const std::any& packed) -> Tensor {
        if (const auto* t = std::any_cast<Tensor>(&packed)) return *t;
        if (const auto* outer = std::any_cast<OuterSave>(&packed)) return outer_unpack(outer->packed);
        auto self = weak.lock();
        STRATA_CHECK(self != nullptr, "[FullyShardedDataParallel] the backward needs a unit's parameters, but the "
                     "wrapper is gone; keep it alive until the backward has run");
        return self->unpack(packed);
      });
}

void FullyShardedDataParallel::rethrow_forward_error(const Error& e) const {
  if (!runtime_->frees_after_forward()) throw;
  throw Error(fmt::format("{}\n[FullyShardedDataParallel] note: under FullShard a unit's parameters are 0-element "
                          "tensors outside its forward and backward; a parameter used outside its unit (a weight "
                          "tied across units) meets one",
                          e.what()));
}

Tensor FullyShardedDataParallel::forward(const Tensor& input) {
  const MixedPrecision& mp = runtime_->mixed_precision();
  if (mp.param_dtype && mp.cast_root_forward_inputs && input.defined() && is_floating(input.dtype()) &&
      input.dtype() != *mp.param_dtype)
    return forward_with([&] { return module_(input.to(*mp.param_dtype)); });
  return forward_with([&] { return module_(input); });
}

std::vector<Tensor> FullyShardedDataParallel::parameters() const {
  std::vector<Tensor> shards;
  for (const auto& r : runtime_->with_nested())
    for (const auto& unit : r->units()) shards.push_back(unit.shard);
  return shards;
}

std::shared_ptr<ProcessGroup> FullyShardedDataParallel::process_group() const { return runtime_->group_ptr(); }
std::shared_ptr<ProcessGroup> FullyShardedDataParallel::replicate_group() const { return runtime_->replicate_ptr(); }
ShardingStrategy FullyShardedDataParallel::sharding_strategy() const { return runtime_->strategy(); }
const MixedPrecision& FullyShardedDataParallel::mixed_precision() const { return runtime_->mixed_precision(); }

FullyShardedDataParallel& FullyShardedDataParallel::train(bool on) {
  module_.train(on);
  return *this;
}

std::vector<std::string> FullyShardedDataParallel::unit_names() const {
  std::vector<std::string> names;
  for (const auto& unit : runtime_->units()) names.push_back(unit.name);
  return names;
}

std::vector<std::string> FullyShardedDataParallel::unit_parameter_names(size_t unit) const {
  STRATA_CHECK(unit < runtime_->units().size(), "[FullyShardedDataParallel] unit {} is out of range ({} units)", unit,
               runtime_->units().size());
  return runtime_->units()[unit].param_names;
}

bool FullyShardedDataParallel::is_gathered(size_t unit) const {
  STRATA_CHECK(unit < runtime_->units().size(), "[FullyShardedDataParallel] unit {} is out of range ({} units)", unit,
               runtime_->units().size());
  return runtime_->units()[unit].full.defined();
}

void FullyShardedDataParallel::record_gather_events(bool on) {
  if (on) runtime_->gather_events.emplace();
  else runtime_->gather_events.reset();
}

std::vector<GatherEvent> FullyShardedDataParallel::gather_events() const {
  return runtime_->gather_events.value_or(std::vector<GatherEvent>{});
}

}  // namespace strata::dist
