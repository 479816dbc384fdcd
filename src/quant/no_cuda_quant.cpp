// The CUDA quantization kernels of a build without CUDA: no CUDA tensor can exist there, so these
// are never reached through dispatch.cpp; called directly they raise an Error naming the build
// option.
#include <strata/core/error.hpp>

#include "quant/cuda_quant.h"

namespace strata::quant::cuda_quant {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  strata::detail::throw_error("[{}] CUDA tensors need strata built with CUDA (reconfigure with -DSTRATA_WITH_CUDA=ON)",
                              op);
}
}  // namespace

void quantize(const Tensor&, const Tensor&, ChannelLayout, const Tensor&, const Tensor&, int32_t, int32_t) {
  no_cuda("quantize");
}
void dequantize(const Tensor&, const Tensor&, ChannelLayout, const Tensor&, const Tensor&) { no_cuda("dequantize"); }
void fake_quantize(const Tensor&, const Tensor&, const Tensor&, ChannelLayout, const Tensor&, const Tensor&, int32_t,
                   int32_t) {
  no_cuda("fake_quantize");
}
void quantize_rows_uint8(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda("quantize_dynamic"); }
void int8_linear(const Tensor&, const Tensor&, const Tensor&, bool, const Tensor&, const Tensor&, const Tensor&,
                 const Tensor&, const Tensor&) {
  no_cuda("int8_linear");
}
void int8_gemm(const Tensor&, const Tensor&, const Tensor&) { no_cuda("int8_mm"); }
void quantize_int4(const Tensor&, int64_t, bool, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("quantize_int4");
}
void dequantize_int4(const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&) {
  no_cuda("dequantize_int4");
}
void int4_linear(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&) {
  no_cuda("int4_linear");
}

void im2col_u8(const Tensor&, const qmath::Im2colShape&, uint8_t, const Tensor&) { no_cuda("conv2d_int8"); }

void quantize_rowwise(const Tensor&, int, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("quantize_embedding_weight");
}
void embedding_bag_rowwise(const qmath::RowwiseTable&, const qmath::Bags&, const Tensor&) {
  no_cuda("embedding_bag_rowwise");
}

}  // namespace strata::quant::cuda_quant
