// The int4 weight-only Linear for few activation rows (decode): y (M, N) = x (M, K) .
// dequantize(w)^T + bias, reading the packed codes (N, K / 2) once and decoding them in registers.
//
// Why it is fast: at a few rows the product is bound by reading the weight, and the codes are 1/8
// of float32's bytes. Per group of a weight row, a table holds the 16 values (u - zero) * scale
// of the codes u = 0..15, the float math of dequantize_int4_row, so each decoded weight is bit for
// bit the dequantized one and the results differ from dequantize-then-matmul by the order of the
// sums alone. With AVX-512, 64 bytes are read as 16 int32 lanes of 8 codes (groups of 128), or 16
// bytes widened to 16 lanes of one byte (groups of 32 and 64), and each code position is a shift
// and a lookup in the table (vpermps reads the low 4 bits of each lane); the activations are
// reordered once per call to the order the codes come out in (reorder_runs), so the weight keeps
// its documented layout. AVX2 decodes 8 lanes the same way with integer math; other CPUs, and
// groups that are not a multiple of the vector's run, take a byte at a time.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "../common/quant_affine.h"
#include "parallel.h"
#include "quant.h"

namespace strata::cpu::quant {

/// Up to this many activation rows the Linear decodes codes in registers (int4_linear_direct);
/// beyond, dequantized tiles feed the float GEMM (int4_linear in qgemm.h), level with it from
/// about 48 rows (bench_quant, docs/quantization.md).
inline constexpr int64_t kInt4DirectMaxRows = 32;

namespace int4_detail {

// A codec reads a run of kRun = W * kPerLane codes (kRun / 2 bytes) into one register of W lanes
// (load_raw), each lane holding kPerLane consecutive codes, and gives the dequantized values of
// the r-th code of every lane (lookup): W values, elements l * kPerLane + r of the run.

/// One byte at a time: any even group, any CPU.
struct ScalarCodes {
  static constexpr int W = 1, kPerLane = 2, kRun = 2;
  using V = float;
  using Raw = uint32_t;
  using Table = std::array<float, 16>;
  static Table table(float scale, int32_t zero) {
    Table t;
    for (int u = 0; u < 16; ++u) t[u] = (static_cast<float>(u) - static_cast<float>(zero)) * scale;
    return t;
  }
  static Raw load_raw(const uint8_t* p) { return *p; }
  static V lookup(Raw raw, int r, const Table& t) { return t[(raw >> (4 * r)) & 0xF]; }
  static V zero() { return 0.0f; }
  static V load(const float* p) { return *p; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float sum(V v) { return v; }
};

#if defined(__AVX512F__)
/// kPerLane 8: 64 bytes as 16 int32 lanes of 8 codes each (a group of 128 or a multiple); 2: 16
/// bytes widened to 16 lanes of one byte (groups of 32 and 64). vpermps reads the low 4 bits of
/// each lane, so a lookup is a shift and a permute from the group's table of 16 values.
template <int PerLane>
struct VectorCodes {
  static constexpr int W = 16, kPerLane = PerLane, kRun = W * PerLane;
  static constexpr __mmask16 kAll = 0xFFFF;  // zero-masking forms with every lane on: the same
  using V = __m512;                          // instructions without an undefined source, which
  using Raw = __m512i;                       // gcc 12 reports as maybe-uninitialized
  using Table = __m512;
  static Table table(float scale, int32_t zero) {
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_mul_ps(_mm512_sub_ps(codes, _mm512_set1_ps(static_cast<float>(zero))), _mm512_set1_ps(scale));
  }
  static Raw load_raw(const uint8_t* p) {
    if constexpr (PerLane == 8)
      return _mm512_loadu_si512(p);
    else
      return _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static V lookup(Raw raw, int r, const Table& t) {
    return _mm512_maskz_permutexvar_ps(kAll, r == 0 ? raw : _mm512_maskz_srli_epi32(kAll, raw, 4 * r), t);
  }
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V v) {  // a store and a loop: gcc 12 warns on the _mm512_reduce_* intrinsics
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    float s = 0;
    for (float l : lanes) s += l;
    return s;
  }
};
#elif defined(__AVX2__) && defined(__FMA__)  // its sums use FMA
/// kPerLane 8: 32 bytes as 8 int32 lanes of 8 codes (groups that are multiples of 64); 2: 8
/// bytes widened to 8 lanes of one byte (groups that are multiples of 16). The values in integer math.
template <int PerLane>
struct VectorCodes {
  static constexpr int W = 8, kPerLane = PerLane, kRun = W * PerLane;
  using V = __m256;
  using Raw = __m256i;
  struct Table {
    __m256i zero;
    __m256 scale;
  };
  static Table table(float scale, int32_t zero) { return {_mm256_set1_epi32(zero), _mm256_set1_ps(scale)}; }
  static Raw load_raw(const uint8_t* p) {
    if constexpr (PerLane == 8)
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    else
      return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // (u - zero) is exact in int32 and in float alike, so this is dequantize_int4_row's value
  static V lookup(Raw raw, int r, const Table& t) {
    const __m256i codes = _mm256_and_si256(_mm256_srli_epi32(raw, 4 * r), _mm256_set1_epi32(0xF));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(codes, t.zero)), t.scale);
  }
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V v) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, v);
    float s = 0;
    for (float l : lanes) s += l;
    return s;
  }
};
#else
template <int PerLane>
using VectorCodes = ScalarCodes;
#endif

/// x (M, K) with each run of kRun elements reordered to the order in which lookup gives the run's
/// weights: x'[r * W + l] = x[l * kPerLane + r].
template <class Codes>
std::vector<float> reorder_runs(const float* x, int64_t M, int64_t K) {
  constexpr int W = Codes::W, P = Codes::kPerLane;
  std::vector<float> out(static_cast<size_t>(M * K));
  for (int64_t run = 0; run < M * K; run += Codes::kRun)  // kRun divides the group, hence K
    for (int r = 0; r < P; ++r)
      for (int l = 0; l < W; ++l) out[run + r * W + l] = x[run + l * P + r];
  return out;
}

/// out[i * NR + j] = sum_k x[i, k] * dequantize(w)[n + j, k] for MR activation rows (reordered,
/// stride K) and the NR weight rows from n. One row keeps two sums per weight row, so that
/// consecutive multiply-adds do not wait on each other.
template <class Codes, int MR, int NR>
void tile(const float* x, const uint8_t* packed, const float* scale, const uint8_t* zero_point, int64_t n, int64_t K,
          int64_t group, float* out) {
  using V = typename Codes::V;
  constexpr int W = Codes::W, S = MR == 1 ? 2 : 1;
  const int64_t groups = K / group;
  V acc[MR][NR][S];
  for (auto& row : acc)
    for (auto& sums : row)
      for (V& v : sums) v = Codes::zero();
  for (int64_t g = 0; g < groups; ++g) {
    typename Codes::Table t[NR];
    for (int j = 0; j < NR; ++j) {
      const int64_t at = (n + j) * groups + g;
      t[j] = Codes::table(scale[at], zero_point ? zero_point[at] : qmath::kInt4SymmetricZero);
    }
    for (int64_t k = g * group; k < (g + 1) * group; k += Codes::kRun) {
      typename Codes::Raw raw[NR];
      for (int j = 0; j < NR; ++j) raw[j] = Codes::load_raw(packed + (n + j) * (K / 2) + k / 2);
      for (int r = 0; r < Codes::kPerLane; ++r) {
        V w[NR];
        for (int j = 0; j < NR; ++j) w[j] = Codes::lookup(raw[j], r, t[j]);
        for (int i = 0; i < MR; ++i) {
          const V xv = Codes::load(x + i * K + k + r * W);
          for (int j = 0; j < NR; ++j) acc[i][j][r % S] = Codes::fma(xv, w[j], acc[i][j][r % S]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = 0;
      for (int h = 0; h < S; ++h) s += Codes::sum(acc[i][j][h]);
      out[i * NR + j] = s;
    }
}

// Every row of x against weight rows [n, n + NR), MR rows at a time, then the rest one by one.
template <class Codes, int MR, int NR>
void rows_times(const float* x, int64_t M, const uint8_t* packed, const float* scale, const uint8_t* zero_point,
                int64_t group, const float* bias, float* y, int64_t n, int64_t N, int64_t K) {
  float sums[MR * NR];
  const auto store = [&](int64_t m, int rows) {
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < NR; ++j) y[(m + i) * N + n + j] = sums[i * NR + j] + (bias ? bias[n + j] : 0.0f);
  };
  int64_t m = 0;
  for (; m + MR <= M; m += MR) {
    tile<Codes, MR, NR>(x + m * K, packed, scale, zero_point, n, K, group, sums);
    store(m, MR);
  }
  for (; m < M; ++m) {
    tile<Codes, 1, NR>(x + m * K, packed, scale, zero_point, n, K, group, sums);
    store(m, 1);
  }
}

template <class Codes, int MR, int NR>
void linear_tiles(const float* x, const uint8_t* packed, const float* scale, const uint8_t* zero_point,
                  int64_t group, const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  const int64_t tiles = (N + NR - 1) / NR;
  // a tile does M * NR * K multiply-adds
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(M * NR * K, 1));
  parallel_for(0, tiles, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t n = t * NR;
      if (n + NR <= N) {
        rows_times<Codes, MR, NR>(x, M, packed, scale, zero_point, group, bias, y, n, N, K);
      } else {  // the ragged end of the weight rows
        for (int64_t j = n; j < N; ++j)
          rows_times<Codes, MR, 1>(x, M, packed, scale, zero_point, group, bias, y, j, N, K);
      }
    }
  });
}

// Tiles of 4 weight rows for one activation row (two sums each), of 2 activation rows by 6
// weight rows beyond: what fits the 32 vector registers of AVX-512 best of those timed
// (bench_quant, 1 x 1024 x 1024 to 16 x 4096 x 4096).
template <class Codes>
void linear(const float* x, const uint8_t* packed, const float* scale, const uint8_t* zero_point, int64_t group,
            const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  const std::vector<float> xr = reorder_runs<Codes>(x, M, K);
  if (M == 1)
    linear_tiles<Codes, 1, 4>(xr.data(), packed, scale, zero_point, group, bias, y, M, N, K);
  else
    linear_tiles<Codes, 2, 6>(xr.data(), packed, scale, zero_point, group, bias, y, M, N, K);
}

}  // namespace int4_detail

/// Row n of a packed int4 weight, dequantized into `out` (K floats): dequantize_int4_row's values
/// (quant.h), with AVX-512 32 at a time (the table lookups above, the even and odd elements then
/// interleaved) where the group is a multiple of 32.
inline void dequantize_int4_row_fast(const uint8_t* packed, const float* scale, const uint8_t* zero_point, int64_t n,
                                     int64_t K, int64_t group, float* out) {
#if defined(__AVX512F__)
  using Codes = int4_detail::VectorCodes<2>;
  if (group % Codes::kRun == 0) {
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const int64_t groups = K / group;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t at = n * groups + g;
      const Codes::Table t = Codes::table(scale[at], zero_point ? zero_point[at] : qmath::kInt4SymmetricZero);
      for (int64_t k = g * group; k < (g + 1) * group; k += Codes::kRun) {
        const Codes::Raw raw = Codes::load_raw(packed + (n * K + k) / 2);
        const __m512 even = Codes::lookup(raw, 0, t), odd = Codes::lookup(raw, 1, t);
        _mm512_storeu_ps(out + k, _mm512_permutex2var_ps(even, first, odd));
        _mm512_storeu_ps(out + k + 16, _mm512_permutex2var_ps(even, second, odd));
      }
    }
    return;
  }
#endif
  dequantize_int4_row(packed, scale, zero_point, n, K, group, out);
}

/// y (M, N) = x (M, K) . dequantize(w)^T + bias with the codes decoded in registers: w packed
/// int4 (N, K / 2) with group-wise scales (N, K / group) and zero codes (null: symmetric, 8); bias
/// may be null. Threads split the weight rows.
inline void int4_linear_direct(const float* x, const uint8_t* packed, const float* scale, const uint8_t* zero_point,
                               int64_t group, const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
  namespace d = int4_detail;
  if (group % d::VectorCodes<8>::kRun == 0)
    d::linear<d::VectorCodes<8>>(x, packed, scale, zero_point, group, bias, y, M, N, K);
  else if (group % d::VectorCodes<2>::kRun == 0)
    d::linear<d::VectorCodes<2>>(x, packed, scale, zero_point, group, bias, y, M, N, K);
  else
    d::linear<d::ScalarCodes>(x, packed, scale, zero_point, group, bias, y, M, N, K);
}

}  // namespace strata::cpu::quant
