// The int8 convolution: the input's uint8 codes gathered by im2col (kernels/common/im2col.h) into
// the rows of the int8 Linear's GEMM (kernels/cpu/qgemm.h), one GEMM per group; conv2d_int8 and
// the static form Int8Conv2dForm (include/strata/quant/quantize_static.hpp, src/quant/forms.h).
#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>
#include <strata/quant/quantize_static.hpp>

#include "quant/dispatch.h"
#include "quant/forms.h"

namespace strata::quant {

namespace detail {

Tensor conv2d_codes(const Tensor& codes, const Tensor& x_scale, const Tensor& x_zero, uint8_t pad, const Int8Weight& w,
                    const Tensor& w_row_sum, const Tensor& bias, nn::Size2 k, const nn::functional::Conv2dArgs& a) {
  const int64_t N = codes.size(0), C = codes.size(1), H = codes.size(2), W = codes.size(3);
  const int64_t G = a.groups, out = w.codes.size(0), out_g = out / G;
  const int64_t OH = (H + 2 * a.padding.h - a.dilation.h * (k.h - 1) - 1) / a.stride.h + 1;
  const int64_t OW = (W + 2 * a.padding.w - a.dilation.w * (k.w - 1) - 1) / a.stride.w + 1;
  STRATA_CHECK(OH > 0 && OW > 0, "[conv2d_int8] the input of shape {} is smaller than the kernel {} (padding {}, "
               "dilation {})", codes.shape(), k, a.padding, a.dilation);
  qmath::Im2colShape shape{C, H, W, 0, C / G, k.h, k.w, a.stride.h, a.stride.w, a.padding.h, a.padding.w,
                           a.dilation.h, a.dilation.w, OH, OW};
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < G; ++g) {
    shape.c0 = g * shape.Cg;
    Tensor cols = empty({N * OH * OW, shape.cols()}, TensorOptions(kUInt8, codes.device()));
    run_im2col_u8(codes, shape, pad, cols);
    const Int8Weight wg = G == 1 ? w : Int8Weight{w.codes.narrow(0, g * out_g, out_g).contiguous(),
                                                  w.scale.narrow(0, g * out_g, out_g).contiguous()};
    const Tensor sums = G == 1 ? w_row_sum : w_row_sum.narrow(0, g * out_g, out_g).contiguous();
    const Tensor b = !bias.defined() || G == 1 ? bias : bias.narrow(0, g * out_g, out_g).contiguous();
    parts.push_back(int8_product(cols, x_scale, x_zero, false, wg, sums, b));  // (N * OH * OW, out_g)
  }
  const Tensor y = G == 1 ? parts[0] : cat(parts, 1);
  return y.reshape({N, OH, OW, out}).permute({0, 3, 1, 2}).contiguous();
}

namespace {

// The input checks of both entry points; returns x as a float32 contiguous (N, C, H, W).
Tensor conv_input(const Tensor& x, const Int8Weight& w, nn::Size2 k, const nn::functional::Conv2dArgs& a,
                  const char* op) {
  check_int8_weight(w, op);
  STRATA_CHECK(a.groups > 0 && k.h > 0 && k.w > 0 && a.stride.h > 0 && a.stride.w > 0 && a.padding.h >= 0 &&
                   a.padding.w >= 0 && a.dilation.h > 0 && a.dilation.w > 0,
               "[{}] invalid kernel {}, stride {}, padding {}, dilation {} or groups {}", op, k, a.stride, a.padding,
               a.dilation, a.groups);
  STRATA_CHECK(x.defined() && is_floating(x.dtype()) && (x.dim() == 3 || x.dim() == 4),
               "[{}] expects a floating input of shape (N, C, H, W) or (C, H, W)", op);
  const Tensor x4 = x.dim() == 3 ? x.unsqueeze(0) : x;
  const int64_t C = x4.size(1), out = w.codes.size(0);
  STRATA_CHECK(C % a.groups == 0 && out % a.groups == 0 && w.codes.size(1) == C / a.groups * k.h * k.w,
               "[{}] weight codes of shape {} do not fit {} input channels, kernel {} and {} groups", op,
               w.codes.shape(), C, k, a.groups);
  STRATA_CHECK(x.device() == w.codes.device(), "[{}] the input is on {} and the weight on {}", op, x.device(),
               w.codes.device());
  return x4.detach().to(kFloat32).contiguous();
}

Tensor unbatch_like(const Tensor& y, const Tensor& x) { return x.dim() == 3 ? y.squeeze(0) : y; }

}  // namespace

Int8Conv2dForm::Int8Conv2dForm(Int8Weight weight, StaticActivations act)
    : weight_(std::move(weight)), act_(std::move(act)) {
  weight_.codes = register_buffer("weight_int8", weight_.codes);
  weight_.scale = register_buffer("weight_scale", weight_.scale);
  register_static(*this, act_);
}

Tensor Int8Conv2dForm::forward_layer(const nn::Conv2d& layer, const Tensor& input) {
  const char* op = "Conv2d(int8)";
  NoGradGuard no_grad;
  const nn::functional::Conv2dArgs args = conv_args(layer);
  const Tensor x = conv_input(input, weight_, layer.kernel_size, args, op);
  Tensor zero;
  const Tensor codes = quantize_static_input(x, act_.input, &zero);
  const auto pad = static_cast<uint8_t>(zero.item<int64_t>());
  const Tensor y = conv2d_codes(codes, act_.input.scale.to(kFloat32).contiguous(), zero, pad, weight_,
                                row_sums_.of(weight_.codes), bias_of(layer.bias, layer.out_channels, x.device(),
                                                                     kFloat32, op),
                                layer.kernel_size, args);
  return unbatch_like(finish_static(y, act_), input).to(input.dtype());
}

}  // namespace detail

Tensor conv2d_int8(const Tensor& x, double x_scale, int64_t x_zero_point, const Int8Weight& w, nn::Size2 kernel_size,
                   const nn::functional::Conv2dArgs& args, const Tensor& bias) {
  const char* op = "conv2d_int8";
  NoGradGuard no_grad;
  const Tensor x4 = detail::conv_input(x, w, kernel_size, args, op);
  const detail::ActQParams in = detail::act_qparams(x_scale, x_zero_point, x.device(), op);
  Tensor zero;
  const Tensor codes = detail::quantize_static_input(x4, in, &zero);
  detail::RowSums sums;
  const Tensor y = detail::conv2d_codes(codes, in.scale, zero, static_cast<uint8_t>(x_zero_point), w,
                                        sums.of(w.codes), detail::bias_of(bias, w.codes.size(0), x.device(), kFloat32,
                                                                          op),
                                        kernel_size, args);
  return detail::unbatch_like(y, x);
}

}  // namespace strata::quant
