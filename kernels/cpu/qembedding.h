// CPU loops of the row-wise quantized embeddings (kernels/common/quant_rowwise.h): quantizing a
// weight's rows, and gathering and reducing rows by bags (Embedding is bags of one index).
#pragma once

#include <algorithm>
#include <cstdint>

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

/// out (bags, dim) float32: qmath::bag_element of every bag and element.
inline void embedding_bag_rowwise(const qmath::RowwiseTable& t, const qmath::Bags& g, float* out) {
  parallel_for(0, g.bags, std::max<int64_t>(1, 4096 / std::max<int64_t>(t.dim, 1)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t k = 0; k < t.dim; ++k) out[b * t.dim + k] = qmath::bag_element(t, g, b, k);
  });
}

}  // namespace strata::cpu::quant
