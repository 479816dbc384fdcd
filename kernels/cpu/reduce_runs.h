// The reduce driver's paths for one contiguous run (kernels/cpu/reduce.h): float32 sums in
// vector registers, float32 column sums, and the extreme value of a run for max, min, argmax
// and argmin. Each gives the result the generic lane loop would, bit for bit, only faster.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "../common/reduce_ops.h"

namespace strata::cpu {

// The independent accumulators each output's reduction keeps (Note [Reduce loops] in reduce.h).
inline constexpr int kReduceLanes = 32;
// The lanes of float32 sums (Note [Float sum vectors]).
inline constexpr int kFloatSumLanes = 64;

namespace detail {

// Note [Float sum vectors]
// The contiguous float32 sum, the hottest reduction (loss means, norms of activations), kept
// its lanes in memory through the generic loop below: a store and a reload per 8 elements,
// 28-40 GB/s on two cores where the memory gives 53. Written with the GCC/Clang vector
// extension, the lanes are 16-float registers (one zmm each with AVX-512, split into narrower
// registers elsewhere). Lane l still adds p[l], p[l + kFloatSumLanes], ... in order, so the
// result is bit-identical to the generic loop.
// There are 64 of them, four registers, where the other reductions keep kReduceLanes (32): with
// two, each step waited on the last add's latency and a row of 1000 ran at 0.72x LibTorch's.
using FloatVec16 = float __attribute__((vector_size(64)));

// Four named registers rather than an array of them, which gcc kept in memory.
struct FloatSumLanes {
  FloatVec16 a, b, c, d;

  static FloatSumLanes load(const float* p) {
    FloatSumLanes r;
    std::memcpy(&r.a, p, sizeof r.a);
    std::memcpy(&r.b, p + 16, sizeof r.b);
    std::memcpy(&r.c, p + 32, sizeof r.c);
    std::memcpy(&r.d, p + 48, sizeof r.d);
    return r;
  }
  void store(float* p) const {
    std::memcpy(p, &a, sizeof a);
    std::memcpy(p + 16, &b, sizeof b);
    std::memcpy(p + 32, &c, sizeof c);
    std::memcpy(p + 48, &d, sizeof d);
  }
  void add(const FloatSumLanes& x) {
    a += x.a;
    b += x.b;
    c += x.c;
    d += x.d;
  }
};

// Adds the whole blocks of kFloatSumLanes of p[0, m) into the lanes: lane l takes p[l],
// p[l + kFloatSumLanes], ... Returns how many elements it read.
inline int64_t add_float_blocks(FloatSumLanes& lanes, const float* p, int64_t m) {
  static_assert(kFloatSumLanes == 64, "four 16-float vectors");
  FloatSumLanes acc = lanes;  // a local copy, so that the loop runs in registers
  int64_t i = 0;
  for (; i + kFloatSumLanes <= m; i += kFloatSumLanes) acc.add(FloatSumLanes::load(p + i));
  lanes = acc;
  return i;
}

// The last n < kFloatSumLanes elements of a run, zero-padded. With AVX-512 in masked loads,
// which read no byte past the run; a copy through a stack block cost a stalled reload (the
// loads straddle the copy's narrower stores), a tenth of a row of 1000.
inline FloatSumLanes load_float_tail(const float* p, int64_t n) {
#if defined(__AVX512F__)
  auto part = [&](int64_t k) {
    const int64_t left = n - 16 * k;
    if (left <= 0) return FloatVec16{};
    const auto mask = static_cast<__mmask16>(left >= 16 ? 0xffff : (1u << left) - 1);
    return reinterpret_cast<FloatVec16>(_mm512_maskz_loadu_ps(mask, p + 16 * k));
  };
  return {part(0), part(1), part(2), part(3)};
#else
  float tail[kFloatSumLanes] = {};
  std::memcpy(tail, p, static_cast<size_t>(n) * sizeof(float));
  return FloatSumLanes::load(tail);
#endif
}

inline void fold_float_sum(float* lane, const float* p, int64_t m) {
  FloatSumLanes lanes = FloatSumLanes::load(lane);
  const int64_t i = add_float_blocks(lanes, p, m);
  lanes.store(lane);
  for (int l = 0; i + l < m; ++l) lane[l] += p[i + l];
}

// The same for one whole run into zeroed lanes (a row sum, a mean along the last dim), ending
// in registers: the tail is added as a zero-padded block (x + 0 is x for every lane, none can
// be -0), and the lanes are combined by halves, 32 + 32 down to 1 + 1, which is the tree of
// reduce_span. The scalar tail and tree cost as much as the loop on rows of 1000.
inline float sum_float_run(const float* p, int64_t m) {
  using F8 = float __attribute__((vector_size(32)));
  using F4 = float __attribute__((vector_size(16)));
  FloatSumLanes lanes = {};
  const int64_t i = add_float_blocks(lanes, p, m);
  lanes.add(load_float_tail(p + i, m - i));
  const FloatVec16 s16 = (lanes.a + lanes.c) + (lanes.b + lanes.d);
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
