// Where a DataLoader stands, for training checkpoints: the epoch, how many batches of it were
// already handed to the training loop, the shuffling seed, and the settings that fix the batch
// sequence (so a checkpoint is not resumed into a loader that would batch differently). Stored
// as integer key/value metadata next to the model and optimizer state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <strata/core/export.hpp>

namespace strata::data {

/// A DataLoader's position. Restoring it with DataLoader::load_state makes the next pass
/// produce exactly the batches the uninterrupted run would have produced next.
struct STRATA_API LoaderState {
  int64_t epoch = 0;
  /// Batches of `epoch` already delivered.
  int64_t batches = 0;
  uint64_t seed = 0;
  /// What the batch sequence depends on besides the seed; load_state refuses a loader that
  /// differs in any of them. Unset means unknown (a state from a checkpoint written before
  /// they were recorded, or made by hand): not checked.
  std::optional<int64_t> dataset_size;  ///< the dataset's length
  std::optional<int64_t> samples;       ///< indices per epoch (a custom sampler's size)
  std::optional<int64_t> batch_size;
  std::optional<bool> shuffle;
  std::optional<bool> drop_last;

  /// {"epoch", "batches", "seed"} and, when set, "dataset_size", "samples", "batch_size",
  /// "shuffle" and "drop_last" (0 or 1); the seed's 64 bits are stored in an int64 unchanged.
  std::map<std::string, int64_t> to_map() const;
  /// The inverse of to_map; raises strata::Error naming a missing key (of the first three) or
  /// a value out of range. Absent optional keys stay unset.
  static LoaderState from_map(const std::map<std::string, int64_t>& map);

  bool operator==(const LoaderState&) const = default;
};

}  // namespace strata::data
