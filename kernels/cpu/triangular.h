// CPU loop for tril / triu over the last two dims of a batch of matrices: keeps element
// (i, j) when j - i <= diagonal (lower) or j - i >= diagonal (upper), zeroes the rest.
#pragma once

#include <cstdint>

#include "parallel.h"
#include "strided_rows.h"

namespace strata::cpu {

/// The matrix dims of a tril / triu: sizes and the strides of the input and the output.
struct MatrixDims {
  int64_t rows, cols;
  int64_t x_row, x_col, out_row, out_col;
};

/// `batch` walks the leading dims with operands (out, x).
template <class T>
void triangular(const StridedLoop<2>& batch, const MatrixDims& m, int64_t diagonal, bool upper, T* out, const T* x) {
  const int64_t total_rows = batch.numel * m.rows;
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(m.cols, 1));
  parallel_for(0, total_rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t i = r % m.rows;
      auto off = offsets_at(batch, r / m.rows);
      T* o = out + off[0] + i * m.out_row;
      const T* xs = x + off[1] + i * m.x_row;
      for (int64_t j = 0; j < m.cols; ++j) {
        bool keep = upper ? j - i >= diagonal : j - i <= diagonal;
        o[j * m.out_col] = keep ? xs[j * m.x_col] : T(0);
      }
    }
  });
}

}  // namespace strata::cpu
