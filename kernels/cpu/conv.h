// 2-d convolution on raw pointers: forward, backward-data and backward-weights, for arrays
// in any strided layout (NCHW and NHWC are the fast ones). Every convolution goes through
// these three entry points; each tries oneDNN first (f32, where it has a fast kernel) and
// falls back to the im2col + GEMM reference in conv_ref.cpp (f64, other layouts, builds
// without oneDNN).
//
// A transposed convolution is conv_backward_data with its input as `dst` and its output as
// `src`, so it needs no entry point of its own.
#pragma once

#include <cstdint>

namespace strata::cpu {

/// U8S8: uint8 src, int8 weight, int32 dst, the exact sums of (src - src_zero_point) * weight
/// with padding taps reading the zero point (contributing nothing); forward only, through
/// conv_forward_dnnl only (the int8 layers of src/quant keep their own reference).
enum class ConvType : uint8_t { F32, F64, U8S8 };

/// A 4-d array indexed (n, c, h, w), with element strides in that order: NCHW data has
/// strides (C*H*W, H*W, W, 1), NHWC data (H*W*C, 1, W*C, C).
struct Array4 {
  void* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};
};

struct ConvGeometry {
  int64_t n = 0, c_in = 0, h_in = 0, w_in = 0;  // src
  int64_t c_out = 0, h_out = 0, w_out = 0;      // dst
  int64_t kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t groups = 1;
  bool operator==(const ConvGeometry&) const = default;
};

/// One convolution: dst = conv(src, weight) + bias, with PyTorch's semantics
///   dst[n, o, y, x] = bias[o] + sum_{i, p, q} src[n, g*Cg + i, y*sh - ph + p*dh, x*sw - pw + q*dw]
///                                             * weight[o, i, p, q]
/// (g = o / (c_out / groups), Cg = c_in / groups, out-of-range src reads are 0).
/// weight is (c_out, c_in / groups, kh, kw); bias is c_out contiguous values or null.
/// Which arrays are read and which written depends on the entry point.
struct ConvProblem {
  ConvType type = ConvType::F32;
  ConvGeometry g;
  Array4 src;     // (n, c_in, h_in, w_in)
  Array4 weight;  // (c_out, c_in / groups, kh, kw)
  Array4 dst;     // (n, c_out, h_out, w_out)
  void* bias = nullptr;
  int32_t src_zero_point = 0;  // U8S8 only
};

/// Reads src, weight and bias (if any); writes dst.
void conv_forward(const ConvProblem& p);
/// Reads dst (the gradient of the output) and weight; writes src (the gradient of the input).
void conv_backward_data(const ConvProblem& p);
/// Reads src and dst (the gradient of the output); writes weight (its gradient) and, when
/// bias is not null, the bias gradient (dst summed over n, h, w).
void conv_backward_weights(const ConvProblem& p);

// The backends. The oneDNN ones return false, having written nothing, when oneDNN is absent
// from the build or has no fast kernel for the problem.
bool conv_forward_dnnl(const ConvProblem& p);
bool conv_backward_data_dnnl(const ConvProblem& p);
bool conv_backward_weights_dnnl(const ConvProblem& p);
void conv_forward_ref(const ConvProblem& p);
void conv_backward_data_ref(const ConvProblem& p);
void conv_backward_weights_ref(const ConvProblem& p);

/// A 5-d array indexed (n, c, d, h, w), with element strides in that order.
struct Array5 {
  void* data = nullptr;
  int64_t stride[5] = {0, 0, 0, 0, 0};
};

/// A 3-d convolution's sizes; the spatial arrays are in (d, h, w) order.
struct Conv3dGeometry {
  int64_t n = 0, c_in = 0, c_out = 0, groups = 1;
  int64_t in[3] = {0, 0, 0}, out[3] = {0, 0, 0}, k[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, dil[3] = {1, 1, 1};
  bool operator==(const Conv3dGeometry&) const = default;
};

/// The 3-d ConvProblem, float32 only: the same semantics with a depth dim, src
/// (n, c_in, in...), weight (c_out, c_in / groups, k...), dst (n, c_out, out...), out the full
/// output size (oneDNN refuses a smaller one at stride 1; the callers pad or crop).
struct Conv3dProblem {
  Conv3dGeometry g;
  Array5 src, weight, dst;
  void* bias = nullptr;
};

/// The 3-d entry points, oneDNN only (the 3-d ops run composed of the 2-d ones in a build
/// without it). With oneDNN they handle every float32 problem, taking whichever kernel oneDNN
/// picks (there is no 3-d reference here to fall back to).
bool conv3d_forward_dnnl(const Conv3dProblem& p);
bool conv3d_backward_data_dnnl(const Conv3dProblem& p);
bool conv3d_backward_weights_dnnl(const Conv3dProblem& p);
/// Whether the build has oneDNN (the conv*_dnnl functions may return true).
bool conv_dnnl_available();

/// Number of cached oneDNN convolution primitives (0 without oneDNN); for tests of the bound.
int64_t conv_dnnl_cache_size();

}  // namespace strata::cpu
