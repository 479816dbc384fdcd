// Samplers: the order in which a DataLoader visits a dataset's indices. A sampler is a pure
// function of the epoch, so any epoch's order can be recomputed (for resuming mid-epoch)
// without replaying the ones before it.
#pragma once

#include <cstdint>
#include <vector>

#include <strata/core/export.hpp>

namespace strata::data {

/// The base of all samplers: the dataset indices of one epoch, in visiting order.
class STRATA_API Sampler {
 public:
  virtual ~Sampler() = default;
  /// How many indices indices() returns (the same for every epoch).
  virtual int64_t size() const = 0;
  /// The indices of epoch `epoch`. Must depend only on the epoch (and the sampler's own
  /// settings), and be safe to call from any thread.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
};

/// A permutation of [0, n), the same for the same (seed, epoch): Fisher-Yates driven by a
/// Philox stream whose key is `seed` and whose counter range is reserved per epoch.
STRATA_API std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch);

/// 0, 1, ..., n - 1 every epoch.
class STRATA_API SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
};

/// A fresh permutation of [0, n) each epoch, derived from (seed, epoch).
class STRATA_API RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, uint64_t seed = 0);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

/// Options of DistributedSampler.
struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  /// Drop the tail so every rank gets floor(n / world_size) indices; otherwise pad with
  /// indices from the start so every rank gets ceil(n / world_size).
  bool drop_last = false;
};

/// The share of rank `rank` out of `world_size`, as PyTorch's DistributedSampler: every rank
/// draws the same (shuffled with (seed, epoch)) order, padded or cut to a multiple of
/// world_size, and takes every world_size-th index starting at `rank`. The ranks' shares
/// are disjoint apart from padding and together cover the dataset once per epoch. A
/// world_size above n is allowed, as in PyTorch (each rank gets one index, the order repeating);
/// the padded order is never built, so indices() costs O(n + size()) whatever world_size is.
class STRATA_API DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, int64_t rank, int64_t world_size, DistributedSamplerOptions options = {});
  int64_t size() const override { return per_rank_; }
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_; }

 private:
  int64_t n_, rank_, world_, per_rank_;
  DistributedSamplerOptions options_;
};

}  // namespace strata::data
