// Helpers shared by the CUDA tests (label cuda): skipping cleanly without a GPU, fresh random
// inputs (the seed is printed with every failure), moving tensors between devices.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include <strata/strata.hpp>

/// First statement of every GPU test: reported as skipped where no GPU is visible.
#define SKIP_WITHOUT_GPU()                                                                                 \
  if (!::strata::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible (or strata built without CUDA)"

namespace strata::cuda_testing {

/// The seed of this process's random inputs: fresh each run, shown by SEED_TRACE().
inline uint64_t seed() {
  static const uint64_t s = std::random_device{}() * 0x9e3779b97f4a7c15ull + std::random_device{}();
  return s;
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 g(seed());
  return g;
}

#define SEED_TRACE() SCOPED_TRACE("random seed " + std::to_string(::strata::cuda_testing::seed()))

/// A fresh random CPU tensor: floats uniform in [lo, hi] (drawn in float64, then rounded to
/// `dt`); integers uniform in [-9, 9] ([0, 9] for uint8); bools fair coins.
inline Tensor random(const Shape& shape, DType dt, double lo = -1, double hi = 1) {
  Tensor t = empty(shape, kFloat64);
  double* p = t.data_ptr<double>();
  std::uniform_real_distribution<double> u(lo, hi);
  std::uniform_int_distribution<int> small(dt == kUInt8 ? 0 : -9, 9), coin(0, 1);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == kBool) p[i] = coin(rng());
    else if (is_floating(dt)) p[i] = u(rng());
    else p[i] = small(rng());
  }
  return t.to(dt);
}

inline Tensor gpu(const Tensor& t) { return t.to(Device::cuda()); }
inline Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

}  // namespace strata::cuda_testing
