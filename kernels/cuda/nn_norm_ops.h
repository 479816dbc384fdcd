// Entry points of the CUDA row kernels of nn: layer norm / RMSNorm forward and backward
// (kernels/cuda/layer_norm.cu) and the fused softmax cross-entropy
// (kernels/cuda/cross_entropy.cu), callable from plain C++. Each is instantiated for Half,
// BFloat16, float and double, works on contiguous row-major arrays, launches on `stream` and
// returns the launch's cudaError_t. Statistics (mean, rstd, lse) are compute_t<T>: float for
// the 16-bit types and float, double for double; sums accumulate in float (double for
// double). Nothing is launched for empty arrays.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common/half.h"

namespace strata::cuda_kernels {

/// As kernels/cpu/layer_norm.h: y = (x - mean) * rstd * w + b over each row of x (rows, n)
/// (rms: no mean, rstd from mean(x^2)); w, b may be null; mean and rstd get one value per row.
/// A warp per row up to 1024 elements, a block per row above.
template <class T>
cudaError_t layer_norm_forward(cudaStream_t stream, const T* x, const T* w, const T* b, T* y, compute_t<T>* mean,
                               compute_t<T>* rstd, int64_t rows, int64_t n, double eps, bool rms);

/// gx = rstd * (g w - mean(g w) - xhat * mean(g w xhat)) per row (rms: no mean(g w) term).
template <class T>
cudaError_t layer_norm_backward_input(cudaStream_t stream, const T* g, const T* x, const compute_t<T>* mean,
                                      const compute_t<T>* rstd, const T* w, T* gx, int64_t rows, int64_t n, bool rms);

/// The row chunks of the weight and bias gradients' first stage: a function of the shape
/// alone, so the sums (and their rounding) do not depend on the GPU. 0 when rows == 0.
inline int64_t layer_norm_param_chunks(int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return 0;
  const int64_t tiles = (n + 31) / 32;                                      // 32 columns a block
  const int64_t wanted = std::max<int64_t>(1, 2048 / tiles);                // about 2048 blocks
  return std::min<int64_t>({wanted, (rows + 31) / 32, int64_t(1024)});      // at least 32 rows a chunk
}

/// gw = sum over rows of g * xhat, gb = sum over rows of g (either may be null), in two
/// deterministic stages: per-chunk column sums into `partial` (2 * chunks * n accumulators:
/// float, double for double; chunks = layer_norm_param_chunks), then the chunks in order.
template <class T>
cudaError_t layer_norm_backward_params(cudaStream_t stream, const T* g, const T* x, const compute_t<T>* mean,
                                       const compute_t<T>* rstd, T* gw, T* gb, void* partial, int64_t rows, int64_t n);

/// As kernels/cpu/cross_entropy.h: per row of x (rows, c), c >= 1, the loss at class
/// target[r] (0 when ignored, NaN when out of range) and the row's logsumexp. w (c) or null;
/// total_weight = sum of w (unused without w). A warp per row up to 1024 classes, a block
/// per row above.
template <class T>
cudaError_t cross_entropy_forward(cudaStream_t stream, const T* x, const int64_t* target, const T* w, T* loss,
                                  compute_t<T>* lse, int64_t rows, int64_t c, int64_t ignore_index, double eps,
                                  double total_weight);

/// gx (rows, c) from the per-row output gradients g[r * g_stride] (0 broadcasts one value),
/// the logits and the saved logsumexp.
template <class T>
cudaError_t cross_entropy_backward(cudaStream_t stream, const T* g, int64_t g_stride, const T* x,
                                   const int64_t* target, const compute_t<T>* lse, const T* w, T* gx, int64_t rows,
                                   int64_t c, int64_t ignore_index, double eps, double total_weight);

}  // namespace strata::cuda_kernels
