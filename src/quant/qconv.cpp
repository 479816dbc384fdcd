// The int8 convolution of the input's uint8 codes, channels last: on the CPU oneDNN's int8
// convolution (int32 sums, then the int8 Linear's float epilogue), where it runs; elsewhere, and
// as its reference, the codes gathered by im2col (kernels/common/im2col.h) into the rows of the
// int8 Linear's GEMM (kernels/cpu/qgemm.h), one GEMM per group. Either gives a (pixels, channels)
// channels-last result; conv2d_int8 and the static forms of Conv2d and Conv1d (Int8ConvForm)
// (include/strata/quant/quantize_static.hpp, src/quant/forms.h).
#include <atomic>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>
#include <strata/quant/quantize_static.hpp>

#include "quant/dispatch.h"
#include "quant/forms.h"

namespace strata::quant {

namespace {

std::atomic<bool> g_onednn_conv{true};

}  // namespace

void set_onednn_int8_conv(bool enabled) { g_onednn_conv.store(enabled); }
bool onednn_int8_conv_enabled() { return g_onednn_conv.load(); }

namespace detail {

namespace {

// The reference: per group, im2col of the codes and the int8 Linear's GEMM; y (N * OH * OW, out).
Tensor im2col_product(const Tensor& codes, const Tensor& x_scale, const Tensor& x_zero, uint8_t pad,
                      const Int8Weight& w, const Tensor& w_row_sum, const Tensor& bias, qmath::Im2colShape shape,
                      int64_t groups, CodesCache* layout) {
  const int64_t out = w.codes.size(0), out_g = out / groups, rows = codes.size(0) * shape.OH * shape.OW;
  // the weight's rows as (kH, kW, C / groups), the order of the columns (contiguous: a group's rows
  // are then a contiguous slice)
  const auto lay_out = [&](const Tensor& c) {
    return c.reshape({out, shape.Cg, shape.kh, shape.kw}).permute({0, 2, 3, 1}).contiguous().reshape({out, -1});
  };
  const Tensor wcodes = layout ? layout->of(w.codes, lay_out) : lay_out(w.codes);
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < groups; ++g) {
    shape.c0 = g * shape.Cg;
    Tensor cols = empty({rows, shape.cols()}, TensorOptions(kUInt8, codes.device()));
    run_im2col_u8(codes, shape, pad, cols);
    const auto rows_of = [&](const Tensor& t) { return t.narrow(0, g * out_g, out_g).contiguous(); };
    const Int8Weight wg{rows_of(wcodes), groups == 1 ? w.scale : rows_of(w.scale)};
    const Tensor sums = groups == 1 ? w_row_sum : rows_of(w_row_sum);
    const Tensor b = !bias.defined() || groups == 1 ? bias : rows_of(bias);
    parts.push_back(int8_product(cols, x_scale, x_zero, false, wg, sums, b));  // (N * OH * OW, out_g)
  }
  return groups == 1 ? parts[0] : cat(parts, 1);
}

}  // namespace

Tensor conv2d_codes(const Tensor& codes, const Tensor& x_scale, const Tensor& x_zero, uint8_t pad, const Int8Weight& w,
                    const Tensor& w_row_sum, const Tensor& bias, nn::Size2 k, const nn::functional::Conv2dArgs& a,
                    const StaticActivations* act, CodesCache* layout) {
  const int64_t N = codes.size(0), H = codes.size(1), W = codes.size(2), C = codes.size(3);
  const int64_t G = a.groups, out = w.codes.size(0);
  const int64_t OH = (H + 2 * a.padding.h - a.dilation.h * (k.h - 1) - 1) / a.stride.h + 1;
  const int64_t OW = (W + 2 * a.padding.w - a.dilation.w * (k.w - 1) - 1) / a.stride.w + 1;
  STRATA_CHECK(OH > 0 && OW > 0, "[conv2d_int8] the input of {} x {} is smaller than the kernel {} (padding {}, "
               "dilation {})", H, W, k, a.padding, a.dilation);
  Tensor y;  // (N * OH * OW, out): channels last
  if (onednn_int8_conv_enabled() && codes.device().is_cpu()) {
    const cpu::ConvGeometry g{N, C, H, W, out, OH, OW, k.h, k.w, a.stride.h, a.stride.w, a.padding.h, a.padding.w,
                              a.dilation.h, a.dilation.w, G};
    Tensor t = empty({N * OH * OW, out}, TensorOptions(kFloat32, codes.device()));
    if (run_conv2d_int8_onednn(codes, x_scale, x_zero, w.codes.contiguous(), w.scale.to(kFloat32).contiguous(), bias,
                               g, t))
      y = t;
  }
  if (!y.defined()) {
    const qmath::Im2colShape shape{C, H, W, 0, C / G, k.h, k.w, a.stride.h, a.stride.w, a.padding.h, a.padding.w,
                                   a.dilation.h, a.dilation.w, OH, OW};
    y = im2col_product(codes, x_scale, x_zero, pad, w, w_row_sum, bias, shape, G, layout);
  }
  if (act) y = finish_static(y, *act);
  return y.reshape({N, OH, OW, out}).permute({0, 3, 1, 2});
}

namespace {

// The input checks of both entry points; x as (N, C, H, W).
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
  return x4;
}

}  // namespace

bool channels_last(const Tensor& x) {
  return x.dim() == 4 && !x.is_contiguous() && x.is_contiguous(MemoryFormat::ChannelsLast);
}

// x (N, C, H, W) -> uint8 codes (N, H, W, C) contiguous: a channels-last input is quantized as it
// lies, another quantized first and its codes (a quarter of the bytes) transposed.
Tensor nhwc_codes(const Tensor& x, const ActQParams& in, Tensor* zero) {
  const Tensor xf = x.detach().to(kFloat32);
  if (channels_last(xf)) return quantize_static_input(xf.permute({0, 2, 3, 1}), in, zero);
  return quantize_static_input(xf.contiguous(), in, zero).permute({0, 2, 3, 1}).contiguous();
}

// y (a channels-last view) in the memory format of the input, without its batch dim when it had none
Tensor like_input(const Tensor& y, const Tensor& x) {
  const Tensor laid = channels_last(x) ? y : y.contiguous();
  return x.dim() == 3 ? laid.squeeze(0) : laid;
}

void register_int8(nn::Module& form, Int8Weight& weight, StaticActivations& act) {
  weight.codes = form.register_buffer("weight_int8", weight.codes);
  weight.scale = form.register_buffer("weight_scale", weight.scale);
  register_static(form, act);
}

Tensor int8_conv2d_layer(const Tensor& x, const Int8Weight& w, const StaticActivations& act, const Tensor& bias,
                         const Conv2dGeometry& g, CodesCache& row_sums_cache, CodesCache& layout) {
  const char* op = g.one_d ? "Conv1d(int8)" : "Conv2d(int8)";
  NoGradGuard no_grad;
  Tensor zero;
  const Tensor codes = nhwc_codes(conv_input(x, w, g.kernel, g.args, op), act.input, &zero);
  const auto pad = static_cast<uint8_t>(zero.item<int64_t>());
  const Tensor b = bias_of(bias, w.codes.size(0), x.device(), kFloat32, op);
  const Tensor y = conv2d_codes(codes, act.input.scale.to(kFloat32).contiguous(), zero, pad, w,
                                row_sums_cache.of(w.codes, row_sums), b, g.kernel, g.args, &act, &layout);
  return like_input(y, x);
}

}  // namespace detail

Tensor conv2d_int8(const Tensor& x, double x_scale, int64_t x_zero_point, const Int8Weight& w, nn::Size2 kernel_size,
                   const nn::functional::Conv2dArgs& args, const Tensor& bias) {
  const char* op = "conv2d_int8";
  NoGradGuard no_grad;
  const Tensor x4 = detail::conv_input(x, w, kernel_size, args, op);
  const detail::ActQParams in = detail::act_qparams(x_scale, x_zero_point, x.device(), op);
  Tensor zero;
  const Tensor codes = detail::nhwc_codes(x4, in, &zero);
  const Tensor b = detail::bias_of(bias, w.codes.size(0), x.device(), kFloat32, op);
  const Tensor y = detail::conv2d_codes(codes, in.scale, zero, static_cast<uint8_t>(x_zero_point), w,
                                        detail::row_sums(w.codes), b, kernel_size, args, nullptr);
  return detail::like_input(y, x);
}

}  // namespace strata::quant
