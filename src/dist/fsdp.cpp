// FullyShardedDataParallel: the choice and checks of the units, construction, the forward's
// saved-tensor hooks, no_sync, summon_full_params and gradient clipping. The per-unit steps are
// in fsdp_runtime.cpp, the state dicts in fsdp_state.cpp.
#include <strata/dist/fsdp.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
#include <unordered_map>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/creation.hpp>
#include <strata/optim/clip.hpp>

#include "dist/fsdp_runtime.h"
#include "dist/model_sync.h"
#include "dist/working_copy.h"

namespace strata::dist {

namespace {

// Every module inside a live wrapper, so that no module is wrapped twice (nested wrappers).
std::mutex wrapped_mutex;
std::set<const nn::Module*>& wrapped_modules() {
  static std::set<const nn::Module*> modules;
  return modules;
}

// A saved tensor the caller's saved-tensor hooks packed.
struct OuterSave {
  std::any packed;
};

bool is_inside(const std::string& name, const std::string& ancestor) {
  return ancestor.empty() || name.rfind(ancestor + ".", 0) == 0;
}

// The unit of module `name`: its parameters not in units below it (`mine`), checked.
detail::FlatUnit make_unit(const std::string& name, nn::Module& m, std::vector<std::pair<std::string, Tensor>> mine,
                           int64_t shards) {
  detail::FlatUnit unit;
  unit.name = name;
  unit.module = &m;
  const Tensor& first = mine.front().second;
  unit.requires_grad = first.requires_grad();
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
std::vector<detail::FlatUnit> choose_units(nn::Module& root, const FSDPOptions& o, int64_t shards) {
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
    is_unit[index] = true;
  }
  std::unordered_map<const TensorImpl*, size_t> owner;  // parameter -> the module index of its unit
  std::vector<std::vector<std::pair<std::string, Tensor>>> unit_params(modules.size());
  for (size_t i = modules.size(); i-- > 0;) {  // reverse pre-order: every module after those below it
    const auto& [name, m] = modules[i];
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
  STRATA_CHECK(!units.empty(), "[FullyShardedDataParallel] the wrapped module ({}) has no parameters", root.name());
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
  {
    std::lock_guard<std::mutex> lock(wrapped_mutex);
    for (const auto& [name, m] : modules)
      STRATA_CHECK(!wrapped_modules().count(m),
                   "[FullyShardedDataParallel] module '{}' ({}) is already inside another FullyShardedDataParallel; "
                   "wrappers do not nest: wrap the outermost module once and make inner modules units with "
                   "wrap_modules or auto_wrap_policy",
                   name.empty() ? "<root>" : name, m->name());
  }
  std::vector<Tensor> state = module_.parameters();
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
      detail::broadcast_from_rank0(*g, module_.parameters());
      detail::broadcast_from_rank0(*g, module_.buffers());
    }
  }
  const int64_t shards = options.sharding_strategy == ShardingStrategy::NoShard ? 1 : group->size();
  runtime_ = std::make_shared<detail::FsdpRuntime>(module_, group, replicate, options,
                                                   choose_units(module_, options, shards));
  runtime_->install();
  runtime_->cast_buffers(/*original=*/false);
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  for (const auto& entry : modules) wrapped_modules().insert(entry.second);
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  runtime_->uninstall();
  std::lock_guard<std::mutex> lock(wrapped_mutex);
  for (const auto& entry : module_.named_modules()) wrapped_modules().erase(entry.second);
}

std::unique_ptr<autograd::SavedTensorHooksGuard> FullyShardedDataParallel::begin_forward() {
  STRATA_CHECK(!runtime_->summoned, "[FullyShardedDataParallel] forward inside summon_full_params(); run it outside");
  runtime_->reset();
  runtime_->begin_forward_pass();
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
  for (const auto& unit : runtime_->units()) shards.push_back(unit.shard);
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

FullyShardedDataParallel::NoSyncGuard::NoSyncGuard(std::shared_ptr<detail::FsdpRuntime> runtime)
    : runtime_(std::move(runtime)), previous_(runtime_->sync) {
  runtime_->sync = false;
}
FullyShardedDataParallel::NoSyncGuard::~NoSyncGuard() { runtime_->sync = previous_; }
FullyShardedDataParallel::NoSyncGuard FullyShardedDataParallel::no_sync() { return NoSyncGuard(runtime_); }

FullyShardedDataParallel::FullParamsGuard::FullParamsGuard(std::shared_ptr<detail::FsdpRuntime> runtime,
                                                           bool writeback)
    : runtime_(std::move(runtime)), writeback_(writeback) {
  STRATA_CHECK(!runtime_->summoned, "[FullyShardedDataParallel] summon_full_params() is already active");
  auto& units = runtime_->units();
  runtime_->gathered_before_summon.assign(units.size(), false);
  for (size_t u = 0; u < units.size(); ++u) {
    runtime_->gathered_before_summon[u] = units[u].full.defined();
    runtime_->gather(u, /*master=*/true);  // under mixed precision, the shards' dtype
  }
  runtime_->cast_buffers(/*original=*/true);
  runtime_->summoned = true;
}

FullyShardedDataParallel::FullParamsGuard::~FullParamsGuard() {
  for (size_t u = 0; u < runtime_->units().size(); ++u) {
    if (writeback_) runtime_->write_back(u);
    runtime_->end_summon(u, runtime_->gathered_before_summon[u]);
  }
  runtime_->cast_buffers(/*original=*/false);
  runtime_->summoned = false;
}

FullyShardedDataParallel::FullParamsGuard FullyShardedDataParallel::summon_full_params(bool writeback) {
  return FullParamsGuard(runtime_, writeback);
}

double FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  STRATA_CHECK(norm_type > 0, "[FullyShardedDataParallel] clip_grad_norm_: norm_type must be > 0 or inf, got {}",
               norm_type);
  STRATA_CHECK(max_norm >= 0, "[FullyShardedDataParallel] clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  const std::vector<Tensor> shards = parameters();
  const bool inf = std::isinf(norm_type);
  double total = optim::total_grad_norm(shards, norm_type);
  if (runtime_->sharded() && runtime_->group().size() > 1) {  // every rank's shards, taken together
    Tensor part = full({1}, inf ? total : std::pow(total, norm_type), TensorOptions(kFloat64, shards[0].device()));
    runtime_->group().allreduce(part, inf ? ReduceOp::Max : ReduceOp::Sum)->wait();
    const double combined = part.cpu().item<double>();
    total = inf ? combined : std::pow(combined, 1.0 / norm_type);
  }
  if (std::isinf(max_norm)) return total;
  const double coef = max_norm / (total + 1e-6);
  const double clamped = 1.0 < coef ? 1.0 : coef;  // NaN stays NaN, as optim::clip_grad_norm_
  NoGradGuard no_grad;
  if (clamped != 1.0)
    for (const Tensor& s : shards)
      if (s.grad().defined()) s.grad().mul_(clamped);
  return total;
}

}  // namespace strata::dist
