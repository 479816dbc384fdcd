// FullyShardedDataParallel's model state dicts: the full one (the plain module's, through
// summon_full_params) and the sharded one (each rank's shards, with what it was saved under).
#include <strata/dist/fsdp.hpp>

#include <set>

#include <fmt/ranges.h>

#include <strata/autograd/grad_mode.hpp>
#include <strata/ops/creation.hpp>

#include "dist/fsdp_runtime.h"
#include "dist/model_sync.h"

namespace strata::dist {

namespace {

constexpr const char* kWorldSize = "_fsdp.world_size";
constexpr const char* kRank = "_fsdp.rank";
std::string unit_key(size_t u, const char* what) { return fmt::format("_fsdp.unit.{}.{}", u, what); }

Tensor int_scalar(int64_t v) { return full(Shape{}, v, TensorOptions(kInt64)); }

// The int64 scalar `key` of a sharded state dict; raises naming it when absent or of another form.
int64_t read_int(const nn::StateDict& dict, const std::string& key) {
  const auto it = dict.find(key);
  STRATA_CHECK(it != dict.end() && it->second.defined() && it->second.numel() == 1 && it->second.dtype() == kInt64,
               "[FullyShardedDataParallel] load_sharded_state_dict: the dict has no int64 scalar \"{}\"; it is not "
               "one sharded_state_dict() wrote",
               key);
  return it->second.cpu().item<int64_t>();
}

// The module's state-dict entries that are buffers: those not sharing memory with a parameter
// (every registration name of a parameter, a tied one's too, names one of them).
nn::StateDict buffer_entries(nn::Module& module) {
  std::set<const Storage*> param_memory;
  for (const Tensor& p : module.parameters()) param_memory.insert(p.storage().get());
  nn::StateDict buffers;
  for (auto& [name, t] : module.state_dict())
    if (!t.defined() || !param_memory.count(t.storage().get())) buffers[name] = t;
  return buffers;
}

}  // namespace

nn::StateDict FullyShardedDataParallel::full_state_dict(bool rank0_only) {
  FullParamsGuard gathered(runtime_, /*writeback=*/false);
  nn::StateDict dict;
  if (rank0_only && !runtime_->is_rank0()) return dict;
  NoGradGuard no_grad;
  for (auto& [name, t] : module_.state_dict()) dict[name] = t.defined() ? t.clone() : t;
  return dict;
}

void FullyShardedDataParallel::load_full_state_dict(const nn::StateDict& dict, bool strict) {
  FullParamsGuard gathered(runtime_, /*writeback=*/true);
  std::exception_ptr error;
  try {
    const std::vector<std::string> problems = module_.check_state_dict(dict, strict);
    STRATA_CHECK(problems.empty(), "[FullyShardedDataParallel] load_full_state_dict: the dict does not fit the "
                 "module:\n  {}", fmt::join(problems, "\n  "));
  } catch (...) {
    error = std::current_exception();
  }
  runtime_->agree_on_error(error, "load_full_state_dict");
  module_.load_state_dict(dict, strict);  // into the gathered parameters; the guard writes the shards
}

nn::StateDict FullyShardedDataParallel::sharded_state_dict() const {
  nn::StateDict dict = buffer_entries(module_);
  for (auto& [name, b] : dict) b = runtime_->original_buffer(b);  // in their own dtype under buffer_dtype
  dict[kWorldSize] = int_scalar(runtime_->group().size());
  dict[kRank] = int_scalar(runtime_->group().rank());
  const auto& units = runtime_->units();
  for (size_t u = 0; u < units.size(); ++u) {
    dict[unit_key(u, "numel")] = int_scalar(units[u].numel);
    dict[unit_key(u, "shard")] = units[u].shard.detach();
  }
  return dict;
}

void FullyShardedDataParallel::load_sharded_state_dict(const nn::StateDict& dict) {
  const char* op = "[FullyShardedDataParallel] load_sharded_state_dict:";
  const int64_t world = read_int(dict, kWorldSize), rank = read_int(dict, kRank);
  STRATA_CHECK(world == runtime_->group().size(),
               "{} the dict was saved by a group of {} ranks, this group has {}; a sharded state dict loads only at "
               "the world size that saved it (use full_state_dict to change it)",
               op, world, runtime_->group().size());
  STRATA_CHECK(rank == runtime_->group().rank(), "{} the dict is rank {}'s, this is rank {}", op, rank,
               runtime_->group().rank());
  const auto& units = runtime_->units();
  STRATA_CHECK(!dict.count(unit_key(units.size(), "shard")), "{} the dict holds more units than this wrapper's {}",
               op, units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t numel = read_int(dict, unit_key(u, "numel"));
    STRATA_CHECK(numel == units[u].numel, "{} unit {} ('{}') held {} parameter elements when saved, {} here", op, u,
                 units[u].name, numel, units[u].numel);
    const auto it = dict.find(unit_key(u, "shard"));
    STRATA_CHECK(it != dict.end() && it->second.defined() && it->second.shape() == units[u].shard.shape(),
                 "{} unit {} ('{}') has no shard of shape {} in the dict", op, u, units[u].name,
                 units[u].shard.shape());
  }
  const nn::StateDict buffers = buffer_entries(module_);
  for (const auto& [name, b] : buffers) {
    const auto it = dict.find(name);
    STRATA_CHECK(it != dict.end() && (!b.defined() || nn::Module::shape_loads_into(it->second, b)),
                 "{} the buffer \"{}\" is missing or of another shape", op, name);
  }
  NoGradGuard no_grad;
  for (size_t u = 0; u < units.size(); ++u) units[u].shard.detach().copy_(dict.at(unit_key(u, "shard")));
  for (const auto& [name, b] : buffers)
    if (b.defined()) b.copy_(dict.at(name).view(b.shape()));
  // a gathered unit (ShardGradOp between forward and backward) would keep the old values
  for (size_t u = 0; u < units.size(); ++u)
    if (units[u].full.defined() && runtime_->sharded()) runtime_->free(u);
}

}  // namespace strata::dist
