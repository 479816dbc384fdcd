// Which cuDNN algorithm runs a convolution (for src/ops/cuda/conv.cpp): the candidates for
// one problem, best first, found once per problem signature and cached for the process.
// Benchmark mode times the algorithms on the call's own buffers (cudnnFind*AlgorithmEx);
// otherwise cuDNN's heuristics rank them (cudnnGet*Algorithm_v7). Candidates are filtered by
// the deterministic switch and, for float32, by allow_tf32 (see Note [Convolution math]).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <strata/core/tensor.hpp>

#include "core/cuda/cudnn.h"

namespace strata::cuda_conv {

enum class ConvKind : uint8_t { Forward, BackwardData, BackwardFilter };

/// Everything that decides which algorithms are valid and fastest for one cuDNN call.
struct ConvSignature {
  int device = 0;
  ConvKind kind = ConvKind::Forward;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  bool nhwc = false;
  int n = 0, c = 0, h = 0, w = 0;  // input activation
  int o = 0, kh = 0, kw = 0;       // filter (o, c / groups, kh, kw)
  int oh = 0, ow = 0;              // output activation
  int pad_h = 0, pad_w = 0, stride_h = 0, stride_w = 0, dil_h = 0, dil_w = 0, groups = 1;
  bool tf32 = false, deterministic = false, benchmark = false;
  int d = 1, kd = 1, od = 1, pad_d = 0, stride_d = 1, dil_d = 1;  // depth: 3-d convolutions only
  int rank = 2;  // 4-d or 5-d descriptors: a depth-1 3-d problem may not take a 2-d one's algorithm
  auto operator<=>(const ConvSignature&) const = default;
};

/// One candidate: the algorithm (a cudnnConvolution*Algo_t value), the math type to set on
/// the convolution descriptor before running it, and its workspace.
struct ConvAlgorithm {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

/// The descriptors and device buffers of one call. x: input activation (written by
/// BackwardData), w: filter (written by BackwardFilter), y: output activation (written by
/// Forward). A timed search writes the buffer its kind writes, except the filter gradient,
/// which it writes to a scratch copy (so gradients accumulated over batch chunks survive).
struct ConvCall {
  cudnnHandle_t handle;
  cudnnTensorDescriptor_t x_desc, y_desc;
  cudnnFilterDescriptor_t w_desc;
  cudnnConvolutionDescriptor_t conv_desc;
  void *x, *w, *y;
};

/// A workspace of `bytes` on `device` from the caching allocator, or an undefined tensor
/// when there is no memory for it (or bytes is 0).
Tensor conv_workspace(int device, size_t bytes);

/// The math type to put on the descriptor before choosing algorithms.
cudnnMathType_t initial_math(cudnnDataType_t dtype, bool tf32);

/// The candidates for `sig`, best first; empty when cuDNN supports none of them. Searched on
/// the first call of each signature, from the cache afterwards.
std::vector<ConvAlgorithm> conv_algorithms(const ConvSignature& sig, const ConvCall& call, const char* op);

}  // namespace strata::cuda_conv
