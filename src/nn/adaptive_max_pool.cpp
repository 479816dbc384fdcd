// Adaptive max pooling. Windows [floor(i * In / Out), ceil((i + 1) * In / Out)) tile each dim
// with equal strides when Out divides In, which is max_pool2d with kernel = stride = In / Out;
// otherwise their sizes vary, and as a maximum over a rectangle is the maximum over its rows of
// the maxima over its columns, the result is one amax per output column, then per output row.
// (adaptive_max_pool3d is a native op: nn/pooling3d.cpp.)
#include <strata/nn/functional_conv.hpp>
#include <strata/nn/pooling.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>

namespace strata::nn {

namespace functional {

namespace {

// The maxima over the adaptive windows of x's dim d, stacked along d.
Tensor max_over_windows(const Tensor& x, int64_t d, int64_t out) {
  const int64_t in = x.size(d);
  std::vector<Tensor> maxima;
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = i * in / out, end = ((i + 1) * in + out - 1) / out;
    maxima.push_back(amax(x.narrow(d, start, end - start), {d}));
  }
  return stack(maxima, d);
}

}  // namespace

Tensor adaptive_max_pool2d(const Tensor& input, Size2 output_size) {
  STRATA_CHECK(input.defined(), "[adaptive_max_pool2d] input tensor is undefined");
  STRATA_CHECK(input.dim() == 3 || input.dim() == 4,
               "[adaptive_max_pool2d] expects an input of shape (N, C, H, W) or (C, H, W), got shape {}",
               input.shape());
  STRATA_CHECK(output_size.h > 0 && output_size.w > 0, "[adaptive_max_pool2d] output_size must be positive, got {}",
               output_size);
  const int64_t h = input.size(-2), w = input.size(-1);
  STRATA_CHECK(h > 0 && w > 0, "[adaptive_max_pool2d] input of shape {} has an empty spatial dim", input.shape());
  if (h % output_size.h == 0 && w % output_size.w == 0) {
    const Size2 k(h / output_size.h, w / output_size.w);
    return max_pool2d(input, k, {k});
  }
  const int64_t hd = input.dim() - 2, wd = input.dim() - 1;
  return max_over_windows(max_over_windows(input, wd, output_size.w), hd, output_size.h);
}

Tensor adaptive_max_pool1d(const Tensor& input, int64_t output_size) {
  STRATA_CHECK(input.defined(), "[adaptive_max_pool1d] input tensor is undefined");
  STRATA_CHECK(input.dim() == 2 || input.dim() == 3,
               "[adaptive_max_pool1d] expects an input of shape (N, C, L) or (C, L), got shape {}", input.shape());
  return adaptive_max_pool2d(input.unsqueeze(-2), Size2(1, output_size)).squeeze(-2);
}

}  // namespace functional

AdaptiveMaxPool1d::AdaptiveMaxPool1d(int64_t s) : output_size(s) {
  STRATA_CHECK(s > 0, "[AdaptiveMaxPool1d] output_size must be positive, got {}", s);
}
Tensor AdaptiveMaxPool1d::forward(const Tensor& input) { return functional::adaptive_max_pool1d(input, output_size); }

AdaptiveMaxPool2d::AdaptiveMaxPool2d(Size2 s) : output_size(s) {
  STRATA_CHECK(s.h > 0 && s.w > 0, "[AdaptiveMaxPool2d] output_size must be positive, got {}", s);
}
Tensor AdaptiveMaxPool2d::forward(const Tensor& input) { return functional::adaptive_max_pool2d(input, output_size); }

AdaptiveMaxPool3d::AdaptiveMaxPool3d(Size3 s) : output_size(s) {
  STRATA_CHECK(s.d > 0 && s.h > 0 && s.w > 0, "[AdaptiveMaxPool3d] output_size must be positive, got {}", s);
}
Tensor AdaptiveMaxPool3d::forward(const Tensor& input) { return functional::adaptive_max_pool3d(input, output_size); }

}  // namespace strata::nn
