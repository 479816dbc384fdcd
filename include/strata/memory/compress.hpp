// Activation compression: while a CompressActivations guard lives on a thread, the tensors
// autograd saves for backward are kept compressed (bfloat16, float16 or 8-bit blocks with a
// float32 scale each) and decompressed when the backward reads them. The forward computes
// exactly what it would without the guard; only the backward's inputs are approximated.
//
//   {
//     memory::CompressActivations guard({.mode = memory::CompressionMode::Int8});
//     loss = model(x).sum();
//   }
//   loss.backward();  // may run after the guard is gone
//
// Guards nest (the innermost one wins, as saved-tensor hooks do); a checkpoint inside the guard
// drops its function's saves, and a guard inside a checkpointed function compresses them.
#pragma once

#include <cstdint>

#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::memory {

enum class CompressionMode : uint8_t {
  Bfloat16,  ///< float32/float64 saves stored as bfloat16
  Float16,   ///< float32/float64 saves stored as float16 (magnitudes past 65504 become inf)
  Int8,      ///< floating saves stored as int8 per block of `block_size`, with a float32 absmax scale
};

struct CompressOptions {
  CompressionMode mode = CompressionMode::Bfloat16;
  /// Tensors with fewer elements than this are saved as they are.
  int64_t min_numel = 4096;
  /// Int8 only: elements per block of the flattened tensor, in [1, 4096].
  int64_t block_size = 64;
};

/// Compresses what autograd saves for backward on this thread while alive. Integer and bool
/// tensors, tensors under min_numel, tensors already 16-bit (for the 16-bit modes) and leaves
/// that require grad (parameters, inputs: kept alive anyway, so a copy would add memory) are
/// saved as they are. Double backward (create_graph) through a compressed save raises
/// strata::Error. Bad options raise strata::Error.
class STRATA_API CompressActivations {
 public:
  explicit CompressActivations(const CompressOptions& options = {});
  ~CompressActivations();
  CompressActivations(const CompressActivations&) = delete;
  CompressActivations& operator=(const CompressActivations&) = delete;

 private:
  struct Impl;
  Impl* impl_;
};

/// Per-block absmax int8 quantization of the flattened `x` (the Int8 mode's encoding), exposed
/// for tests: codes (blocks, block_size) int8, scales (blocks, 1) float32; the last block is
/// zero-padded. dequantize_int8 restores x's shape and dtype.
struct Int8Blocks {
  Tensor codes;
  Tensor scales;
};
STRATA_API Int8Blocks quantize_int8(const Tensor& x, int64_t block_size);
STRATA_API Tensor dequantize_int8(const Int8Blocks& q, const Shape& shape, DType dtype);

}  // namespace strata::memory
