// FullyShardedDataParallel's optimizer state: an optimizer over the shards keeps, per shard, its
// unit's scalars (the step count) and per-element tensors of the shard's shape (Adam's moments).
// The full state dict is the one a plain optimizer of the same type writes over the module's own
// parameters: each shard's tensors are gathered, unflattened and cut into the unit's parameters,
// and its scalars repeated for each of them. Loading cuts the other way, so a full state dict
// loads at any world size. Scalar state tensors are repeated; a state laid over the flat shard in
// blocks (Adam8bit's quantization scales) has no per-parameter form and is refused.
#include <strata/dist/fsdp.hpp>

#include <map>
#include <unordered_map>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/creation.hpp>

#include "dist/fsdp_runtime.h"
#include "dist/model_sync.h"
#include "optim/state_keys.h"

namespace strata::dist {

namespace {

using optim::detail::parse_state_key;
using optim::detail::state_key;

// Where each of the optimizer's parameters (shards) and each plain parameter sits.
struct Layout {
  std::vector<size_t> unit_of;                              // by the optimizer's parameter index
  std::vector<size_t> shard_index;                          // by unit: its index in the optimizer
  std::vector<std::vector<std::pair<size_t, size_t>>> plain;  // by group: (unit, parameter), module order
  std::map<std::pair<size_t, size_t>, size_t> plain_index;    // (unit, parameter) -> plain index
};

Layout layout_of(const optim::Optimizer& opt, const std::vector<detail::FlatUnit>& units, nn::Module& module) {
  std::unordered_map<const TensorImpl*, size_t> position;  // in module.parameters()
  for (const Tensor& p : module.parameters()) position.emplace(p.impl_ptr().get(), position.size());
  Layout layout;
  layout.shard_index.assign(units.size(), SIZE_MAX);
  for (size_t g = 0; g < opt.num_param_groups(); ++g) {
    std::vector<std::pair<size_t, size_t>> members;
    for (const Tensor& p : opt.group_params(g)) {
      size_t u = 0;
      while (u < units.size() && !units[u].shard.is_same(p)) ++u;
      STRATA_CHECK(u < units.size(),
                   "[FullyShardedDataParallel] parameter {} of the optimizer (group {}) is not one of this wrapper's "
                   "shards: build the optimizer over fsdp.parameters()",
                   layout.unit_of.size(), g);
      STRATA_CHECK(layout.shard_index[u] == SIZE_MAX, "[FullyShardedDataParallel] the optimizer holds unit {}'s "
                   "shard twice", u);
      layout.shard_index[u] = layout.unit_of.size();
      layout.unit_of.push_back(u);
      for (size_t k = 0; k < units[u].params.size(); ++k) members.emplace_back(u, k);
    }
    std::stable_sort(members.begin(), members.end(), [&](const auto& a, const auto& b) {
      return position.at(units[a.first].params[a.second].impl_ptr().get()) <
             position.at(units[b.first].params[b.second].impl_ptr().get());
    });
    for (const auto& m : members) layout.plain_index.emplace(m, layout.plain_index.size());
    layout.plain.push_back(std::move(members));
  }
  return layout;
}

// The units an optimizer over fsdp.parameters() steps (this wrapper's, then the nested ones'),
// each with its wrapper.
struct AllUnits {
  std::vector<detail::FlatUnit> units;  // copies of the handles
  std::vector<std::shared_ptr<detail::FsdpRuntime>> owners;
};
AllUnits all_units(detail::FsdpRuntime& runtime) {
  AllUnits all;
  for (auto& r : runtime.with_nested())
    for (const auto& unit : r->units()) {
      all.units.push_back(unit);
      all.owners.push_back(r);
    }
  return all;
}

bool is_num_params(const std::string& key, size_t& group) {
  return std::sscanf(key.c_str(), "group.%zu.num_params", &group) == 1 && key.ends_with(".num_params");
}

}  // namespace

optim::StateDict FullyShardedDataParallel::full_optim_state_dict(const optim::Optimizer& opt, bool rank0_only) {
  const AllUnits all = all_units(*runtime_);
  const auto& units = all.units;
  const Layout layout = layout_of(opt, units, module_);
  const optim::StateDict local = opt.state_dict();
  optim::StateDict out;
  out.type = local.type;
  size_t index = 0, group = 0;
  std::string name;
  for (const auto& [key, v] : local.scalars) {
    if (parse_state_key(key, index, name)) {
      const size_t u = layout.unit_of.at(index);
      for (size_t k = 0; k < units[u].params.size(); ++k)
        out.scalars[state_key(layout.plain_index.at({u, k}), name)] = v;
    } else {
      out.scalars[key] = is_num_params(key, group) ? static_cast<double>(layout.plain.at(group).size()) : v;
    }
  }
  for (const auto& [key, t] : local.tensors) {  // checked before any collective: every rank raises alike
    STRATA_CHECK(parse_state_key(key, index, name), "[FullyShardedDataParallel] unexpected optimizer state '{}'", key);
    const detail::FlatUnit& unit = units[layout.unit_of.at(index)];
    STRATA_CHECK((t.dim() == 1 && t.numel() == unit.shard.numel()) || t.numel() <= 1,
                 "[FullyShardedDataParallel] full_optim_state_dict: {}'s state '{}' of unit '{}' has shape {}, neither "
                 "one value per element of the shard ({}) nor a scalar: laid over the flat shard in blocks, it has no "
                 "per-parameter form; save the optimizer's own state_dict() on each rank instead",
                 local.type, name, unit.name, t.shape(), unit.shard.numel());
  }
  NoGradGuard no_grad;
  for (const auto& [key, t] : local.tensors) {  // the same keys, in the same order, on every rank
    parse_state_key(key, index, name);
    const size_t u = layout.unit_of.at(index);
    const detail::FlatUnit& unit = units[u];
    const bool per_element = t.dim() == 1 && t.numel() == unit.shard.numel();
    Tensor flat = t.detach();
    const detail::FsdpRuntime& owner = *all.owners[u];
    if (per_element && owner.sharded()) {  // on the module's device (the shard's is the CPU under offload)
      flat = empty({unit.padded}, TensorOptions(t.dtype(), unit.device));
      std::vector<Tensor> parts;
      for (int r = 0; r < owner.group().size(); ++r) parts.push_back(flat.narrow(0, r * t.numel(), t.numel()));
      owner.group().allgather(parts, t.detach().to(unit.device).contiguous())->wait();
    }
    for (size_t k = 0; k < unit.params.size(); ++k)
      out.tensors[state_key(layout.plain_index.at({u, k}), name)] =
          per_element ? flat.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]).clone() : t.clone();
  }
  if (rank0_only && !runtime_->is_rank0()) return {};
  return out;
}

void FullyShardedDataParallel::load_full_optim_state_dict(optim::Optimizer& opt, const optim::StateDict& full) {
  const AllUnits all = all_units(*runtime_);
  const auto& units = all.units;
  const char* op = "[FullyShardedDataParallel] load_full_optim_state_dict:";
  std::function<void()> undo;
  std::exception_ptr error;
  try {
    const Layout layout = layout_of(opt, units, module_);
    std::vector<std::pair<size_t, size_t>> by_plain(layout.plain_index.size());
    for (const auto& [member, j] : layout.plain_index) by_plain[j] = member;
    optim::StateDict local;
    local.type = full.type;
    size_t j = 0, group = 0;
    std::string name;
    for (const auto& [key, v] : full.scalars) {
      if (parse_state_key(key, j, name)) {
        STRATA_CHECK(j < by_plain.size(), "{} the entry '{}' names parameter {}, but the model has {}", op, key, j,
                     by_plain.size());
        local.scalars[state_key(layout.shard_index[by_plain[j].first], name)] = v;  // the unit's, from any member
      } else if (is_num_params(key, group)) {
        STRATA_CHECK(group < layout.plain.size() && v == static_cast<double>(layout.plain[group].size()),
                     "{} group {} of the dict holds {} parameters; the units of the optimizer's group hold {}", op,
                     group, v, group < layout.plain.size() ? layout.plain[group].size() : 0);
        local.scalars[key] = static_cast<double>(opt.group_params(group).size());
      } else {
        local.scalars[key] = v;
      }
    }
    std::map<std::pair<size_t, std::string>, std::vector<Tensor>> parts;  // (unit, name) -> per parameter
    for (const auto& [key, t] : full.tensors) {
      STRATA_CHECK(parse_state_key(key, j, name) && j < by_plain.size(), "{} unexpected entry '{}'", op, key);
      const auto [u, k] = by_plain[j];
      auto& slot = parts[{u, name}];
      slot.resize(units[u].params.size());
      slot[k] = t;
    }
    NoGradGuard no_grad;
    for (const auto& [unit_name, tensors] : parts) {
      const detail::FlatUnit& unit = units[unit_name.first];
      const bool per_element = tensors[0].defined() && tensors[0].shape() == unit.shapes[0];
      Tensor value = tensors[0].defined() ? tensors[0].to(unit.shard.device()) : Tensor();
      if (per_element) {
        Tensor flat = zeros({unit.padded}, value.options());
        for (size_t k = 0; k < tensors.size(); ++k) {
          STRATA_CHECK(tensors[k].defined() && tensors[k].shape() == unit.shapes[k], "{} the state '{}' of "
                       "parameter '{}' is missing or not of its shape {}", op, unit_name.second, unit.param_names[k],
                       unit.shapes[k]);
          flat.narrow(0, unit.offsets[k], unit.numels[k]).view(unit.shapes[k]).copy_(tensors[k]);
        }
        const int64_t length = unit.shard.numel();
        const detail::FsdpRuntime& owner = *all.owners[unit_name.first];
        const int64_t rank = owner.sharded() ? owner.group().rank() : 0;
        value = flat.narrow(0, rank * length, length).clone();
      }
      STRATA_CHECK(value.defined(), "{} the state '{}' of parameter '{}' is missing", op, unit_name.second,
                   unit.param_names[0]);
      local.tensors[state_key(layout.shard_index[unit_name.first], unit_name.second)] = value;
    }
    undo = opt.restore_point();
    opt.load_state_dict(local);
  } catch (...) {
    error = std::current_exception();
  }
  try {
    runtime_->agree_on_error(error, "load_full_optim_state_dict");
  } catch (...) {
    if (undo && !error) undo();
    throw;
  }
}

}  // namespace strata::dist
