// Helpers shared by the CUDA tests (label cuda): skipping cleanly without a GPU, fresh random
// inputs (the seed is printed with every failure), moving tensors between devices, comparing a
// CPU result with its CUDA twin.
#pragma once

#include <algorithm>
#include <cmath>
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

/// Tolerance of a CUDA result against the CPU's where both sum in a different order per dtype
/// (convolutions, pools): f16/bf16 compute in float and round once.
inline double cpu_cuda_tol(DType t) {
  return t == kFloat64 ? 1e-10 : t == kFloat32 ? 1e-4 : t == kBFloat16 ? 5e-2 : 1e-2;
}
inline Tensor host(const Tensor& t) { return t.to(Device::cpu()); }

/// Expects `cuda` (a tensor on a GPU) to equal `cpu` (the reference; on any device) in dtype,
/// shape and values. Integers and bool must match exactly (compared as int64). Floats are
/// compared in float64: with rel == 0 and atol == 0 exactly, the sign of zero included;
/// otherwise within rel * max(1, |cpu value|) + atol, equal values (infinities) always
/// matching. NaN matches NaN only. The first 5 mismatches are reported with their flat index
/// and both values, then the number of mismatches if there are more.
inline void expect_close(const Tensor& cpu, const Tensor& cuda, const std::string& what, double rel,
                         double atol = 0) {
  ASSERT_TRUE(cpu.defined() && cuda.defined()) << what;
  ASSERT_TRUE(cuda.device().is_cuda()) << what;
  ASSERT_EQ(cpu.dtype(), cuda.dtype()) << what;
  ASSERT_EQ(cpu.shape(), cuda.shape()) << what;
  const bool integral = !is_floating(cpu.dtype());
  const Tensor a = host(cpu).contiguous().to(integral ? kInt64 : kFloat64);
  const Tensor b = host(cuda).contiguous().to(integral ? kInt64 : kFloat64);
  int64_t bad = 0;
  auto mismatch = [&](int64_t i, auto x, auto y) {
    if (++bad <= 5) ADD_FAILURE() << what << " at " << i << ": cpu " << x << " cuda " << y;
  };
  if (integral) {
    const int64_t *pa = a.data_ptr<int64_t>(), *pb = b.data_ptr<int64_t>();
    for (int64_t i = 0; i < a.numel(); ++i)
      if (pa[i] != pb[i]) mismatch(i, pa[i], pb[i]);
  } else {
    const double *pa = a.data_ptr<double>(), *pb = b.data_ptr<double>();
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double x = pa[i], y = pb[i];
      bool ok;
      if (std::isnan(x) || std::isnan(y)) ok = std::isnan(x) && std::isnan(y);
      else if (rel == 0 && atol == 0) ok = x == y && std::signbit(x) == std::signbit(y);
      else ok = x == y || std::fabs(x - y) <= rel * std::max(1.0, std::fabs(x)) + atol;
      if (!ok) mismatch(i, x, y);
    }
  }
  if (bad > 5) ADD_FAILURE() << what << ": " << bad << " of " << a.numel() << " values differ";
}

}  // namespace strata::cuda_testing
