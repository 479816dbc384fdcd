// 1-d pooling: the 2-d ops over a height-1 view (N, C, 1, L) of the input, so both devices, the
// layouts and the gradients come from them; and the 1-d pooling layers.
#include <strata/nn/functional_conv.hpp>
#include <strata/nn/pooling.hpp>

namespace strata::nn {

namespace functional {

namespace {

void check_input(const char* op, const Tensor& input) {
  STRATA_CHECK(input.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(input.dim() == 2 || input.dim() == 3, "[{}] expects an input of shape (N, C, L) or (C, L), got shape {}",
               op, input.shape());
}

MaxPool2dArgs as_2d(const MaxPool1dArgs& a) {
  std::optional<Size2> stride;
  if (a.stride) stride = Size2(1, *a.stride);
  return {stride, Size2(0, a.padding), Size2(1, a.dilation), a.ceil_mode};
}

}  // namespace

Tensor max_pool1d(const Tensor& input, int64_t kernel_size, const MaxPool1dArgs& args) {
  check_input("max_pool1d", input);
  return max_pool2d(input.unsqueeze(-2), Size2(1, kernel_size), as_2d(args)).squeeze(-2);
}

MaxPoolResult max_pool1d_with_indices(const Tensor& input, int64_t kernel_size, const MaxPool1dArgs& args) {
  check_input("max_pool1d", input);
  MaxPoolResult r = max_pool2d_with_indices(input.unsqueeze(-2), Size2(1, kernel_size), as_2d(args));
  return {r.output.squeeze(-2), r.indices.squeeze(-2)};  // h * W + w with h = 0: the position along L
}

Tensor avg_pool1d(const Tensor& input, int64_t kernel_size, const AvgPool1dArgs& args) {
  check_input("avg_pool1d", input);
  std::optional<Size2> stride;
  if (args.stride) stride = Size2(1, *args.stride);
  const AvgPool2dArgs a{stride, Size2(0, args.padding), args.ceil_mode, args.count_include_pad, std::nullopt};
  return avg_pool2d(input.unsqueeze(-2), Size2(1, kernel_size), a).squeeze(-2);
}

Tensor adaptive_avg_pool1d(const Tensor& input, int64_t output_size) {
  check_input("adaptive_avg_pool1d", input);
  return adaptive_avg_pool2d(input.unsqueeze(-2), Size2(1, output_size)).squeeze(-2);
}

}  // namespace functional

MaxPool1d::MaxPool1d(int64_t k, functional::MaxPool1dArgs o) : kernel_size(k), options(o) {
  STRATA_CHECK(k > 0, "[MaxPool1d] kernel_size must be positive, got {}", k);
}
Tensor MaxPool1d::forward(const Tensor& input) { return functional::max_pool1d(input, kernel_size, options); }
functional::MaxPoolResult MaxPool1d::forward_with_indices(const Tensor& input) {
  return functional::max_pool1d_with_indices(input, kernel_size, options);
}

AvgPool1d::AvgPool1d(int64_t k, functional::AvgPool1dArgs o) : kernel_size(k), options(o) {
  STRATA_CHECK(k > 0, "[AvgPool1d] kernel_size must be positive, got {}", k);
}
Tensor AvgPool1d::forward(const Tensor& input) { return functional::avg_pool1d(input, kernel_size, options); }

AdaptiveAvgPool1d::AdaptiveAvgPool1d(int64_t s) : output_size(s) {
  STRATA_CHECK(s > 0, "[AdaptiveAvgPool1d] output_size must be positive, got {}", s);
}
Tensor AdaptiveAvgPool1d::forward(const Tensor& input) { return functional::adaptive_avg_pool1d(input, output_size); }

}  // namespace strata::nn
