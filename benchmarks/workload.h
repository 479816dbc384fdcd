// The workloads every library in the benchmark table runs, described in plain terms so a
// peer library (LibTorch) can be compiled apart from strata. Training workloads (forward +
// backward, optimizer steps) are fp32, with the same shapes and the same work per iteration
// in every library: backward takes a fixed upstream gradient, leaves' grads are set to none
// before each iteration, and the graph is freed by backward.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace bench {

enum class Op {
  Matmul,       // (m, k) x (k, n), fp32
  MatmulNT,     // (m, k) x (n, k)^T: a Linear layer's weight, read transposed
  BatchedNT,    // (b, m, k) x (b, n, k)^T: attention scores
  Add, Mul,     // out = a op b, 16M fp32 each
  AddInPlace,   // a += b
  Exp, Gelu,    // out = f(a)
  GeluTanh,     // out = gelu(a, approximate = "tanh")
  Log,          // out = log(a)
  Sin,          // out = sin(a), a uniform in [-100, 100)
  Randn,        // out = a fresh (n) standard normal draw
  Randint,      // out = a fresh (n) int64 draw from [0, k)
  Dropout,      // out = dropout(a, p = 0.1, training)
  Transpose,    // out = a.t().contiguous(), a (m, n)
  IndexAdd,     // table (k, n) index_add_ along dim 0 of src (m, n) at m random int64 rows: embedding's backward
  Gather,       // gather along dim 1 of a (m, k) by a random int64 index (m, n)
  Sort,         // sort of n random floats, values and int64 indices
  Topk,         // topk (largest k) along dim 1 of (m, n) random floats
  MaxDim1,      // max with indices along dim 1 of (m, n) random floats
  AmaxDim1,     // amax (values only) along dim 1 of (m, n) random floats
  ToHalf,       // a.to(float16), n floats
  FromHalf,     // a.to(float32), n float16 values
  Arange,       // arange(n), int64
  CatDim1,      // cat({a, b}, 1) of two (m, n) floats
  SumAll,       // sum of a (rows, cols)
  SumDim0,      // sum over dim 0 of (rows, cols)
  SumDim1,      // sum over dim 1 of (rows, cols)
  // forward + backward to every input that requires grad (all of them)
  LinearTrain,     // x (m, k) @ weight (n, k)^T + bias (n)
  Conv2dTrain,     // conv2d of x (b, conv.c_in, conv.h, conv.w), no bias (as in ResNet), NCHW
  Conv3dTrain,     // conv3d of x (b, conv.c_in, conv.d, conv.h, conv.w), no bias, NCDHW
  Conv3dComposedTrain,  // the same with strata's native 3-d kernels switched off (LibTorch: the same)
  MaxPool3dTrain,  // max_pool3d of x (b, conv.c_in, conv.d, conv.h, conv.w), window conv.kernel^3, stride, pad
  AvgPool3dTrain,  // avg_pool3d of the same (count_include_pad, PyTorch's default)
  LayerNormTrain,  // layer_norm over the last dim of x (m, n), with weight and bias (n)
  SoftmaxTrain,    // softmax over the last dim of x (m, n)
  AttentionTrain,  // causal attention of q, k, v (b, m heads, n tokens, k head dim)
  AttentionComposedTrain,  // the same with strata's fused attention switched off (LibTorch: the same)
  // one optimizer step over m tensors of n / m parameters each, gradients present
  AdamW,        // lr 1e-3, weight decay 0.01
  SGDMomentum,  // lr 1e-3, momentum 0.9
};

/// A convolution's shape: input (batch, c_in, h, w), weight (c_out, c_in, kernel, kernel); 3-d
/// convolutions add the depth d (and the kernel's depth, the same as its height and width).
struct ConvShape {
  int64_t c_in = 0, c_out = 0, h = 0, w = 0, kernel = 1, stride = 1, pad = 0, d = 1;
  int64_t out_h() const { return (h + 2 * pad - kernel) / stride + 1; }
  int64_t out_w() const { return (w + 2 * pad - kernel) / stride + 1; }
  int64_t out_d() const { return (d + 2 * pad - kernel) / stride + 1; }
};

struct Workload {
  Op op;
  int64_t b = 1, m = 0, n = 0, k = 0;  // elementwise ops use n; reductions use m (rows) x n (cols)
  ConvShape conv{};                    // the Conv*Train workloads only
};

/// Allocates a workload's inputs and returns the function that runs one iteration; the
/// inputs live as long as the returned function.
using Runner = std::function<void()>;

/// A library run beside strata.
class Peer {
 public:
  virtual ~Peer() = default;
  virtual std::string name() const = 0;
  virtual void set_threads(int n) = 0;
  /// Null when the peer has no equivalent of the workload.
  virtual Runner prepare(const Workload& w) = 0;
};

/// LibTorch when the benchmarks were built with it, else null.
std::unique_ptr<Peer> make_torch_peer();

/// strata running a workload (ops_strata.cpp).
Runner strata_runner(const Workload& w);

}  // namespace bench
