// Where a DataLoader stands, for training checkpoints: the epoch, how many batches of it were
// already handed to the training loop, and the shuffling seed. Stored as integer key/value
// metadata next to the model and optimizer state.
#pragma once

#include <cstdint>
#include <map>
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

  /// {"epoch", "batches", "seed"}; the seed's 64 bits are stored in an int64 unchanged.
  std::map<std::string, int64_t> to_map() const;
  /// The inverse of to_map; raises strata::Error naming a missing key or a negative value.
  static LoaderState from_map(const std::map<std::string, int64_t>& map);

  bool operator==(const LoaderState&) const = default;
};

}  // namespace strata::data
