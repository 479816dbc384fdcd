// Post-training weight quantization of Linear layers, as torch.ao.quantization.quantize_dynamic:
// int8 weights (per output channel, symmetric) with activations quantized to uint8 per row at run
// time and a uint8 x int8 -> int32 GEMM, or int4 weight-only (group-wise along in_features,
// two codes a byte) with a GEMM that dequantizes on the fly; the recurrent layers and cells (int8
// weights with each step's activations quantized, or float16 weights); embedding tables row-wise
// (8 or 4 bits, qembedding.hpp) when asked. See docs/quantization.md.
//
//   quant::quantize_dynamic(model);                                       // every nn::Linear, int8
//   quant::quantize_dynamic(model, {.dtype = quant::WeightDtype::Int4, .group_size = 64});
//
// The layers keep their place and names (Note [Linear forms] in nn/linear.hpp); their float
// weights are dropped and the state dict holds "<layer>.quantized.weight_int8" and
// "<layer>.quantized.weight_scale" (int4: weight_int4, weight_scale, and weight_zero_point when
// asymmetric). Quantized layers compute without autograd (inference).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <strata/nn/linear.hpp>

namespace strata::quant {

/// Linear weights: int8 (activations quantized per row at run time), int4 weight-only, or float16
/// weight-only (float16_dynamic_qconfig: the weight stored in float16, the product in float32).
enum class WeightDtype { Int8, Int4, Float16 };
/// Embedding tables: left float (PyTorch's default qconfig_spec), or quantized per row with float
/// scale and bias to uint8 or to 4 bits (quint4x2) (qembedding.hpp).
enum class EmbeddingDtype { None, UInt8, UInt4 };
/// Recurrent layers (nn::LSTM, GRU, RNN, LSTMCell, GRUCell, RNNCell): left float, int8 weights
/// per output channel with each step's activations quantized at run time, or float16 weights
/// (PyTorch's float16_dynamic_qconfig) (qrecurrent.cpp, Note [Recurrent forms] in nn/recurrent.hpp).
enum class RecurrentDtype { None, Int8, Float16 };

struct QuantizeOptions {
  WeightDtype dtype = WeightDtype::Int8;
  int64_t group_size = 128;  // int4: 32, 64 or 128 elements of a row share a scale
  bool symmetric = true;     // int4: codes in [-8, 7] (no zero points) or [0, 15] with zero points
  /// Which layers to convert, by dotted name; null converts every nn::Linear.
  std::function<bool(const std::string& name, const nn::Linear& layer)> filter;
  /// nn::Embedding and nn::EmbeddingBag layers (weight only; to quantize only them, give a filter
  /// that refuses every Linear).
  EmbeddingDtype embeddings = EmbeddingDtype::None;
  /// Which embedding layers, by dotted name; null converts every one.
  std::function<bool(const std::string& name, const nn::Module& layer)> embedding_filter;
  /// The recurrent layers and cells: int8 by default, as PyTorch's default qconfig_spec (which
  /// takes LSTM, GRU and the cells; RNN too here). Inference only.
  RecurrentDtype recurrent = RecurrentDtype::Int8;
  /// Which recurrent layers, by dotted name; null converts every one.
  std::function<bool(const std::string& name, const nn::Module& layer)> recurrent_filter;
};

/// Converts the Linear and recurrent layers of `model` (and its embeddings, when
/// options.embeddings says so) in place and returns how many it converted. Raises (before
/// converting any) on a layer that is quantized already, or whose in_features the group size does
/// not divide.
STRATA_API int64_t quantize_dynamic(nn::Module& model, const QuantizeOptions& options = {});

// ---- functional forms --------------------------------------------------------------------------

/// int32 (M, N) = a (M, K) int8 . b (K, N) int8, exact (torch._int_mm); K <= 2^17.
STRATA_API Tensor int8_mm(const Tensor& a, const Tensor& b);

/// A Linear weight quantized per output channel, symmetric int8 (scale = max|w| / 127.5).
struct Int8Weight {
  Tensor codes;  // (out, in) int8
  Tensor scale;  // (out) float32
};
STRATA_API Int8Weight quantize_weight_int8(const Tensor& weight);

/// y = x . dequantize(w)^T + bias with x quantized to uint8 per row (affine, its own range), the
/// product in int32 and dequantization and bias in the epilogue. Float output of x's dtype.
STRATA_API Tensor linear_int8_dynamic(const Tensor& x, const Int8Weight& w, const Tensor& bias = {});

/// A Linear weight in int4, group-wise along in_features.
struct Int4Weight {
  Tensor packed;      // (out, in / 2) uint8: element 2j in the low nibble of byte j
  Tensor scale;       // (out, in / group_size) float32
  Tensor zero_point;  // (out, in / group_size) uint8 codes of 0, or undefined: symmetric (8)
  int64_t group_size = 0;
};
STRATA_API Int4Weight quantize_weight_int4(const Tensor& weight, int64_t group_size, bool symmetric = true);
/// The float32 weight the codes stand for.
STRATA_API Tensor dequantize_weight_int4(const Int4Weight& w);
/// y = x . dequantize(w)^T + bias; x float32 or bfloat16 (y likewise). On the CPU, up to 32 rows
/// of x decode the codes in registers (see set_int4_direct_kernel); more rows, dequantized tiles
/// of the weight feed the float GEMM.
STRATA_API Tensor linear_int4(const Tensor& x, const Int4Weight& w, const Tensor& bias = {});

/// Whether the int4 Linear on the CPU decodes the codes in registers for up to 32 rows of
/// activations (on by default), or always dequantizes tiles for the float GEMM. Both give
/// dequantize-then-matmul's result up to the order of float32 sums; process-wide.
STRATA_API void set_int4_direct_kernel(bool enabled);
STRATA_API bool int4_direct_kernel_enabled();

}  // namespace strata::quant
