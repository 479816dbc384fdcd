// Integer GEMMs of the quantized Linear layers on the CPU.
//
// 8-bit: C (M, N) = A (M, K) . B (N, K)^T with int8 or uint8 A (the Linear's activations are
// uint8, as PyTorch's dynamic quantization, which VNNI multiplies by int8 four at a time), int8
// B in a Linear weight's (out, in) layout so both operands are read along K, int32 sums. Tiles of
// 4 rows of A by 4 rows of B keep 16 sums in vector registers; the epilogue gets each tile's
// exact sums. int32 holds any sum while K <= kMaxInt8K (int8 A) or kMaxUint8K (uint8 A).
//
// int4 (weight only), many activation rows: tiles of kInt4Tile weight rows are dequantized to
// float (dequantize_int4_row_fast) and multiplied by the float GEMM of kernels/cpu/gemm.h
// (oneDNN), whose register blocking is worth more than the dequantization there. Up to
// kInt4DirectMaxRows rows the codes are decoded in registers instead (kernels/cpu/int4_gemv.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

#include "gemm.h"
#include "int4_gemv.h"
#include "parallel.h"
#include "quant.h"

namespace strata::cpu::quant {

// the longest K whose sums int32 holds: int8 x int8 ((2^17 - 1) * 2^14 < 2^31, while 2^17 of
// -128 * -128 make 2^31) and uint8 x int8 (2^16 * 255 * 128 < 2^31)
inline constexpr int64_t kMaxInt8K = (int64_t{1} << 17) - 1, kMaxUint8K = int64_t{1} << 16;
inline constexpr int64_t kInt4Tile = 256;

namespace detail {

template <class TA>
int32_t dot_8bit(const TA* a, const int8_t* b, int64_t K) {
  int32_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < K; ++k) s += int32_t{a[k]} * int32_t{b[k]};
  return s;
}

// out[i * 4 + j] = sum_k a[i * K + k] * b[j * K + k] for MR rows of A (int8 or uint8) and 4
// rows of int8 B. With AVX-512 VNNI and uint8 A, vpdpbusd multiplies 64 codes at a time, adding
// products in fours into int32 lanes; with AVX-512BW otherwise, 32 codes at a time are widened to
// int16 and multiplied in pairs (vpmaddwd, or VNNI's vpdpwssd, which adds too). Both are exact:
// neither saturates, and no partial sum passes 2^17. Elsewhere, and for the tail of K, the plain loop.
template <int MR, class TA>
inline void tile(const TA* a, const int8_t* b, int64_t K, int32_t* out) {
  constexpr int NR = 4;
  int32_t s[MR * NR] = {};
  int64_t k0 = 0;
#if defined(__AVX512BW__)
  {
    __m512i acc[MR * NR];
    for (__m512i& v : acc) v = _mm512_setzero_si512();
#if defined(__AVX512VNNI__)
    if constexpr (std::is_same_v<TA, uint8_t>) {
      for (; k0 + 64 <= K; k0 += 64) {
        __m512i w[NR];
        for (int j = 0; j < NR; ++j) w[j] = _mm512_loadu_si512(b + j * K + k0);
        for (int i = 0; i < MR; ++i) {
          const __m512i x = _mm512_loadu_si512(a + i * K + k0);
          for (int j = 0; j < NR; ++j) acc[i * NR + j] = _mm512_dpbusd_epi32(acc[i * NR + j], x, w[j]);
        }
      }
    }
#endif
    const auto widen = [](const auto* p) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(p)>>, uint8_t>)
        return _mm512_cvtepu8_epi16(v);
      else
        return _mm512_cvtepi8_epi16(v);
    };
    for (; k0 + 32 <= K; k0 += 32) {
      __m512i w[NR];
      for (int j = 0; j < NR; ++j) w[j] = widen(b + j * K + k0);
      for (int i = 0; i < MR; ++i) {
        const __m512i x = widen(a + i * K + k0);
        for (int j = 0; j < NR; ++j)
#if defined(__AVX512VNNI__)
          acc[i * NR + j] = _mm512_dpwssd_epi32(acc[i * NR + j], x, w[j]);
#else
          acc[i * NR + j] = _mm512_add_epi32(acc[i * NR + j], _mm512_madd_epi16(x, w[j]));
#endif
      }
    }
    alignas(64) int32_t lanes[16];
    for (int t = 0; t < MR * NR; ++t) {  // a store and a loop: gcc 12 warns on _mm512_reduce_add_epi32
      _mm512_store_si512(lanes, acc[t]);
      for (int l = 0; l < 16; ++l) s[t] += lanes[l];
    }
  }
#endif
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j)
      out[i * NR + j] = s[i * NR + j] + dot_8bit(a + i * K + k0, b + j * K + k0, K - k0);
}

}  // namespace detail

/// Calls epilogue(m, n, sum) once for every output, sum = sum_k a[m, k] * b[n, k] exactly; A is
/// int8 or uint8, B int8. Tiles run in parallel over blocks of B's rows (the weight).
template <class TA, class Epilogue>
void gemm_8bit(const TA* a, const int8_t* b, int64_t M, int64_t N, int64_t K, const Epilogue& epilogue) {
  constexpr int64_t NB = 4, kRowBlock = 64;
  const int64_t n_tiles = (N + NB - 1) / NB;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(M * K, 1));
  parallel_for(0, n_tiles, grain, [&](int64_t tb, int64_t te) {
    int32_t sums[16];
    for (int64_t m0 = 0; m0 < M; m0 += kRowBlock)  // a block of A's rows stays in cache across B's tiles
      for (int64_t t = tb; t < te; ++t) {
        const int64_t n = t * NB, m1 = std::min(M, m0 + kRowBlock);
        if (n + NB > N) {  // ragged edge of B
          for (int64_t m = m0; m < m1; ++m)
            for (int64_t j = n; j < N; ++j) epilogue(m, j, detail::dot_8bit(a + m * K, b + j * K, K));
          continue;
        }
        const int8_t* bs = b + n * K;
        int64_t m = m0;
        for (; m + 4 <= m1; m += 4) {
          detail::tile<4>(a + m * K, bs, K, sums);
          for (int64_t i = 0; i < 4; ++i)
            for (int64_t j = 0; j < NB; ++j) epilogue(m + i, n + j, sums[i * NB + j]);
        }
        for (; m < m1; ++m) {
          detail::tile<1>(a + m * K, bs, K, sums);
          for (int64_t j = 0; j < NB; ++j) epilogue(m, n + j, sums[j]);
        }
      }
  });
}

/// The int8 layers' float epilogue of one exact sum (zero points subtracted), in float32:
/// sum * (x_scale * w_scale) + bias[n]; bias may be null.
template <class I, class T>
inline float int8_value(I exact, float x_scale, float w_scale, const T* bias, int64_t n) {
  float v = static_cast<float>(exact) * (x_scale * w_scale);
  if (bias) v += static_cast<float>(bias[n]);
  return v;
}

/// y (M, N) = x_scale[m] * w_scale[n] * (sum_k xq[m, k] * wq[n, k] - x_zero[m] * w_row_sum[n]) + bias[n]:
/// the int8 Linear with uint8 affine activations (one scale and zero point per row, or one for
/// all rows when x_per_row is false) and symmetric per-channel int8 weights; bias may be null.
template <class T>
void int8_linear(const uint8_t* xq, const float* x_scale, const int32_t* x_zero, bool x_per_row, const int8_t* wq,
                 const float* w_scale, const int32_t* w_row_sum, const T* bias, T* y, int64_t M, int64_t N,
                 int64_t K) {
  gemm_8bit(xq, wq, M, N, K, [&](int64_t m, int64_t n, int32_t sum) {
    const int64_t r = x_per_row ? m : 0;
    const int64_t exact = int64_t{sum} - int64_t{x_zero[r]} * w_row_sum[n];
    y[m * N + n] = static_cast<T>(int8_value(exact, x_scale[r], w_scale[n], bias, n));
  });
}

/// int8_linear's output from the plain sums acc (M, N) of sum_k xq[m, k] * wq[n, k] (oneDNN's
/// integer GEMM); the same float32 math.
inline void int8_linear_from_sums(const int32_t* acc, const float* x_scale, const int32_t* x_zero, bool x_per_row,
                                  const float* w_scale, const int32_t* w_row_sum, const float* bias, float* y,
                                  int64_t M, int64_t N) {
  parallel_for(0, M, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(N, 1)), [&](int64_t b, int64_t e) {
    const int32_t* a = acc;  // locals, not the captures, so that the loop vectorizes
    const int32_t* sums = w_row_sum;
    const float* ws = w_scale;
    float* out = y;
    for (int64_t m = b; m < e; ++m) {
      const int64_t r = x_per_row ? m : 0, z = x_zero[r];
      const float xs = x_scale[r];
      for (int64_t n = 0; n < N; ++n)
        out[m * N + n] = int8_value(int64_t{a[m * N + n]} - z * sums[n], xs, ws[n], bias, n);
    }
  });
}

/// y (M, N) float32 = int8_value of the exact int32 sums acc (M, N) (zero points subtracted: the
/// int8 convolution of oneDNN) with one activation scale, the same float32 math as int8_linear.
inline void int8_values(const int32_t* acc, float x_scale, const float* w_scale, const float* bias, float* y,
                        int64_t M, int64_t N) {
  parallel_for(0, M, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(N, 1)), [&](int64_t b, int64_t e) {
    const int32_t* a = acc;  // locals, not the captures, so that the loops vectorize
    float* out = y;
    const float* ws = w_scale;
    const float xs = x_scale;
    for (int64_t m = b; m < e; ++m) {
      if (bias) {  // the same loop twice, the test outside it: each vectorizes
        for (int64_t n = 0; n < N; ++n) out[m * N + n] = int8_value(a[m * N + n], xs, ws[n], bias, n);
      } else {
        for (int64_t n = 0; n < N; ++n) out[m * N + n] = int8_value(a[m * N + n], xs, ws[n], bias, n);
      }
    }
  });
}

/// y (M, N) = x (M, K) . dequantize(w)^T + bias, w packed int4 (N, K / 2) with group-wise
/// scales (N, K / group) and zero codes (null: symmetric, 8), through the float GEMM, kInt4Tile
/// weight rows at a time (the buffer is the only float copy of the weight, one tile of it).
inline void int4_linear(const float* x, const uint8_t* packed, const float* scale, const uint8_t* zero_point,
                              int64_t group, const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  std::vector<float> w(static_cast<size_t>(std::min(N, kInt4Tile) * K));
  for (int64_t n0 = 0; n0 < N; n0 += kInt4Tile) {
    const int64_t nb = std::min(kInt4Tile, N - n0);
    parallel_for(0, nb, 8, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) dequantize_int4_row_fast(packed, scale, zero_point, n0 + j, K, group, &w[j * K]);
    });
    GemmProblem p;
    p.m = M, p.n = nb, p.k = K;
    p.a = {x, K, 0, false};
    p.b = {w.data(), K, 0, true};  // (K, nb) stored as its transpose: the rows just dequantized
    p.c = {y + n0, N, 0};
    gemm(p);
  }
  if (bias)
    parallel_for(0, M, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(N, 1)), [&](int64_t b, int64_t e) {
      for (int64_t m = b; m < e; ++m)
        for (int64_t n = 0; n < N; ++n) y[m * N + n] += bias[n];
    });
}

}  // namespace strata::cpu::quant
