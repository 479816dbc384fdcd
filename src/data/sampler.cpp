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
  // ceil(n / world) without forming n + world - 1, which overflows for a world near INT64_MAX.
  per_rank_ = n / world_size + (!options.drop_last && n % world_size != 0);
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> mine;
  if (per_rank_ == 0) return mine;
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = random_permutation(n_, options_.seed, epoch);
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // Position p of the padded order (padded by repeating from the start, more than once when
  // world_size > n) is order[p % n]; it is not built, since per_rank * world_size can be
  // far larger than n. Positions stay below per_rank * world_size < n + world_size <= 2^64.
  mine.reserve(static_cast<size_t>(per_rank_));
  auto n = static_cast<uint64_t>(n_), world = static_cast<uint64_t>(world_);
  for (uint64_t k = 0, p = static_cast<uint64_t>(rank_); k < static_cast<uint64_t>(per_rank_); ++k, p += world)
    mine.push_back(order[p % n]);
  return mine;
}

}  // namespace strata::data
