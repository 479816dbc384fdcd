// CUDA launchers of the quantization kernels (declared in cuda_quant.h): tensors, checked and
// made contiguous by the callers, become pointers for kernels/cuda/quant_ops.h, launched on the
// current stream of their device; a failed launch raises naming the op.
#include "quant/cuda_quant.h"

#include <strata/core/cuda.hpp>

#include "kernels/cuda/quant_ops.h"
#include "ops/cuda/launch.h"

namespace strata::quant::cuda_quant {

namespace {

namespace ck = cuda_kernels::quant;

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data()) : nullptr;
}

// runs f(stream) on t's device and raises on its error
template <class F>
void launch(const Tensor& t, const char* op, F&& f) {
  cuda::DeviceGuard guard(t.device().index);
  cuda_launch::check_launch(f(cuda_launch::stream_for(t)), op);
}

}  // namespace

void quantize(const Tensor& x, const Tensor& q, ChannelLayout l, const Tensor& scale, const Tensor& zero_point,
              int32_t qmin, int32_t qmax) {
  launch(x, "quantize", [&](cudaStream_t s) {
    if (q.dtype() == kInt8)
      return ck::quantize_affine(ptr<float>(x), ptr<int8_t>(q), l, ptr<float>(scale), ptr<int32_t>(zero_point), qmin,
                                 qmax, s);
    return ck::quantize_affine(ptr<float>(x), ptr<uint8_t>(q), l, ptr<float>(scale), ptr<int32_t>(zero_point), qmin,
                               qmax, s);
  });
}

void dequantize(const Tensor& q, const Tensor& out, ChannelLayout l, const Tensor& scale, const Tensor& zero_point) {
  launch(q, "dequantize", [&](cudaStream_t s) {
    if (q.dtype() == kInt8)
      return ck::dequantize_affine(ptr<int8_t>(q), ptr<float>(out), l, ptr<float>(scale), ptr<int32_t>(zero_point), s);
    return ck::dequantize_affine(ptr<uint8_t>(q), ptr<float>(out), l, ptr<float>(scale), ptr<int32_t>(zero_point), s);
  });
}

void fake_quantize(const Tensor& x, const Tensor& out, const Tensor& mask, ChannelLayout l, const Tensor& scale,
                   const Tensor& zero_point, int32_t qmin, int32_t qmax) {
  launch(x, "fake_quantize", [&](cudaStream_t s) {
    return ck::fake_quantize(ptr<float>(x), ptr<float>(out), ptr<uint8_t>(mask), l, ptr<float>(scale),
                             ptr<int32_t>(zero_point), qmin, qmax, s);
  });
}

void quantize_rows_uint8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& zero_point) {
  launch(x, "quantize_dynamic", [&](cudaStream_t s) {
    return ck::quantize_rows_uint8(ptr<float>(x), x.size(0), x.size(1), ptr<uint8_t>(q), ptr<float>(scale),
                                  ptr<int32_t>(zero_point), s);
  });
}

void int8_linear(const Tensor& xq, const Tensor& x_scale, const Tensor& x_zero, bool x_per_row, const Tensor& wq,
                 const Tensor& w_scale, const Tensor& w_row_sum, const Tensor& bias, const Tensor& y) {
  launch(xq, "int8_linear", [&](cudaStream_t s) {
    return ck::int8_linear(ptr<uint8_t>(xq), ptr<float>(x_scale), ptr<int32_t>(x_zero), x_per_row, ptr<int8_t>(wq),
                           ptr<float>(w_scale), ptr<int32_t>(w_row_sum), ptr<float>(bias), ptr<float>(y),
                           xq.size(0), wq.size(0), xq.size(1), s);
  });
}

void int8_gemm(const Tensor& a, const Tensor& b, const Tensor& c) {
  launch(a, "int8_mm", [&](cudaStream_t s) {
    return ck::gemm_s8s8s32(ptr<int8_t>(a), ptr<int8_t>(b), ptr<int32_t>(c), a.size(0), b.size(0), a.size(1), s);
  });
}

void quantize_int4(const Tensor& w, int64_t group, bool symmetric, const Tensor& packed, const Tensor& scale,
                   const Tensor& zero_point) {
  launch(w, "quantize_weight_int4", [&](cudaStream_t s) {
    return ck::quantize_int4_groups(ptr<float>(w), w.size(0), w.size(1), group, symmetric, ptr<uint8_t>(packed),
                                    ptr<float>(scale), ptr<uint8_t>(zero_point), s);
  });
}

void dequantize_int4(const Tensor& packed, const Tensor& scale, const Tensor& zero_point, int64_t group,
                     const Tensor& w) {
  launch(w, "dequantize_weight_int4", [&](cudaStream_t s) {
    return ck::dequantize_int4(ptr<uint8_t>(packed), ptr<float>(scale), ptr<uint8_t>(zero_point), w.size(0),
                               w.size(1), group, ptr<float>(w), s);
  });
}

void int4_linear(const Tensor& x, const Tensor& packed, const Tensor& scale, const Tensor& zero_point, int64_t group,
                 const Tensor& bias, const Tensor& y) {
  launch(x, "linear_int4", [&](cudaStream_t s) {
    const int64_t M = x.size(0), N = packed.size(0), K = x.size(1);
    if (x.dtype() == kBFloat16)
      return ck::int4_linear(ptr<BFloat16>(x), ptr<uint8_t>(packed), ptr<float>(scale), ptr<uint8_t>(zero_point),
                             group, ptr<BFloat16>(bias), ptr<BFloat16>(y), M, N, K, s);
    return ck::int4_linear(ptr<float>(x), ptr<uint8_t>(packed), ptr<float>(scale), ptr<uint8_t>(zero_point), group,
                           ptr<float>(bias), ptr<float>(y), M, N, K, s);
  });
}

void im2col_u8(const Tensor& x, const qmath::Im2colShape& shape, uint8_t pad, const Tensor& cols) {
  launch(x, "im2col_u8", [&](cudaStream_t s) {
    return ck::im2col_u8(ptr<uint8_t>(x), x.size(0), shape, pad, ptr<uint8_t>(cols), s);
  });
}

void quantize_rowwise(const Tensor& w, int bits, const Tensor& codes, const Tensor& scale, const Tensor& bias) {
  launch(w, "quantize_embedding_weight", [&](cudaStream_t s) {
    return ck::quantize_rowwise(ptr<float>(w), w.size(0), w.size(1), bits, ptr<uint8_t>(codes), ptr<float>(scale),
                                ptr<float>(bias), s);
  });
}

void embedding_bag_rowwise(const qmath::RowwiseTable& t, const qmath::Bags& g, const Tensor& out) {
  launch(out, "embedding_bag_rowwise",
         [&](cudaStream_t s) { return ck::embedding_bag_rowwise(t, g, ptr<float>(out), s); });
}

}  // namespace strata::quant::cuda_quant
