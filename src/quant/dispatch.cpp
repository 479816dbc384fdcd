// Device routing of the quantization kernels (see dispatch.h): CPU loops here, CUDA launchers in
// cuda_quant.cpp (or the stubs of no_cuda_quant.cpp, which raise naming the build option).
#include "quant/dispatch.h"

#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>

#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/quant.h"
#include "quant/cuda_quant.h"

namespace strata::quant::detail {

namespace cq = cpu::quant;

namespace {

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data()) : nullptr;
}

}  // namespace

ChannelLayout layout_of(const Shape& shape, int64_t axis) {
  ChannelLayout l{1, 1, 1};
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t ax = static_cast<int64_t>(d);
    if (axis < 0 || ax > axis) {
      l.inner *= shape[d];
    } else if (ax < axis) {
      l.outer *= shape[d];
    } else {
      l.channels = shape[d];
    }
  }
  return l;
}

void run_quantize(const Tensor& x, const Tensor& q, ChannelLayout l, const Tensor& scale, const Tensor& zero_point,
                  int32_t qmin, int32_t qmax) {
  if (x.device().is_cuda()) return cuda_quant::quantize(x, q, l, scale, zero_point, qmin, qmax);
  if (q.dtype() == kInt8) {
    cq::quantize_affine(ptr<float>(x), ptr<int8_t>(q), l, ptr<float>(scale), ptr<int32_t>(zero_point), qmin, qmax);
  } else {
    cq::quantize_affine(ptr<float>(x), ptr<uint8_t>(q), l, ptr<float>(scale), ptr<int32_t>(zero_point), qmin, qmax);
  }
}

void run_dequantize(const Tensor& q, const Tensor& out, ChannelLayout l, const Tensor& scale,
                    const Tensor& zero_point) {
  if (q.device().is_cuda()) return cuda_quant::dequantize(q, out, l, scale, zero_point);
  if (q.dtype() == kInt8) {
    cq::dequantize_affine(ptr<int8_t>(q), ptr<float>(out), l, ptr<float>(scale), ptr<int32_t>(zero_point));
  } else {
    cq::dequantize_affine(ptr<uint8_t>(q), ptr<float>(out), l, ptr<float>(scale), ptr<int32_t>(zero_point));
  }
}

void run_fake_quantize(const Tensor& x, const Tensor& out, const Tensor& mask, ChannelLayout l, const Tensor& scale,
                       const Tensor& zero_point, int32_t qmin, int32_t qmax) {
  if (x.device().is_cuda()) return cuda_quant::fake_quantize(x, out, mask, l, scale, zero_point, qmin, qmax);
  cq::fake_quantize(ptr<float>(x), ptr<float>(out), ptr<uint8_t>(mask), l, ptr<float>(scale),
                    ptr<int32_t>(zero_point), qmin, qmax);
}

void run_quantize_rows_uint8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& zero_point) {
  if (x.device().is_cuda()) return cuda_quant::quantize_rows_uint8(x, q, scale, zero_point);
  cq::quantize_rows_uint8(ptr<float>(x), x.size(0), x.size(1), ptr<uint8_t>(q), ptr<float>(scale),
                         ptr<int32_t>(zero_point));
}

void run_int8_linear(const Tensor& xq, const Tensor& x_scale, const Tensor& x_zero, bool x_per_row, const Tensor& wq,
                     const Tensor& w_scale, const Tensor& w_row_sum, const Tensor& bias, const Tensor& y) {
  if (xq.device().is_cuda())
    return cuda_quant::int8_linear(xq, x_scale, x_zero, x_per_row, wq, w_scale, w_row_sum, bias, y);
  cq::int8_linear(ptr<uint8_t>(xq), ptr<float>(x_scale), ptr<int32_t>(x_zero), x_per_row, ptr<int8_t>(wq),
                  ptr<float>(w_scale), ptr<int32_t>(w_row_sum), ptr<float>(bias), ptr<float>(y), xq.size(0),
                  wq.size(0), xq.size(1));
}

void run_int8_gemm(const Tensor& a, const Tensor& b, const Tensor& c) {
  if (a.device().is_cuda()) return cuda_quant::int8_gemm(a, b, c);
  int32_t* out = ptr<int32_t>(c);
  const int64_t N = b.size(0);
  cq::gemm_8bit(ptr<int8_t>(a), ptr<int8_t>(b), a.size(0), N, a.size(1),
                   [&](int64_t m, int64_t n, int32_t sum) { out[m * N + n] = sum; });
}

void run_quantize_int4(const Tensor& w, int64_t group, bool symmetric, const Tensor& packed, const Tensor& scale,
                       const Tensor& zero_point) {
  if (w.device().is_cuda()) return cuda_quant::quantize_int4(w, group, symmetric, packed, scale, zero_point);
  cq::quantize_int4_groups(ptr<float>(w), w.size(0), w.size(1), group, symmetric, ptr<uint8_t>(packed),
                           ptr<float>(scale), ptr<uint8_t>(zero_point));
}

void run_dequantize_int4(const Tensor& packed, const Tensor& scale, const Tensor& zero_point, int64_t group,
                         const Tensor& w) {
  if (w.device().is_cuda()) return cuda_quant::dequantize_int4(packed, scale, zero_point, group, w);
  const int64_t N = w.size(0), K = w.size(1);
  for (int64_t n = 0; n < N; ++n)
    cq::dequantize_int4_row(ptr<uint8_t>(packed), ptr<float>(scale), ptr<uint8_t>(zero_point), n, K, group,
                            ptr<float>(w) + n * K);
}

void run_int4_linear(const Tensor& x, const Tensor& packed, const Tensor& scale, const Tensor& zero_point,
                     int64_t group, const Tensor& bias, const Tensor& y) {
  if (x.device().is_cuda()) return cuda_quant::int4_linear(x, packed, scale, zero_point, group, bias, y);
  // float activations for the float GEMM (kernels/cpu/qgemm.h); bfloat16 ones are converted
  const int64_t M = x.size(0), N = packed.size(0), K = x.size(1);
  const Tensor xf = x.to(kFloat32).contiguous(), bf = bias.defined() ? bias.to(kFloat32).contiguous() : bias;
  const Tensor yf = y.dtype() == kFloat32 ? y : empty(y.shape(), kFloat32);
  cq::int4_linear(ptr<float>(xf), ptr<uint8_t>(packed), ptr<float>(scale), ptr<uint8_t>(zero_point), group,
                  ptr<float>(bf), ptr<float>(yf), M, N, K);
  if (!yf.is_same(y)) y.copy_(yf);
}

}  // namespace strata::quant::detail
