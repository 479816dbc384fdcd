// Row-wise weight-only quantization of embedding tables, as PyTorch's quantized Embedding and
// EmbeddingBag (torch.ao.nn.quantized, float_qparams_weight_only_qconfig, and quint4x2 for 4
// bits): each row keeps uint8 codes (or two 4-bit codes a byte) with its own float32 scale and
// bias, x' = scale * q + bias, the range being the row's [min, max] (kernels/common/
// quant_rowwise.h). quantize_dynamic converts nn::Embedding and nn::EmbeddingBag layers with
// QuantizeOptions::embeddings; these are the functional forms.
//
//   quant::RowwiseWeight w = quant::quantize_embedding_weight(table, 4);   // (num, dim) float
//   Tensor y = quant::embedding_bag_rowwise(ids, w, {.offsets = offsets, .mode = EmbeddingBagMode::Sum});
#pragma once

#include <cstdint>

#include <strata/nn/functional.hpp>

namespace strata::quant {

/// An embedding table quantized per row.
struct RowwiseWeight {
  Tensor codes;  // (num, dim) uint8 for 8 bits; (num, (dim + 1) / 2) for 4 bits, element 2j in byte j's low nibble
  Tensor scale;  // (num) float32
  Tensor bias;   // (num) float32: the value of code 0
  int bits = 8;
  int64_t dim = 0;
};

/// weight (num, dim) floating -> its rows quantized to `bits` (8 or 4) with float qparams.
STRATA_API RowwiseWeight quantize_embedding_weight(const Tensor& weight, int bits = 8);
/// The float32 (num, dim) table the codes stand for.
STRATA_API Tensor dequantize_embedding_weight(const RowwiseWeight& w);
/// indices (*) int64/int32 -> (*, dim) float32 rows of the dequantized table; indices checked.
STRATA_API Tensor embedding_rowwise(const Tensor& indices, const RowwiseWeight& w);
/// embedding_bag (nn::functional) of the dequantized table: Sum, Mean or Max of each bag, with
/// offsets, include_last_offset, padding_idx and per_sample_weights (Sum) as the float op. The
/// bags are reduced in float64 and rounded once to float32. -> (B, dim) float32
STRATA_API Tensor embedding_bag_rowwise(const Tensor& indices, const RowwiseWeight& w,
                                        const nn::functional::EmbeddingBagArgs& args = {});

}  // namespace strata::quant
