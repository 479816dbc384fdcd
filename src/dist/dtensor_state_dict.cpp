// Full and sharded state dicts of tensor-parallel modules: the layouts of the parallelized Linear
// layers' entries come from their forms; every other entry is replicated.
#include <strata/dist/dtensor_state_dict.hpp>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/linear.hpp>

#include "dtensor_layout.h"

namespace strata::dist {

using namespace dtensor_detail;

namespace {

// The layouts of the parallelized entries, by state dict key.
std::map<std::string, DLayout> sharded_entries(const nn::Module& module) {
  std::map<std::string, DLayout> entries;
  for (const auto& [path, child] : const_cast<nn::Module&>(module).named_modules()) {
    const auto* layer = dynamic_cast<const nn::Linear*>(child);
    if (layer == nullptr) continue;
    if (auto layouts = tensor_parallel_layouts(*layer)) {
      const std::string prefix = path.empty() ? "" : path + ".";
      entries.emplace(prefix + "weight", layouts->weight);
      if (layer->bias.defined()) entries.emplace(prefix + "bias", layouts->bias);
    }
  }
  return entries;
}

// This rank's piece of the whole `full` laid out as `layout` (no communication).
Tensor local_piece(const std::string& key, const Tensor& full, const DLayout& layout) {
  STRATA_CHECK(full.shape() == layout.shape, "[set_model_state_dict] '{}' has shape {}, the model's whole one is {}",
               key, full.shape(), layout.shape);
  Tensor t = full.detach();
  for (int i = 0; i < layout.mesh->ndim(); ++i) {
    const Placement& p = layout.placements[static_cast<size_t>(i)];
    if (!p.is_shard()) continue;
    const Piece piece = chunk_piece(t.size(p.dim), layout.mesh->size(i), layout.mesh->get_local_rank(i));
    t = t.narrow(p.dim, piece.offset, piece.length);
  }
  return t.contiguous();
}

DTensor wrap(const Tensor& local, const DLayout& layout) {
  return DTensor::from_local(local.detach(), *layout.mesh, layout.placements, false, layout.shape);
}

}  // namespace

nn::StateDict get_model_state_dict(const nn::Module& module, const StateDictOptions& options) {
  nn::StateDict dict = module.state_dict();
  if (!options.full_state_dict) return dict;
  NoGradGuard no_grad;
  // std::map: the same key order, so the same order of gathers, on every rank
  for (const auto& [key, layout] : sharded_entries(module)) {
    auto it = dict.find(key);
    if (it != dict.end()) it->second = wrap(it->second, layout).full_tensor();
  }
  if (options.rank0_only && get_rank() != 0) dict.clear();
  return dict;
}

ShardedStateDict get_sharded_model_state_dict(const nn::Module& module) {
  const auto entries = sharded_entries(module);
  STRATA_CHECK(!entries.empty(), "[get_sharded_model_state_dict] the module has no parallelized layer; its "
               "state_dict() holds whole tensors");
  const DeviceMesh& mesh = *entries.begin()->second.mesh;
  ShardedStateDict out;
  for (const auto& [key, value] : module.state_dict()) {
    auto it = entries.find(key);
    out.emplace(key, it != entries.end() ? wrap(value, it->second)
                                         : DTensor::from_local(value.detach(), mesh,
                                                               std::vector<Placement>(mesh.ndim(), Replicate())));
  }
  return out;
}

nn::LoadResult set_model_state_dict(nn::Module& module, const nn::StateDict& full, const StateDictOptions& options) {
  const auto entries = sharded_entries(module);
  nn::StateDict local = full;
  for (auto& [key, value] : local)
    if (auto it = entries.find(key); it != entries.end()) value = local_piece(key, value, it->second);
  return module.load_state_dict(local, options.strict);
}

nn::LoadResult set_model_state_dict(nn::Module& module, const ShardedStateDict& sharded,
                                    const StateDictOptions& options) {
  const auto entries = sharded_entries(module);
  NoGradGuard no_grad;
  nn::StateDict local;
  for (const auto& [key, value] : sharded) {  // every rank walks the same keys: the collectives match
    auto it = entries.find(key);
    if (it == entries.end()) {
      local.emplace(key, value.full_tensor());
    } else if (value.device_mesh() == *it->second.mesh && value.shape() == it->second.shape) {
      local.emplace(key, value.redistribute(it->second.placements).to_local());
    } else {
      local.emplace(key, local_piece(key, value.full_tensor(), it->second));
    }
  }
  return module.load_state_dict(local, options.strict);
}

}  // namespace strata::dist
