// Random number generator state: a Philox seed and a counter offset. Draws reserve a range of
// counters, so the result depends only on (seed, offset) and not on the device or thread
// count; see Note [Random stream layout] in kernels/common/philox.h.
#pragma once

#include <cstdint>
#include <mutex>

#include <strata/core/export.hpp>

namespace strata {

/// Where a draw sits in the random stream: the generator's seed and the first counter reserved.
struct RandomDraw {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

class STRATA_API Generator {
 public:
  explicit Generator(uint64_t seed = 0x5eed) : seed_(seed) {}
  Generator(const Generator& other);
  Generator& operator=(const Generator& other);

  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  uint64_t offset() const;
  /// The seed and offset read together (a checkpoint's record of the state).
  RandomDraw state() const;
  /// Restores a state saved from seed() and offset().
  void set_state(uint64_t seed, uint64_t offset);
  /// Reserves `blocks` Philox counters and returns the first.
  uint64_t reserve(uint64_t blocks);
  /// Reserves `blocks` Philox counters and returns the seed with the first, read under one
  /// lock: a manual_seed from another thread falls before or after the draw, never between.
  RandomDraw reserve_draw(uint64_t blocks);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The generator that random ops use when none is passed.
STRATA_API Generator& default_generator();
/// Seeds the default generator.
STRATA_API void manual_seed(uint64_t seed);

}  // namespace strata
