// State dicts of tensor-parallel modules (torch.distributed.checkpoint.state_dict's
// get_model_state_dict / set_model_state_dict): the entries of parallelize_module's layers are
// this rank's pieces; these functions gather them whole, wrap them with their placements, or cut
// a whole dict (from a checkpoint of the unsharded model, or of one sharded over another mesh)
// into this rank's pieces.
//
//   nn::StateDict full = dist::get_model_state_dict(model, {.full_state_dict = true});  // collective
//   dist::set_model_state_dict(other_model, full);     // each rank takes its own pieces, no communication
//
// Entries are found by the key each parallelized Linear's weight and bias has in state_dict();
// state dict hooks that rename those keys are not followed.
#pragma once

#include <map>
#include <string>

#include <strata/dist/dtensor.hpp>
#include <strata/nn/module.hpp>

namespace strata::dist {

struct StateDictOptions {
  /// get: every sharded entry gathered whole (collective); else each rank's pieces as they are.
  bool full_state_dict = false;
  /// get with full_state_dict: only global rank 0 keeps the entries, the others return an empty
  /// dict (they still take part in the gathers).
  bool rank0_only = false;
  /// set: missing or unexpected keys raise (load_state_dict's strict).
  bool strict = true;
};

/// Every entry as a DTensor: a parallelized layer's weight and bias with their style's placements,
/// the rest Replicate on the mesh of the module's first parallelized layer (raises without one).
using ShardedStateDict = std::map<std::string, DTensor>;

/// `module`'s state_dict(), with full_state_dict the parallelized entries gathered (collective:
/// every rank of their meshes calls it).
STRATA_API nn::StateDict get_model_state_dict(const nn::Module& module, const StateDictOptions& options = {});
STRATA_API ShardedStateDict get_sharded_model_state_dict(const nn::Module& module);
/// Loads a full state dict (the unsharded model's, held by every rank): each parallelized entry is
/// cut to this rank's piece, the rest loaded as they are. No communication.
STRATA_API nn::LoadResult set_model_state_dict(nn::Module& module, const nn::StateDict& full,
                                               const StateDictOptions& options = {});
/// Loads a sharded state dict: entries on the module's mesh are redistributed to its layout, others
/// (another mesh shape) gathered whole and cut. Collective over the entries' meshes.
STRATA_API nn::LoadResult set_model_state_dict(nn::Module& module, const ShardedStateDict& sharded,
                                               const StateDictOptions& options = {});

}  // namespace strata::dist
