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

/// out (bags, dim) float32: qmath::bag_element of every bag and element, computed a row at a time
/// (each id's row read once, in order) with the same folds.
inline void embedding_bag_rowwise(const qmath::RowwiseTable& t, const qmath::Bags& g, float* out) {
  const int64_t bytes = qmath::rowwise_bytes(t.dim, t.bits);
  parallel_for(0, g.bags, std::max<int64_t>(1, 4096 / std::max<int64_t>(t.dim, 1)), [&](int64_t b0, int64_t b1) {
    std::vector<double> acc(static_cast<size_t>(t.dim));
    for (int64_t b = b0; b < b1; ++b) {
      int64_t begin = 0, end = 0, kept = 0;
      qmath::bag_bounds(g, b, &begin, &end);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t i = begin; i < end; ++i) {
        const int64_t id = g.ids[i];
        if (id == g.padding_idx) continue;
        const uint8_t* row = t.codes + id * bytes;
        const qmath::RowQParams p{t.scale[id], t.bias[id]};
        const bool first = kept++ == 0;
        for (int64_t k = 0; k < t.dim; ++k)
          acc[k] = qmath::bag_fold(acc[k], qmath::rowwise_value(qmath::rowwise_code(row, k, t.bits), p), g, i, first);
      }
      for (int64_t k = 0; k < t.dim; ++k) out[b * t.dim + k] = qmath::bag_result(acc[k], kept, g);
    }
  });
}

}  // namespace strata::cpu::quant
