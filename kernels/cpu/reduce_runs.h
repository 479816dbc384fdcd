// The reduce driver's paths for one contiguous run (kernels/cpu/reduce.h): float32 sums in
// vector registers, float32 column sums, and the extreme value of a run for max, min, argmax
// and argmin. Each gives the result the generic lane loop would, bit for bit, only faster.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../common/reduce_ops.h"

namespace strata::cpu {

// The independent accumulators each output's reduction keeps (Note [Reduce loops] in reduce.h).
inline constexpr int kReduceLanes = 32;

namespace detail {

// Note [Float sum vectors]
// The contiguous float32 sum, the hottest reduction (loss means, norms of activations), kept
// its lanes in memory through the generic loop below: a store and a reload per 8 elements,
// 28-40 GB/s on two cores where the memory gives 53. Written with the GCC/Clang vector
// extension, the 32 lanes are two 16-float registers (one zmm each with AVX-512, split into
// narrower registers elsewhere). Lane l still adds p[l], p[l + 32], ... in order, so the
// result is bit-identical to the generic loop.
using FloatVec16 = float __attribute__((vector_size(64)));

// Adds the whole blocks of 32 of p[0, m) into lanes (a, b): lane l takes p[l], p[l + 32], ...
// Returns how many elements it read.
inline int64_t add_float_blocks(FloatVec16& a, FloatVec16& b, const float* p, int64_t m) {
  static_assert(kReduceLanes == 32, "two 16-float vectors");
  int64_t i = 0;
  for (; i + 32 <= m; i += 32) {
    FloatVec16 x, y;
    std::memcpy(&x, p + i, sizeof x);
    std::memcpy(&y, p + i + 16, sizeof y);
    a += x;
    b += y;
  }
  return i;
}

inline void fold_float_sum(float* lane, const float* p, int64_t m) {
  FloatVec16 a, b;
  std::memcpy(&a, lane, sizeof a);
  std::memcpy(&b, lane + 16, sizeof b);
  const int64_t i = add_float_blocks(a, b, p, m);
  std::memcpy(lane, &a, sizeof a);
  std::memcpy(lane + 16, &b, sizeof b);
  for (int l = 0; i + l < m; ++l) lane[l] += p[i + l];
}

// The same for one whole run into zeroed lanes (a row sum, a mean along the last dim), ending
// in registers: the tail is added as a zero-padded vector (x + 0 is x for every lane, none
// can be -0), and the lanes are combined by halves, 16 + 16 down to 1 + 1, which is the tree
// of reduce_span. The scalar tail and tree cost as much as the loop on rows of 1000.
inline float sum_float_run(const float* p, int64_t m) {
  using F8 = float __attribute__((vector_size(32)));
  using F4 = float __attribute__((vector_size(16)));
  FloatVec16 a = {}, b = {};
  const int64_t i = add_float_blocks(a, b, p, m);
  float tail[32] = {};
  std::memcpy(tail, p + i, static_cast<size_t>(m - i) * sizeof(float));
  FloatVec16 x, y;
  std::memcpy(&x, tail, sizeof x);
  std::memcpy(&y, tail + 16, sizeof y);
  const FloatVec16 s16 = (a + x) + (b + y);
  const F8 s8 = __builtin_shufflevector(s16, s16, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(s16, s16, 8, 9, 10, 11, 12, 13, 14, 15);
  const F4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// Note [Float column sums]
// The outer float32 sum (over dim 0 of an (N, C) tensor: every bias gradient) folded row by row
// into 256 lanes, which sat in memory: a load, an add and a store per 16 values, each row's
// waiting on the last's store, 0.73x LibTorch along (4096, 1000). Its lanes now take 64 columns
// at a time down the block's rows, in four registers, from precomputed row offsets. Each lane
// still adds its rows in order: the same result as the row by row loop.
inline void fold_float_columns(float* lane, const float* base, const int64_t* row_offset, int64_t rows,
                               int64_t cols) {
  int64_t j = 0;
  for (; j + 64 <= cols; j += 64) {
    FloatVec16 a0, a1, a2, a3;
    std::memcpy(&a0, lane + j, sizeof a0);
    std::memcpy(&a1, lane + j + 16, sizeof a1);
    std::memcpy(&a2, lane + j + 32, sizeof a2);
    std::memcpy(&a3, lane + j + 48, sizeof a3);
    for (int64_t k = 0; k < rows; ++k) {
      const float* row = base + row_offset[k] + j;
      FloatVec16 x0, x1, x2, x3;
      std::memcpy(&x0, row, sizeof x0);
      std::memcpy(&x1, row + 16, sizeof x1);
      std::memcpy(&x2, row + 32, sizeof x2);
      std::memcpy(&x3, row + 48, sizeof x3);
      a0 += x0;
      a1 += x1;
      a2 += x2;
      a3 += x3;
    }
    std::memcpy(lane + j, &a0, sizeof a0);
    std::memcpy(lane + j + 16, &a1, sizeof a1);
    std::memcpy(lane + j + 32, &a2, sizeof a2);
    std::memcpy(lane + j + 48, &a3, sizeof a3);
  }
  for (; j + 16 <= cols; j += 16) {
    FloatVec16 a;
    std::memcpy(&a, lane + j, sizeof a);
    for (int64_t k = 0; k < rows; ++k) {
      FloatVec16 x;
      std::memcpy(&x, base + row_offset[k] + j, sizeof x);
      a += x;
    }
    std::memcpy(lane + j, &a, sizeof a);
  }
  for (; j < cols; ++j)
    for (int64_t k = 0; k < rows; ++k) lane[j] += base[row_offset[k] + j];
}

// Note [Extreme runs]
// max, min, argmax and argmin of a contiguous run take its extreme value in value-only lanes,
// beside flags of the values' width that record a NaN (which wins): a NaN-propagating select
// lengthened the chain each step waits on, and took twice the time (amax along (4096, 1000)
// rows ran at a third of LibTorch's speed). argmax then looks for the first position holding
// that value (or the first NaN), kReduceLanes at a time in the run, which is in cache by then;
// folding (value, index) pairs moved three times the data through every step (the indices are
// 64-bit) and ran at 0.82x LibTorch's max with indices.
template <class Op> struct extreme_of { static constexpr int direction = 0; };
template <class T> struct extreme_of<math::MaxReduce<T>> { static constexpr int direction = 1; };
template <class T> struct extreme_of<math::MinReduce<T>> { static constexpr int direction = -1; };
template <class T, bool IsMax> struct extreme_of<math::ArgReduce<T, IsMax>> {
  static constexpr int direction = IsMax ? 1 : -1;
};

template <class C> struct RunExtreme {
  C value;  // the run's largest (or smallest) value; unspecified when has_nan
  bool has_nan;
};

template <bool IsMax, class C, class T>
inline RunExtreme<C> run_extreme(const T* p, int64_t m) {
  constexpr int L = kReduceLanes;
  using Flag = std::conditional_t<sizeof(C) == 8, int64_t, int32_t>;
  auto extreme = [](C a, C b) { return (IsMax ? a > b : a < b) ? a : b; };
  C best[L];
  Flag nan[L] = {};
  for (int l = 0; l < L; ++l) best[l] = static_cast<C>(p[l]);
  int64_t i = 0;
  for (; i + L <= m; i += L) {
#pragma GCC unroll 1  // Note [Lane loops] in reduce.h
    for (int l = 0; l < L; ++l) {
      const C v = static_cast<C>(p[i + l]);
      best[l] = extreme(v, best[l]);
      nan[l] |= math::is_nan(v);
    }
  }
  for (; i < m; ++i) {
    best[0] = extreme(static_cast<C>(p[i]), best[0]);
    nan[0] |= math::is_nan(static_cast<C>(p[i]));
  }
  // the lanes in a tree and the flags in one pass, both vectorized: a scalar pass over the
  // lanes was a noticeable part of a row of a thousand
  for (int w = L / 2; w > 0; w /= 2) {
#pragma GCC unroll 1
    for (int l = 0; l < w; ++l) best[l] = extreme(best[l + w], best[l]);
  }
  Flag any_nan = 0;
  for (int l = 0; l < L; ++l) any_nan |= nan[l];
  return {best[0], any_nan != 0};
}

// The position of the first NaN of a run that holds one.
template <class C, class T>
inline int64_t first_nan(const T* p, int64_t m) {
  int64_t pos = 0;
  while (pos + 1 < m && !math::is_nan(static_cast<C>(p[pos]))) ++pos;
  return pos;
}

// max or min: folds the run's extreme (NaN if it holds one) into lane[0].
template <class T, class Op, class Acc>
inline void fold_extreme_run(Acc* lane, const T* p, int64_t m, const Op& op) {
  constexpr bool kMax = extreme_of<Op>::direction > 0;
  const RunExtreme<Acc> r = run_extreme<kMax, Acc>(p, m);
  lane[0] = op.combine(lane[0], r.has_nan ? static_cast<Acc>(p[first_nan<Acc>(p, m)]) : r.value);
}

// argmax or argmin: the first NaN, or the first of the values equal to the run's extreme, which
// is one of its values (a lane that starts at NaN stays NaN, as x > NaN is false, but then the
// run has a NaN).
template <class T, bool IsMax, class C>
inline void fold_arg_run(math::ValueIndex<C>* lane, const T* p, int64_t m, const math::ArgReduce<T, IsMax>& op,
                         int64_t r0) {
  constexpr int L = kReduceLanes;
  const RunExtreme<C> r = run_extreme<IsMax, C>(p, m);
  int64_t pos = 0;
  if (r.has_nan) {
    pos = first_nan<C>(p, m);
  } else {
    for (; pos + L <= m; pos += L) {
      int any = 0;  // an int, not a bool: the vectorizer takes |= of ints only
#pragma GCC unroll 1
      for (int l = 0; l < L; ++l) any |= static_cast<C>(p[pos + l]) == r.value;
      if (any) break;
    }
    while (pos + 1 < m && !(static_cast<C>(p[pos]) == r.value)) ++pos;
  }
  lane[0] = op.combine(lane[0], {static_cast<C>(p[pos]), r0 + pos});
}

}  // namespace detail
}  // namespace strata::cpu
