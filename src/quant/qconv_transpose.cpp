// The int8 transposed convolution (Int8ConvTranspose2dForm, conv_transpose2d_int8): each input
// pixel's uint8 codes times the weight's int8 codes in the int8 Linear's GEMM and epilogue
// (kernels/cpu/qgemm.h), one column per (kernel tap, output channel), exact int32 sums with the
// input's zero point subtracted per column; the float columns are then summed into the output
// (col2im, one strided add per tap), the bias added and the result finished (ReLU, requantization).
// No padding enters the products: a transposed convolution's padding crops its output.
#include <algorithm>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/quant/quantize_static.hpp>

#include "quant/forms.h"

namespace strata::quant {

namespace detail {

namespace {

// The output size of a transposed convolution along one dim.
int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation, int64_t out_pad) {
  return (in - 1) * stride - 2 * pad + dilation * (k - 1) + out_pad + 1;
}

// The checks of both entry points; x as (N, C, H, W).
Tensor transposed_input(const Tensor& x, const Int8Weight& w, nn::Size2 k, const nn::functional::ConvTranspose2dArgs& a,
                        const char* op) {
  check_int8_weight(w, op);
  STRATA_CHECK(a.groups > 0 && k.h > 0 && k.w > 0 && a.stride.h > 0 && a.stride.w > 0 && a.padding.h >= 0 &&
                   a.padding.w >= 0 && a.dilation.h > 0 && a.dilation.w > 0 && a.output_padding.h >= 0 &&
                   a.output_padding.w >= 0,
               "[{}] invalid kernel {}, stride {}, padding {}, output_padding {}, dilation {} or groups {}", op, k,
               a.stride, a.padding, a.output_padding, a.dilation, a.groups);
  STRATA_CHECK((a.output_padding.h < a.stride.h || a.output_padding.h < a.dilation.h) &&
                   (a.output_padding.w < a.stride.w || a.output_padding.w < a.dilation.w),
               "[{}] output_padding {} must be smaller than stride {} or dilation {}", op, a.output_padding, a.stride,
               a.dilation);
  STRATA_CHECK(x.defined() && is_floating(x.dtype()) && (x.dim() == 3 || x.dim() == 4),
               "[{}] expects a floating input of shape (N, C, H, W) or (C, H, W)", op);
  const Tensor x4 = x.dim() == 3 ? x.unsqueeze(0) : x;
  const int64_t C = x4.size(1), out = w.codes.size(0);
  STRATA_CHECK(x4.size(2) > 0 && x4.size(3) > 0, "[{}] expects an input with rows and columns, got {} x {} "
               "(shape {})", op, x4.size(2), x4.size(3), x.shape());
  STRATA_CHECK(C % a.groups == 0 && out % a.groups == 0 && w.codes.size(1) == C / a.groups * k.h * k.w,
               "[{}] weight codes of shape {} do not fit {} input channels, kernel {} and {} groups (expected (out, "
               "in / groups * kH * kW))", op, w.codes.shape(), C, k, a.groups);
  STRATA_CHECK(x.device() == w.codes.device(), "[{}] the input is on {} and the weight on {}", op, x.device(),
               w.codes.device());
  return x4;
}

}  // namespace

Tensor conv_transpose2d_codes(const Tensor& x, const ActQParams& in, const Int8Weight& w, const Tensor& bias,
                              nn::Size2 k, const nn::functional::ConvTranspose2dArgs& a, const StaticActivations* act,
                              CodesCache* layout, CodesCache* sums, const char* op) {
  NoGradGuard no_grad;
  const Tensor x4 = transposed_input(x, w, k, a, op);
  const int64_t N = x4.size(0), C = x4.size(1), H = x4.size(2), W = x4.size(3);
  const int64_t G = a.groups, Cg = C / G, out = w.codes.size(0), out_g = out / G, taps = k.h * k.w;
  const int64_t OH = out_size(H, k.h, a.stride.h, a.padding.h, a.dilation.h, a.output_padding.h);
  const int64_t OW = out_size(W, k.w, a.stride.w, a.padding.w, a.dilation.w, a.output_padding.w);
  STRATA_CHECK(OH > 0 && OW > 0, "[{}] the output of an input of {} x {} would be empty (kernel {}, padding {})", op,
               H, W, k, a.padding);
  const Tensor b = bias_of(bias, out, x.device(), kFloat32, op);
  Tensor zero;
  const Tensor codes = nhwc_codes(x4, in, &zero).reshape({N * H * W, C});
  // the weight's rows as (group, kH, kW, out / groups), columns the group's input channels
  const auto lay_out = [&](const Tensor& c) {
    return c.reshape({G, out_g, Cg, k.h, k.w}).permute({0, 3, 4, 1, 2}).contiguous().reshape({G * taps * out_g, Cg});
  };
  const Tensor wcodes = layout ? layout->of(w.codes, lay_out) : lay_out(w.codes);
  const Tensor wsums = sums ? sums->of(wcodes, row_sums) : row_sums(wcodes);
  const Tensor wscale =
      w.scale.to(kFloat32).reshape({G, 1, 1, out_g}).expand({G, k.h, k.w, out_g}).contiguous().reshape({-1});
  const Tensor x_scale = in.scale.to(kFloat32).contiguous();
  // the output before cropping the padding: every tap of every input pixel lands inside it
  const int64_t FH = std::max((H - 1) * a.stride.h + a.dilation.h * (k.h - 1) + 1, a.padding.h + OH);
  const int64_t FW = std::max((W - 1) * a.stride.w + a.dilation.w * (k.w - 1) + 1, a.padding.w + OW);
  const Tensor full = zeros({N, FH, FW, out}, TensorOptions(kFloat32, x.device()));
  for (int64_t g = 0; g < G; ++g) {
    const auto rows = [&](const Tensor& t) { return t.narrow(0, g * taps * out_g, taps * out_g).contiguous(); };
    const Tensor cols = G == 1 ? codes : codes.narrow(1, g * Cg, Cg).contiguous();
    const Tensor prod = int8_product(cols, x_scale, zero, false, {rows(wcodes), rows(wscale)}, rows(wsums), Tensor())
                            .reshape({N, H, W, k.h, k.w, out_g});
    for (int64_t i = 0; i < k.h; ++i)
      for (int64_t j = 0; j < k.w; ++j) {
        const int64_t h0 = i * a.dilation.h, w0 = j * a.dilation.w;
        full.slice(1, h0, h0 + (H - 1) * a.stride.h + 1, a.stride.h)
            .slice(2, w0, w0 + (W - 1) * a.stride.w + 1, a.stride.w)
            .narrow(3, g * out_g, out_g)
            .add_(prod.select(3, i).select(3, j));
      }
  }
  Tensor y = full.narrow(1, a.padding.h, OH).narrow(2, a.padding.w, OW);  // (N, OH, OW, out)
  y = b.defined() ? y + b : y.contiguous();
  if (act) y = finish_static(y, *act);
  return like_input(y.permute({0, 3, 1, 2}), x);
}

Int8ConvTranspose2dForm::Int8ConvTranspose2dForm(Int8Weight weight, StaticActivations act)
    : weight_(std::move(weight)), act_(std::move(act)) {
  register_int8(*this, weight_, act_);
}

Tensor Int8ConvTranspose2dForm::forward_layer(const nn::ConvTranspose2d& layer, const Tensor& input) {
  return conv_transpose2d_codes(input, act_.input, weight_, layer.bias, layer.kernel_size, conv_args(layer), &act_,
                                &gemm_layout_, &row_sums_, "ConvTranspose2d(int8)")
      .to(input.dtype());
}

}  // namespace detail

Tensor conv_transpose2d_int8(const Tensor& x, double x_scale, int64_t x_zero_point, const Int8Weight& w,
                             nn::Size2 kernel_size, const nn::functional::ConvTranspose2dArgs& args,
                             const Tensor& bias) {
  const char* op = "conv_transpose2d_int8";
  const detail::ActQParams in = detail::act_qparams(x_scale, x_zero_point, x.device(), op);
  return detail::conv_transpose2d_codes(x, in, w, bias, kernel_size, args, nullptr, nullptr, nullptr, op);
}

}  // namespace strata::quant
