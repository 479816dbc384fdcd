// Full training checkpoints in one safetensors file: model weights, optimizer and scheduler
// state, a grad scaler's state, every random generator, the step, the data loader's position,
// the model's configuration and free-form metadata. Loading one into the same training
// program continues the run bit for bit.
//
//   io::TrainingState state{.model = &model, .optimizer = &opt, .scheduler = io::stateful(sched),
//                           .generators = {{"data", &data_gen}}, .config = {{"hidden", "64"}}};
//   io::save_checkpoint("run/last.safetensors", state, {.step = step, .loader = loader.state().to_map()});
//   ...
//   io::Checkpoint ck = io::load_checkpoint("run/last.safetensors", state);  // in a new process
//
// Every tensor carries an xxHash64 checksum, and so does the metadata; the file is written
// atomically. See Note [Checkpoint layout] in src/io/checkpoint.cpp for the keys.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include <strata/core/export.hpp>
#include <strata/core/generator.hpp>
#include <strata/nn/module.hpp>
#include <strata/optim/optimizer.hpp>

namespace strata::io {

/// A component with a state dict (an LR scheduler, ReduceLROnPlateau, a grad scaler), seen
/// through two functions. An empty Stateful means "none".
struct Stateful {
  std::function<optim::StateDict()> save;
  std::function<void(const optim::StateDict&)> load;
  explicit operator bool() const { return save && load; }
};

/// Wraps any object with `StateDict state_dict() const` and `load_state_dict(const StateDict&)`;
/// the object must outlive the Stateful.
template <class T>
Stateful stateful(T& object) {
  return {[&object] { return object.state_dict(); },
          [&object](const optim::StateDict& d) { object.load_state_dict(d); }};
}

/// The live objects of a training run, which a checkpoint saves and restores. Every pointer may
/// be null (nothing saved for it), but load_checkpoint requires the same parts the checkpoint
/// was saved with.
struct TrainingState {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  Stateful scheduler;
  Stateful scaler;
  /// Generators by name, besides default_generator(), which is always saved and restored
  /// (as "default", a name reserved for it).
  std::map<std::string, Generator*> generators;
  /// The model's configuration (layer sizes, vocabulary...). load_checkpoint refuses a
  /// checkpoint saved with another configuration, listing each differing key.
  std::map<std::string, std::string> config;
};

/// Where the run was: what a checkpoint records beside the states of live objects.
struct Checkpoint {
  int64_t step = 0;
  /// The data loader's position (e.g. LoaderState::to_map()).
  std::map<std::string, int64_t> loader;
  /// Free-form user metadata.
  std::map<std::string, std::string> metadata;
};

/// Writes `state` and `progress` to `path` atomically: after a crash, `path` holds either the
/// previous checkpoint or the complete new one. A temporary left by a writer killed mid-save is
/// removed by the next atomic write of the same path (io::AtomicFile).
STRATA_API void save_checkpoint(const std::string& path, const TrainingState& state, const Checkpoint& progress = {});

/// Restores a checkpoint into the live objects and returns where the run was. Everything is
/// checked first: the checksums, the configuration, the model's keys, shapes and dtypes (what
/// its strict load_state_dict would refuse), the optimizer's and scheduler's types, the parts
/// and generator names present. On any Error nothing in `state` has changed (the optimizer,
/// scheduler and scaler are rolled back from snapshots if one of them refuses its state dict;
/// the optimizer's snapshot is its restore_point(), a copy of its state held while loading), except
/// when copying the model's tensors itself fails (a device error), which may leave the model
/// partly loaded. A dist::ZeroRedundancyOptimizer loads on every rank of its group, each keeping
/// its shard: every rank calls load_checkpoint with the same file.
STRATA_API Checkpoint load_checkpoint(const std::string& path, TrainingState& state);

/// A checkpoint file's contents, checksums verified, without live objects (to inspect one, or
/// to take the model weights for evaluation). Tensors alias a private mapping of the file.
struct CheckpointFile {
  Checkpoint progress;
  std::map<std::string, std::string> config;
  nn::StateDict model;
  optim::StateDict optimizer, scheduler, scaler;
  bool has_optimizer = false, has_scheduler = false, has_scaler = false;
  std::map<std::string, std::pair<uint64_t, uint64_t>> generators;  ///< name -> (seed, offset)
};

/// Reads and verifies a checkpoint; raises Error naming the path and what is wrong (a tensor
/// whose checksum does not match, a truncated file, a malformed entry).
STRATA_API CheckpointFile read_checkpoint(const std::string& path);

}  // namespace strata::io
