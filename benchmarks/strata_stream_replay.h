// strata's random streams replayed in plain C++, so a program that does not link strata (the
// LibTorch twin of the Transformer example) draws what strata draws from the same seed: the
// windows of TokenWindowDataset::random_window and the values of the CPU uniform_ and normal_
// kernels. A strata::Generator is a Philox seed and a counter offset; each draw reserves
// ceil(n / per_block) counters (Note [Random stream layout] in kernels/common/philox.h). The
// per-element math is strata's own header; the draw formulas mirror src/ops/creation.cpp and
// src/data/token_windows.cpp, and must follow them if they change.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/philox.h"

namespace bench {

class PhiloxReplay {
 public:
  explicit PhiloxReplay(uint64_t seed) : seed_(seed) {}

  // The start of a random window of TokenWindowDataset::random_window over one shard that has
  // `starts` valid start positions (its size minus the context): uniform in [0, starts).
  int64_t window_start(int64_t starts) {
    const uint64_t bits = strata::philox::bits64_at(seed_, reserve(1), 0);
    __extension__ using u128 = unsigned __int128;
    return static_cast<int64_t>((static_cast<u128>(bits) * static_cast<uint64_t>(starts)) >> 64);
  }

  // strata::uniform_(t, low, high) of a float32 tensor of n elements, in memory order.
  std::vector<float> uniform(int64_t n, double low, double high) {
    const uint64_t offset = reserve(blocks(n));
    std::vector<float> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<float>(low + (high - low) * static_cast<double>(strata::philox::uniform_at(seed_, offset, i)));
    return out;
  }

  // strata::normal_(t, mean, std) of a float32 tensor of n elements, in memory order.
  std::vector<float> normal(int64_t n, double mean, double std) {
    const uint64_t offset = reserve(blocks(n));
    std::vector<float> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<float>(mean + std * static_cast<double>(strata::philox::normal_at(seed_, offset, i)));
    return out;
  }

 private:
  static uint64_t blocks(int64_t n) { return (static_cast<uint64_t>(n) + 3) / 4; }  // 4 values per Philox block
  uint64_t reserve(uint64_t count) {
    const uint64_t first = offset_;
    offset_ += count;
    return first;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

}  // namespace bench
