// The fake quantization forward shared by fake_quantize.cpp and learnable_fake_quantize.cpp.
#pragma once

#include <cstdint>
#include <utility>

#include <strata/core/tensor.hpp>

namespace strata::quant::detail {

/// x fake-quantized with float32 `scale` and int32 `zero_point` (one, or one per index of `axis`;
/// checked by the caller), in x's dtype, and the uint8 straight-through mask; not recorded.
std::pair<Tensor, Tensor> fake_quantize_values(const Tensor& x, const Tensor& scale, const Tensor& zero_point,
                                               int64_t axis, int64_t quant_min, int64_t quant_max);
/// Raises unless x is a defined floating tensor and quant_min < quant_max lie within +-2^24.
void check_fake_quantize_input(const char* op, const Tensor& x, int64_t quant_min, int64_t quant_max);

}  // namespace strata::quant::detail
