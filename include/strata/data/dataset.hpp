// Datasets: anything with a size and a get(index). A DataLoader draws indices from a sampler,
// calls get() (in worker threads), and collates the samples into batches.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::data {

/// One (input, target) pair; the sample type of the bundled datasets.
struct Example {
  Tensor input;
  Tensor target;
};

/// A map-style dataset. get() must be safe to call from several threads at once.
template <class Sample = Example>
class Dataset {
 public:
  using sample_type = Sample;
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// The sample at `index` in [0, size()); raises strata::Error otherwise.
  virtual Sample get(int64_t index) const = 0;
  /// Called by a DataLoader as each pass starts, with the pass's epoch, while none of that
  /// loader's get() calls run: a dataset whose samples change from epoch to epoch (random
  /// augmentation) keys them on it, so a run resumed from the loader's state sees the same
  /// samples. A dataset handed to the loader as const is not told; one shared by two loaders
  /// hears both.
  virtual void set_epoch(int64_t /*epoch*/) {}
};

}  // namespace strata::data
