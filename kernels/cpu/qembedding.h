// CPU loops of the row-wise quantized embeddings (kernels/common/quant_rowwise.h): quantizing a
// weight's rows, and gathering and reducing rows by bags (Embedding is bags of one index).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/common/quant_rowwise.h"
#include "kernels/cpu/parallel.h"

namespace strata::cpu::quant {

/// w (rows, dim) float32 -> codes (rows, rowwise_bytes(dim, bits)), scale (rows), bias (rows).
inline void quantize_rows_float_qparams(const float* w, int64_t rows, int64_t dim, int bits, uint8_t* codes,
                                        float* scale, float* bias) {
  const int64_t bytes = qmath::rowwise_bytes(dim, bits);
  parallel_for(0, rows, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(dim, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const qmath::RowQParams p = qmath::quantize_row_float_qparams(w + r * dim, dim, bits, codes + r * bytes);
      scale[r] = p.scale;
      bias[r] = p.bias;
    }
  });
}

/// row (dim) float32 = the dequantized row of `bits` codes (a loop per width, so both vectorize;
/// 4 bits a byte at a time: its low nibble, then its high one).
inline void dequantize_row(const uint8_t* codes, int bits, qmath::RowQParams p, int64_t dim, float* row) {
  if (bits == 8) {
    for (int64_t k = 0; k < dim; ++k) row[k] = qmath::rowwise_value(codes[k], p);
    return;
  }
  for (int64_t j = 0; j < dim / 2; ++j) {
    row[2 * j] = qmath::rowwise_value(qmath::low_nibble(codes[j]), p);
    row[2 * j + 1] = qmath::rowwise_value(qmath::high_nibble(codes[j]), p);
  }
  if (dim % 2) row[dim - 1] = qmath::rowwise_value(qmath::low_nibble(codes[dim / 2]), p);
}

/// out (bags, dim) float32: qmath::bag_element of every bag and element, computed a row at a time
/// (each id's row dequantized once, then folded in) with the same folds.
inline void embedding_bag_rowwise(const qmath::RowwiseTable& t, const qmath::Bags& g, float* out) {
  const int64_t bytes = qmath::rowwise_bytes(t.dim, t.bits);
  parallel_for(0, g.bags, std::max<int64_t>(1, 4096 / std::max<int64_t>(t.dim, 1)), [&](int64_t b0, int64_t b1) {
    std::vector<double> acc(static_cast<size_t>(t.dim));
    std::vector<float> row(static_cast<size_t>(t.dim));
    for (int64_t b = b0; b < b1; ++b) {
      int64_t begin = 0, end = 0, kept = 0;
      qmath::bag_bounds(g, b, &begin, &end);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t id = g.ids[i];
        if (id == g.padding_idx) continue;
        const qmath::RowQParams p{t.scale[id], t.bias[id]};
        dequantize_row(t.codes + id * bytes, t.bits, p, t.dim, row.data());
        const bool first = kept++ == 0;
        double* a = acc.data();
        const float* v = row.data();
        if (g.mode == qmath::BagMode::Max) {  // the mode hoisted, so that each loop vectorizes
          for (int64_t k = 0; k < t.dim; ++k) a[k] = qmath::bag_fold(a[k], v[k], g, i, first);
        } else {
          for (int64_t k = 0; k < t.dim; ++k) a[k] = qmath::bag_fold(a[k], v[k], g, i, first);
        }
      }
      for (int64_t k = 0; k < t.dim; ++k) out[b * t.dim + k] = qmath::bag_result(acc[k], kept, g);
    }
  });
}

}  // namespace strata::cpu::quant
