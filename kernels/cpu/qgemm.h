// Integer GEMMs of the quantized Linear layers on the CPU.
//
// int8: C (M, N) = A (M, K) . B (N, K)^T with int8 operands and int32 sums, B in a Linear
// weight's (out, in) layout so both operands are read along K. Tiles of 2 rows of A by 4 rows
// of B keep 8 sums in vector registers (`omp simd` reductions over K, which gcc turns into
// widening multiply-adds); the epilogue gets each tile's exact sums. int32 holds any sum while
// K <= kMaxInt8K (|a * b| <= 2^14).
//
// int4 (weight only): each block of 8 weight rows is dequantized to float once into a buffer,
// then every activation row is multiplied against it; activations are float or bfloat16, the
// sums float.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../common/half.h"
#include "parallel.h"
#include "quant.h"

namespace strata::cpu::quant {

inline constexpr int64_t kMaxInt8K = int64_t{1} << 17;  // 2^17 * 2^14 = 2^31

namespace detail {

inline int32_t dot_s8(const int8_t* a, const int8_t* b, int64_t K) {
  int32_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < K; ++k) s += int32_t{a[k]} * int32_t{b[k]};
  return s;
}

// sums of rows a0, a1 with rows b0..b3
inline void tile_2x4(const int8_t* a0, const int8_t* a1, const int8_t* b0, const int8_t* b1, const int8_t* b2,
                     const int8_t* b3, int64_t K, int32_t* out) {
  int32_t s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
#pragma omp simd reduction(+ : s00, s01, s02, s03, s10, s11, s12, s13)
  for (int64_t k = 0; k < K; ++k) {
    const int32_t x0 = a0[k], x1 = a1[k];
    const int32_t w0 = b0[k], w1 = b1[k], w2 = b2[k], w3 = b3[k];
    s00 += x0 * w0, s01 += x0 * w1, s02 += x0 * w2, s03 += x0 * w3;
    s10 += x1 * w0, s11 += x1 * w1, s12 += x1 * w2, s13 += x1 * w3;
  }
  out[0] = s00, out[1] = s01, out[2] = s02, out[3] = s03, out[4] = s10, out[5] = s11, out[6] = s12, out[7] = s13;
}

}  // namespace detail

/// Calls epilogue(m, n, sum) once for every output, sum = sum_k a[m, k] * b[n, k] exactly.
/// Tiles run in parallel over blocks of B's rows (the weight, read once per block).
template <class Epilogue>
void gemm_s8s8s32(const int8_t* a, const int8_t* b, int64_t M, int64_t N, int64_t K, const Epilogue& epilogue) {
  constexpr int64_t NB = 4;
  const int64_t n_tiles = (N + NB - 1) / NB;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(M * K, 1));
  parallel_for(0, n_tiles, grain, [&](int64_t tb, int64_t te) {
    int32_t sums[8];
    for (int64_t t = tb; t < te; ++t) {
      const int64_t n = t * NB;
      if (n + NB > N) {  // ragged edge of B
        for (int64_t m = 0; m < M; ++m)
          for (int64_t j = n; j < N; ++j) epilogue(m, j, detail::dot_s8(a + m * K, b + j * K, K));
        continue;
      }
      const int8_t* bs = b + n * K;
      int64_t m = 0;
      for (; m + 2 <= M; m += 2) {
        detail::tile_2x4(a + m * K, a + (m + 1) * K, bs, bs + K, bs + 2 * K, bs + 3 * K, K, sums);
        for (int64_t j = 0; j < NB; ++j) {
          epilogue(m, n + j, sums[j]);
          epilogue(m + 1, n + j, sums[NB + j]);
        }
      }
      for (; m < M; ++m)
        for (int64_t j = 0; j < NB; ++j) epilogue(m, n + j, detail::dot_s8(a + m * K, bs + j * K, K));
    }
  });
}

/// y (M, N) = x_scale[m] * w_scale[n] * (sum_k xq[m, k] * wq[n, k] - x_zero[m] * w_row_sum[n]) + bias[n]:
/// the int8 Linear with affine activations (one scale and zero point per row, or one for all
/// rows when x_per_row is false) and symmetric per-channel weights; bias may be null.
template <class T>
void int8_linear(const int8_t* xq, const float* x_scale, const int32_t* x_zero, bool x_per_row, const int8_t* wq,
                 const float* w_scale, const int32_t* w_row_sum, const T* bias, T* y, int64_t M, int64_t N,
                 int64_t K) {
  gemm_s8s8s32(xq, wq, M, N, K, [&](int64_t m, int64_t n, int32_t sum) {
    const int64_t r = x_per_row ? m : 0;
    const int64_t exact = int64_t{sum} - int64_t{x_zero[r]} * w_row_sum[n];
    float v = static_cast<float>(exact) * (x_scale[r] * w_scale[n]);
    if (bias) v += static_cast<float>(bias[n]);
    y[m * N + n] = static_cast<T>(v);
  });
}

/// y (M, N) = x (M, K) . dequantize(w)^T + bias, w packed int4 (N, K / 2) with group-wise
/// scales (N, K / group) and zero points (null: symmetric). T is float or BFloat16.
template <class T>
void int4_linear(const T* x, const uint8_t* packed, const float* scale, const uint8_t* zero_point, int64_t group,
                 const T* bias, T* y, int64_t M, int64_t N, int64_t K) {
  constexpr int64_t NB = 8;
  const int64_t n_blocks = (N + NB - 1) / NB;
  parallel_for(0, n_blocks, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(M * K, 1)),
               [&](int64_t bb, int64_t be) {
                 std::vector<float> w(static_cast<size_t>(NB * K));
                 for (int64_t blk = bb; blk < be; ++blk) {
                   const int64_t n0 = blk * NB, nb = std::min(NB, N - n0);
                   for (int64_t j = 0; j < nb; ++j)
                     dequantize_int4_row(packed, scale, zero_point, n0 + j, K, group, w.data() + j * K);
                   for (int64_t m = 0; m < M; ++m) {
                     const T* xr = x + m * K;
                     for (int64_t j = 0; j < nb; ++j) {
                       const float* wr = w.data() + j * K;
                       float s = 0.0f;
#pragma omp simd reduction(+ : s)
                       for (int64_t k = 0; k < K; ++k) s += static_cast<float>(xr[k]) * wr[k];
                       if (bias) s += static_cast<float>(bias[n0 + j]);
                       y[m * N + n0 + j] = static_cast<T>(s);
                     }
                   }
                 }
               });
}

}  // namespace strata::cpu::quant
