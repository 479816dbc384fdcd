// Weight-only row-wise quantization with float qparams, as PyTorch's quantized embeddings
// (float_qparams_weight_only_qconfig, qscheme per_channel_affine_float_qparams, and the rows
// fbgemm's embedding_bag_byte_prepack / embedding_bag_4bit_prepack store): each row of the
// weight gets its own float scale and float zero point,
//
//   scale = (max - min) / qmax        (1 when not above eps: a constant row)
//   zero_point = -min / scale         (a float: the range is not widened to hold 0)
//   q = clamp(rint(x * (1 / scale) + zero_point), 0, qmax)
//   x' = scale * q + bias,  bias = -zero_point * scale   (about min)
//
// with qmax 255 (8 bits, one code a byte) or 15 (4 bits, two codes a byte: element 2j in the
// low nibble of byte j, as quint4x2). The range is over finite values (Note [Non-finite values
// in quantization]); NaN takes the code nearest the zero point, +-inf the end codes.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "host_device.h"
#include "quant_affine.h"

namespace strata::qmath {

/// a * b + c with two roundings, never fused into one multiply-add (nvcc fuses by default; the CPU
/// files that use this are compiled with -ffp-contract=off), so host and device give the same bits.
STRATA_HOST_DEVICE float mul_add_unfused(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

struct RowQParams {
  float scale, bias;
};

/// Bytes a row of `dim` codes of `bits` (8 or 4) takes.
STRATA_HOST_DEVICE int64_t rowwise_bytes(int64_t dim, int bits) { return bits == 8 ? dim : (dim + 1) / 2; }

/// Quantizes one row of `dim` values to codes of `bits` (dst: rowwise_bytes(dim, bits) bytes).
STRATA_HOST_DEVICE RowQParams quantize_row_float_qparams(const float* src, int64_t dim, int bits, uint8_t* dst) {
  float lo = FLT_MAX, hi = -FLT_MAX;
  finite_min_max(src, dim, 1, &lo, &hi);
  settle_empty_range(&lo, &hi);
  const int32_t qmax = bits == 8 ? 255 : 15;
  float scale = (hi - lo) / static_cast<float>(qmax);
  scale = scale > kScaleEps ? scale : 1.0f;
  const float zero_point = -lo / scale, inv = 1.0f / scale;
  for (int64_t k = 0; k < rowwise_bytes(dim, bits); ++k) dst[k] = 0;
  for (int64_t k = 0; k < dim; ++k) {
    const float x = src[k];
    const float code = x != x ? rintf(zero_point) : rintf(mul_add_unfused(x, inv, zero_point));
    const auto q = static_cast<uint8_t>(clamp_code(code, 0, qmax));
    if (bits == 8) {
      dst[k] = q;
    } else {
      dst[k / 2] = static_cast<uint8_t>(dst[k / 2] | (q << ((k & 1) * 4)));
    }
  }
  return {scale, -zero_point * scale};
}

/// Code k of a row of `bits`.
STRATA_HOST_DEVICE int32_t rowwise_code(const uint8_t* row, int64_t k, int bits) {
  return bits == 8 ? row[k] : ((k & 1) ? high_nibble(row[k / 2]) : low_nibble(row[k / 2]));
}

/// The float a code stands for (float32 arithmetic, the same on every device).
STRATA_HOST_DEVICE float rowwise_value(int32_t q, RowQParams p) {
  return mul_add_unfused(p.scale, static_cast<float>(q), p.bias);
}

enum class BagMode { Sum, Mean, Max };

/// A quantized table: the rows' codes, qparams and shape.
struct RowwiseTable {
  const uint8_t* codes;
  const float* scale;
  const float* bias;
  int64_t dim;
  int bits;
};

/// What to gather: bag b holds ids[starts[b] .. starts[b + 1]) (starts null: bag b is ids[b]),
/// weights (one per id, or null) scale the rows, ids equal to padding_idx (-1: none) are left out.
struct Bags {
  const int64_t* ids;
  const int64_t* starts;  // bags + 1 entries, or null
  int64_t bags;
  const float* weights;
  int64_t padding_idx;
  BagMode mode;
};

/// The ids of bag b: [*begin, *end).
STRATA_HOST_DEVICE void bag_bounds(const Bags& g, int64_t b, int64_t* begin, int64_t* end) {
  *begin = g.starts ? g.starts[b] : b;
  *end = g.starts ? g.starts[b + 1] : b + 1;
}

/// acc with the value v of the bag's id i folded in (first: no id kept before it).
STRATA_HOST_DEVICE double bag_fold(double acc, double v, const Bags& g, int64_t i, bool first) {
  if (g.mode == BagMode::Max) return first || v > acc ? v : acc;
  return acc + (g.weights ? static_cast<double>(g.weights[i]) : 1.0) * v;
}

/// The bag's result from its fold over `kept` ids (0 for an empty bag).
STRATA_HOST_DEVICE float bag_result(double acc, int64_t kept, const Bags& g) {
  return static_cast<float>(g.mode == BagMode::Mean && kept > 0 ? acc / static_cast<double>(kept) : acc);
}

/// Element k of bag b: its dequantized rows summed (weighted), averaged over the rows kept or
/// their maximum, 0 for an empty bag. The sum is taken in float64 in index order and rounded
/// once, so the result is the float64 reduction of the dequantized rows rounded to float32.
STRATA_HOST_DEVICE float bag_element(const RowwiseTable& t, const Bags& g, int64_t b, int64_t k) {
  const int64_t bytes = rowwise_bytes(t.dim, t.bits);
  int64_t begin = 0, end = 0, kept = 0;
  bag_bounds(g, b, &begin, &end);
  double acc = 0.0;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t id = g.ids[i];
    if (id == g.padding_idx) continue;
    const double v = rowwise_value(rowwise_code(t.codes + id * bytes, k, t.bits), RowQParams{t.scale[id], t.bias[id]});
    acc = bag_fold(acc, v, g, i, kept++ == 0);
  }
  return bag_result(acc, kept, g);
}

}  // namespace strata::qmath
