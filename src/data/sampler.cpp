// Sequential, random and distributed samplers. Random orders come from the Philox stream of
// kernels/common/philox.h, so they are the same on every machine and compiler.
#include <strata/data/sampler.hpp>

#include <numeric>

#include <strata/core/error.hpp>
#include <strata/core/generator.hpp>

#include "kernels/common/philox.h"

namespace strata::data {

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  STRATA_CHECK(n >= 0, "[random_permutation] negative size {}", n);
  STRATA_CHECK(epoch >= 0, "[random_permutation] negative epoch {}", epoch);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (n < 2) return perm;
  // Each epoch owns a disjoint range of Philox counters: a draw of n 64-bit values uses
  // ceil(n / 2) blocks (Note [Random stream layout]).
  uint64_t blocks = (static_cast<uint64_t>(n) + 1) / 2;
  Generator gen(seed);
  gen.set_state(seed, static_cast<uint64_t>(epoch) * blocks);
  uint64_t offset = gen.reserve(blocks);
  for (int64_t i = n - 1; i > 0; --i) {
    uint64_t bits = philox::bits64_at(seed, offset, static_cast<uint64_t>(i));
    // Multiply-shift maps 64 random bits onto [0, i] without the bias of a modulo.
    auto j = static_cast<int64_t>((static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  STRATA_CHECK(n >= 0, "[SequentialSampler] negative size {}", n);
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> out(static_cast<size_t>(n_));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  STRATA_CHECK(n >= 0, "[RandomSampler] negative size {}", n);
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const { return random_permutation(n_, seed_, epoch); }

DistributedSampler::DistributedSampler(int64_t n, int64_t rank, int64_t world_size, DistributedSamplerOptions options)
    : n_(n), rank_(rank), world_(world_size), options_(options) {
  STRATA_CHECK(n >= 0, "[DistributedSampler] negative size {}", n);
  STRATA_CHECK(world_size >= 1, "[DistributedSampler] world_size must be at least 1, got {}", world_size);
  STRATA_CHECK(rank >= 0 && rank < world_size, "[DistributedSampler] rank {} is outside [0, {})", rank, world_size);
  per_rank_ = options.drop_last ? n / world_size : (n + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = random_permutation(n_, options_.seed, epoch);
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // Pad by repeating from the start (more than once when world_size > n), or cut the tail.
  auto total = static_cast<size_t>(per_rank_ * world_);
  for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i]);
  order.resize(total);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_rank_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(world_)) mine.push_back(order[i]);
  return mine;
}

}  // namespace strata::data
