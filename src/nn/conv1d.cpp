// conv1d and conv_transpose1d: the 2-d ops over a height-1 view (N, C, 1, L) of the input and
// (C_out, C_in / groups, 1, k) of the weight, so both devices, every layout and the
// gradients come from conv2d. The checks here name the 1-d shapes.
#include <strata/nn/functional_conv.hpp>

namespace strata::nn::functional {

namespace {

void check_shapes(const char* op, const Tensor& input, const Tensor& weight, int64_t weight_in_channels) {
  STRATA_CHECK(input.defined() && weight.defined(), "[{}] input and weight must be defined", op);
  STRATA_CHECK(input.dim() == 2 || input.dim() == 3, "[{}] expects an input of shape (N, C, L) or (C, L), got shape {}",
               op, input.shape());
  STRATA_CHECK(weight.dim() == 3, "[{}] expects a 3-d weight, got shape {}", op, weight.shape());
  const int64_t channels = input.size(input.dim() - 2);
  STRATA_CHECK(channels == weight_in_channels,
               "[{}] input of shape {} has {} channels; the weight of shape {} takes {}", op, input.shape(), channels,
               weight.shape(), weight_in_channels);
}

}  // namespace

Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv1dArgs& args) {
  STRATA_CHECK(args.groups > 0, "[conv1d] groups must be positive, got {}", args.groups);
  check_shapes("conv1d", input, weight, weight.defined() && weight.dim() == 3 ? weight.size(1) * args.groups : -1);
  const Conv2dArgs a{Size2(1, args.stride), Size2(0, args.padding), Size2(1, args.dilation), args.groups};
  return conv2d(input.unsqueeze(-2), weight.unsqueeze(2), bias, a).squeeze(-2);
}

Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose1dArgs& args) {
  check_shapes("conv_transpose1d", input, weight, weight.defined() && weight.dim() == 3 ? weight.size(0) : -1);
  const ConvTranspose2dArgs a{Size2(1, args.stride), Size2(0, args.padding), Size2(0, args.output_padding),
                              args.groups, Size2(1, args.dilation)};
  return conv_transpose2d(input.unsqueeze(-2), weight.unsqueeze(2), bias, a).squeeze(-2);
}

}  // namespace strata::nn::functional
