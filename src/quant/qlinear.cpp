// Quantized Linear products: int8_mm, the int8 and int4 weight forms and their functional
// forms (include/strata/quant/quantize.hpp, src/quant/forms.h).
#include <atomic>
#include <cmath>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>
#include <strata/quant/qtensor.hpp>
#include <strata/quant/quantize.hpp>
#include <strata/quant/quantize_static.hpp>

#include "kernels/cpu/qgemm.h"
#include "quant/dispatch.h"
#include "quant/forms.h"

namespace strata::quant {

namespace detail {

Tensor bias_of(const Tensor& bias, int64_t N, const Device& device, DType dtype, const char* op) {
  if (!bias.defined()) return bias;
  STRATA_CHECK(bias.shape() == Shape{N} && bias.device() == device && is_floating(bias.dtype()),
               "[{}] expects a floating bias of shape ({}) on {}, got {} {} on {}", op, N, device, bias.dtype(),
               bias.shape(), bias.device());
  return bias.detach().to(dtype).contiguous();
}

void check_int8_weight(const Int8Weight& w, const char* op) {
  STRATA_CHECK(w.codes.defined() && w.codes.dtype() == kInt8 && w.codes.dim() == 2 && w.scale.defined() &&
                   w.scale.shape() == Shape{w.codes.size(0)},
               "[{}] expects int8 codes (out, in) and float32 scales (out)", op);
  STRATA_CHECK(w.scale.device() == w.codes.device(), "[{}] the codes are on {} and the scales on {}", op,
               w.codes.device(), w.scale.device());
  STRATA_CHECK(w.codes.size(1) <= cpu::quant::kMaxUint8K, "[{}] in_features {} exceeds {}, past which int32 sums "
               "could overflow", op, w.codes.size(1), cpu::quant::kMaxUint8K);
}

Tensor int8_product(const Tensor& xq, const Tensor& x_scale, const Tensor& x_zero, bool per_row, const Int8Weight& w,
                    const Tensor& w_row_sum, const Tensor& bias) {
  Tensor y = empty({xq.size(0), w.codes.size(0)}, TensorOptions(kFloat32, xq.device()));
  run_int8_linear(xq, x_scale, x_zero, per_row, w.codes.contiguous(), w.scale.to(kFloat32).contiguous(), w_row_sum,
                  bias, y);
  return y;
}

Tensor quantize_static_input(const Tensor& x, const ActQParams& in, Tensor* zero) {
  // a signed range runs shifted by +128 into uint8: (q - z) is the same for q + 128 and z + 128
  const int32_t shift = in.range.quant_min < 0 ? -128 : 0;
  *zero = (in.zero_point - shift).to(kInt32).contiguous();
  Tensor q = empty(x.shape(), TensorOptions(kUInt8, x.device()));
  run_quantize(x, q, layout_of(x.shape(), -1), in.scale.to(kFloat32).contiguous(), *zero, in.range.quant_min - shift,
               in.range.quant_max - shift);
  return q;
}

Tensor finish_static(const Tensor& y, const StaticActivations& act) {
  const Tensor r = act.relu ? nn::functional::relu(y) : y;
  if (!act.output) return r;
  const ActQParams& o = *act.output;
  Tensor out = empty(r.shape(), r.options());  // no gradient: no straight-through mask
  run_fake_quantize(r.contiguous(), out, Tensor(), layout_of(r.shape(), -1), o.scale.to(kFloat32).contiguous(),
                    o.zero_point.to(kInt32).contiguous(), o.range.quant_min, o.range.quant_max);
  return out;
}

void register_static(nn::Module& form, StaticActivations& act) {
  act.input.scale = form.register_buffer("input_scale", act.input.scale.reshape({1}).to(kFloat32));
  act.input.zero_point = form.register_buffer("input_zero_point", act.input.zero_point.reshape({1}).to(kInt32));
  if (!act.output) return;
  act.output->scale = form.register_buffer("output_scale", act.output->scale.reshape({1}).to(kFloat32));
  act.output->zero_point = form.register_buffer("output_zero_point", act.output->zero_point.reshape({1}).to(kInt32));
}

ActQParams act_qparams(double scale, int64_t zero_point, const Device& device, const char* op) {
  STRATA_CHECK(std::isfinite(static_cast<float>(scale)) && static_cast<float>(scale) > 0,
               "[{}] the input scale must be positive and finite in float32, got {}", op, scale);
  STRATA_CHECK(zero_point >= 0 && zero_point <= 255, "[{}] the input zero point {} is outside the uint8 codes [0, 255]",
               op, zero_point);
  const TensorOptions o(kFloat32, device);
  return {full({1}, scale, o), full({1}, zero_point, o.dtype(kInt32)), QRange{0, 255}};
}

Tensor row_sums(const Tensor& codes) {
  NoGradGuard no_grad;
  return sum(codes.to(kInt32), {1}).to(kInt32).contiguous();
}

Tensor CodesCache::of(const Tensor& codes, const std::function<Tensor(const Tensor&)>& derive) {
  std::lock_guard<std::mutex> lock(mutex_);
  // the version alone misses new memory (set_data keeps no count across storages)
  if (storage_.lock() != codes.storage() || version_ != codes.version()) {
    value_ = derive(codes);
    storage_ = codes.storage();
    version_ = codes.version();
  }
  return value_;
}

}  // namespace detail

namespace {

using detail::bias_of;
using detail::check_int8_weight;
using detail::int8_dynamic;
using detail::int8_product;
using detail::row_sums;

void check_weight_2d(const Tensor& w, const char* op) {
  STRATA_CHECK(w.defined(), "[{}] the weight is undefined", op);
  STRATA_CHECK(is_floating(w.dtype()), "[{}] expects a floating weight, got {}", op, w.dtype());
  STRATA_CHECK(w.dim() == 2, "[{}] expects a weight of shape (out_features, in_features), got {}", op, w.shape());
}

// x (*, K) as a contiguous (M, K) matrix of `dtype`, checked against the weight's K and device
Tensor input_rows(const Tensor& x, int64_t K, const Device& device, DType dtype, const char* op) {
  STRATA_CHECK(x.defined(), "[{}] the input is undefined", op);
  STRATA_CHECK(is_floating(x.dtype()), "[{}] expects a floating input, got {}", op, x.dtype());
  STRATA_CHECK(x.dim() >= 1 && x.size(-1) == K, "[{}] expects an input of shape (*, {}), got {}", op, K, x.shape());
  STRATA_CHECK(x.device() == device, "[{}] the input is on {} and the weight on {}", op, x.device(), device);
  int64_t rows = 1;  // the leading dims' product, not -1: that is ambiguous where K is 0
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return x.detach().reshape({rows, K}).to(dtype).contiguous();
}

Shape out_shape(const Tensor& x, int64_t N) {
  Shape s = x.shape();
  s.back() = N;
  return s;
}

void check_int4_weight(const Int4Weight& w, const char* op) {
  STRATA_CHECK(w.packed.defined() && w.packed.dtype() == kUInt8 && w.packed.dim() == 2 && w.group_size > 0 &&
                   w.group_size % 2 == 0 && (2 * w.packed.size(1)) % w.group_size == 0,
               "[{}] expects packed uint8 codes (out, in / 2) and an even group size dividing in, got group size {}",
               op, w.group_size);
  const Shape groups{w.packed.size(0), 2 * w.packed.size(1) / w.group_size};
  STRATA_CHECK(w.scale.defined() && w.scale.shape() == groups &&
                   (!w.zero_point.defined() || (w.zero_point.shape() == groups && w.zero_point.dtype() == kUInt8)),
               "[{}] expects scales (and uint8 zero points) of shape {}", op, groups);
  STRATA_CHECK(w.scale.device() == w.packed.device() &&
                   (!w.zero_point.defined() || w.zero_point.device() == w.packed.device()),
               "[{}] the codes, scales and zero points must be on one device", op);
}

}  // namespace

Tensor int8_mm(const Tensor& a, const Tensor& b) {
  STRATA_CHECK(a.defined() && b.defined() && a.dtype() == kInt8 && b.dtype() == kInt8,
               "[int8_mm] expects two int8 tensors");
  STRATA_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "[int8_mm] expects (M, K) and (K, N), got {} "
               "and {}", a.shape(), b.shape());
  STRATA_CHECK(a.device() == b.device(), "[int8_mm] operands on {} and {}", a.device(), b.device());
  STRATA_CHECK(a.size(1) <= cpu::quant::kMaxInt8K, "[int8_mm] K = {} exceeds {}, past which int32 sums could "
               "overflow", a.size(1), cpu::quant::kMaxInt8K);
  Tensor c = empty({a.size(0), b.size(1)}, TensorOptions(kInt32, a.device()));
  detail::run_int8_gemm(a.contiguous(), b.t().contiguous(), c);
  return c;
}

Int8Weight quantize_weight_int8(const Tensor& weight) {
  check_weight_2d(weight, "quantize_weight_int8");
  auto [lo, hi] = finite_aminmax(weight, 0);
  auto [scale, zero] = calculate_qparams(lo, hi, quant_range(kInt8), true);
  QuantizedTensor q = quantize_per_channel(weight, scale, zero, 0, kInt8);
  return {q.int_repr, q.scales};
}

Tensor linear_int8_dynamic(const Tensor& x, const Int8Weight& w, const Tensor& bias) {
  check_int8_weight(w, "linear_int8_dynamic");
  return int8_dynamic(x, w, row_sums(w.codes), bias, "linear_int8_dynamic");
}

Tensor linear_int8_static(const Tensor& x, double x_scale, int64_t x_zero_point, const Int8Weight& w,
                          const Tensor& bias) {
  const char* op = "linear_int8_static";
  check_int8_weight(w, op);
  const detail::ActQParams in = detail::act_qparams(x_scale, x_zero_point, w.codes.device(), op);
  NoGradGuard no_grad;
  const Tensor y = detail::int8_static_product(x, in, w, row_sums(w.codes), bias, op);
  return y.reshape(out_shape(x, w.codes.size(0))).to(x.dtype());
}

Int4Weight quantize_weight_int4(const Tensor& weight, int64_t group_size, bool symmetric) {
  const char* op = "quantize_weight_int4";
  check_weight_2d(weight, op);
  STRATA_CHECK(group_size == 32 || group_size == 64 || group_size == 128, "[{}] group_size must be 32, 64 or 128, "
               "got {}", op, group_size);
  const int64_t N = weight.size(0), K = weight.size(1);
  STRATA_CHECK(K % group_size == 0, "[{}] group_size {} does not divide in_features {}", op, group_size, K);
  NoGradGuard no_grad;
  const TensorOptions o(kFloat32, weight.device());
  Int4Weight w{empty({N, K / 2}, o.dtype(kUInt8)), empty({N, K / group_size}, o), Tensor(), group_size};
  if (!symmetric) w.zero_point = empty({N, K / group_size}, o.dtype(kUInt8));
  detail::run_quantize_int4(weight.detach().to(kFloat32).contiguous(), group_size, symmetric, w.packed, w.scale,
                            w.zero_point);
  return w;
}

Tensor dequantize_weight_int4(const Int4Weight& w) {
  check_int4_weight(w, "dequantize_weight_int4");
  Tensor out = empty({w.packed.size(0), 2 * w.packed.size(1)}, TensorOptions(kFloat32, w.packed.device()));
  detail::run_dequantize_int4(w.packed.contiguous(), w.scale.to(kFloat32).contiguous(),
                              w.zero_point.defined() ? w.zero_point.contiguous() : Tensor(), w.group_size, out);
  return out;
}

namespace {
std::atomic<bool> g_int4_direct{true};
}  // namespace

void set_int4_direct_kernel(bool enabled) { g_int4_direct.store(enabled); }
bool int4_direct_kernel_enabled() { return g_int4_direct.load(); }

Tensor linear_int4(const Tensor& x, const Int4Weight& w, const Tensor& bias) {
  const char* op = "linear_int4";
  check_int4_weight(w, op);
  const int64_t N = w.packed.size(0), K = 2 * w.packed.size(1);
  NoGradGuard no_grad;
  const DType dt = x.defined() && x.dtype() == kBFloat16 ? kBFloat16 : kFloat32;  // the kernel's two types
  const Tensor rows = input_rows(x, K, w.packed.device(), dt, op);
  Tensor y = empty({rows.size(0), N}, TensorOptions(dt, x.device()));
  detail::run_int4_linear(rows, w.packed.contiguous(), w.scale.to(kFloat32).contiguous(),
                          w.zero_point.defined() ? w.zero_point.contiguous() : Tensor(), w.group_size,
                          bias_of(bias, N, x.device(), dt, op), y);
  return y.reshape(out_shape(x, N)).to(x.dtype());
}

// ---- the forms ---------------------------------------------------------------------------------

namespace detail {

Tensor int8_dynamic(const Tensor& x, const Int8Weight& w, const Tensor& row_sum, const Tensor& bias, const char* op) {
  check_int8_weight(w, op);
  const int64_t N = w.codes.size(0), K = w.codes.size(1);
  NoGradGuard no_grad;
  const Tensor rows = input_rows(x, K, w.codes.device(), kFloat32, op);
  const TensorOptions o(kFloat32, x.device());
  Tensor xq = empty(rows.shape(), o.dtype(kUInt8));
  Tensor xs = empty({rows.size(0)}, o), xz = empty({rows.size(0)}, o.dtype(kInt32));
  detail::run_quantize_rows_uint8(rows, xq, xs, xz);
  Tensor y = int8_product(xq, xs, xz, true, w, row_sum, bias_of(bias, N, x.device(), kFloat32, op));
  return y.reshape(out_shape(x, N)).to(x.dtype());
}

Int8LinearForm::Int8LinearForm(Int8Weight weight, std::optional<StaticActivations> act)
    : weight_(std::move(weight)), act_(std::move(act)) {
  weight_.codes = register_buffer("weight_int8", weight_.codes);
  weight_.scale = register_buffer("weight_scale", weight_.scale);
  if (act_) register_static(*this, *act_);
}

Tensor Int8LinearForm::forward_layer(const nn::Linear& layer, const Tensor& input) {
  const char* op = "Linear(int8)";
  const Tensor row_sum = row_sums_.of(weight_.codes, row_sums);
  if (!act_) return int8_dynamic(input, weight_, row_sum, layer.bias, op);
  check_int8_weight(weight_, op);
  NoGradGuard no_grad;
  const Tensor y = int8_static_product(input, act_->input, weight_, row_sum, layer.bias, op);
  return finish_static(y, *act_).reshape(out_shape(input, weight_.codes.size(0))).to(input.dtype());
}

Tensor int8_static_product(const Tensor& x, const ActQParams& in, const Int8Weight& w, const Tensor& w_row_sum,
                           const Tensor& bias, const char* op) {
  const int64_t N = w.codes.size(0), K = w.codes.size(1);
  Tensor zero;
  const Tensor xq = quantize_static_input(input_rows(x, K, w.codes.device(), kFloat32, op), in, &zero);
  return int8_product(xq, in.scale.to(kFloat32).contiguous(), zero, false, w, w_row_sum,
                      bias_of(bias, N, x.device(), kFloat32, op));
}

Int4LinearForm::Int4LinearForm(Int4Weight weight) : weight_(std::move(weight)) {
  weight_.packed = register_buffer("weight_int4", weight_.packed);
  weight_.scale = register_buffer("weight_scale", weight_.scale);
  if (weight_.zero_point.defined()) weight_.zero_point = register_buffer("weight_zero_point", weight_.zero_point);
}

Tensor Int4LinearForm::forward_layer(const nn::Linear& layer, const Tensor& input) {
  return linear_int4(input, weight_, layer.bias);
}

Tensor to_float16_weight(const Tensor& w) {
  NoGradGuard no_grad;
  constexpr double kMaxHalf = 65504.0;  // saturated, as fbgemm's fp16 packing (not inf)
  // clamped in float32 at least: bfloat16 has no 65504 and would round the bound up to 65536 (inf)
  const Tensor wf = w.dtype() == kFloat64 ? w.detach() : w.detach().to(kFloat32);
  return clamp(wf, -kMaxHalf, kMaxHalf).to(kFloat16).contiguous();
}

Tensor float16_product(const Tensor& x, const Tensor& w16, const Tensor& bias) {
  NoGradGuard no_grad;
  const DType dt = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  const Tensor b = bias.defined() ? bias.detach().to(dt) : bias;
  return nn::functional::linear(x.detach().to(dt), w16.to(dt), b).to(x.dtype());
}

Float16LinearForm::Float16LinearForm(const Tensor& weight) {
  weight_ = register_buffer("weight_fp16", to_float16_weight(weight));
}

Tensor Float16LinearForm::forward_layer(const nn::Linear& layer, const Tensor& input) {
  return float16_product(input, weight_, layer.bias);
}

}  // namespace detail

}  // namespace strata::quant
