// CUDA kernels of conv2d, conv2d_backward_input and conv2d_backward_weight, and of their 3-d
// counterparts conv3d, conv3d_backward_input and conv3d_backward_weight, through cuDNN's
// convolution API (src/nn/conv.cpp and src/nn/conv3d_native.cpp have the argument checks,
// shapes, autograd and the kernel contracts; src/ops/cuda/conv_algorithms.cpp picks the
// algorithms). A 3-d problem is the 2-d one with a depth dim, described through cuDNN's Nd
// descriptors; it always runs in NCDHW.
//
// Layout: the activations are described to cuDNN as they are, NCHW or NHWC (channels-last,
// chosen when either activation is channels-last), with no copies when both are dense in
// that layout; the filter takes the same layout (cuDNN needs them to agree; a filter in the
// other layout is copied, or written to a temporary, as is any operand that is not dense). If
// cuDNN has no algorithm for an NHWC problem, it runs in NCHW through copies.
//
// Dtypes: f32 (TF32 only with cuda::allow_tf32()), f64, and f16 / bf16 with float32
// accumulation. The bias is added by cuDNN itself: the output is filled with the bias and
// the convolution runs with beta = 1, so the sum is rounded once.
//
// Sizes: cuDNN takes 32-bit sizes, so batches whose activations pass 2^31 elements run in
// chunks of images (the filter gradient accumulates over the chunks with beta = 1). An
// output smaller than the convolution's full size (a transposed convolution whose
// output_padding reaches past the stride) is computed full-size and cropped, and its
// gradient zero-padded to full size.
#include <algorithm>
#include <array>
#include <climits>
#include <span>
#include <type_traits>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/cuda.hpp>
#include <strata/nn/functional_conv3d.hpp>
#include <strata/ops/creation.hpp>

#include "core/cuda/cudnn.h"
#include "core/registry_internal.h"
#include "kernels/cuda/nn_ops.h"
#include "ops/cuda/conv_algorithms.h"
#include "ops/cuda/conv_geometry.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace F = nn::functional;
using cuda_conv::ConvAlgorithm;
using cuda_conv::ConvKind;
using namespace cuda_conv;  // the geometry and layouts of conv_geometry.h

// ---- one cuDNN call --------------------------------------------------------------------------

cudnnDataType_t cudnn_type(DType t) {
  switch (t) {
    case DType::Float32: return CUDNN_DATA_FLOAT;
    case DType::Float64: return CUDNN_DATA_DOUBLE;
    case DType::Float16: return CUDNN_DATA_HALF;
    case DType::BFloat16: return CUDNN_DATA_BFLOAT16;
    default: strata::detail::throw_error("[conv2d] cuDNN convolutions support floating dtypes, got {}", t);
  }
}

struct Descriptors {
  cuda::TensorDescriptor x, y;
  cuda::FilterDescriptor w;
  cuda::ConvolutionDescriptor conv;
  explicit Descriptors(const char* op) : x(op), y(op), w(op), conv(op) {}
};

// A convolution of one kind over images [first, first + count) of dense operands.
struct ConvRun {
  ConvKind kind;
  Geometry g;  // full output size
  DType dtype;
  bool nhwc;
  int device;
  cudnnHandle_t handle;
  const char* op;
  char *x, *w, *y;  // whole-batch base pointers
};

// Runs f(first, count) over chunks of images small enough for cuDNN's 32-bit sizes.
template <class Fn>
void for_each_chunk(const Geometry& g, const char* op, const Fn& f) {
  const int64_t per_image = std::max(g.in_volume(), g.out_volume());
  STRATA_CHECK(per_image <= INT_MAX && g.o * (g.c / g.groups) * g.kd * g.kh * g.kw <= INT_MAX,
               "[{}] one image ({} values) or the filter is past cuDNN's 2^31-element limit", op, per_image);
  const int64_t step = std::max<int64_t>(1, std::min<int64_t>(g.n, INT_MAX / std::max<int64_t>(per_image, 1)));
  for (int64_t first = 0; first < g.n; first += step) f(first, std::min(step, g.n - first));
}

// The Nd descriptors of a 3-d problem over `count` images: dense NCDHW activations and filter.
void describe_3d(const ConvRun& r, Descriptors& d, int64_t count, cudnnDataType_t dt, cudnnDataType_t compute) {
  const Geometry& g = r.g;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  const int x[5] = {i(count), i(g.c), i(g.d), i(g.h), i(g.w)}, y[5] = {i(count), i(g.o), i(g.od), i(g.oh), i(g.ow)};
  const int w[5] = {i(g.o), i(g.c / g.groups), i(g.kd), i(g.kh), i(g.kw)};
  auto strides = [](const int* dims, int* s) {
    s[4] = 1;
    for (int k = 3; k >= 0; --k) s[k] = s[k + 1] * dims[k + 1];
  };
  int xs[5], ys[5];
  strides(x, xs);
  strides(y, ys);
  STRATA_CUDNN_CHECK(cudnnSetTensorNdDescriptor(d.x.get(), dt, 5, x, xs), r.op);
  STRATA_CUDNN_CHECK(cudnnSetTensorNdDescriptor(d.y.get(), dt, 5, y, ys), r.op);
  STRATA_CUDNN_CHECK(cudnnSetFilterNdDescriptor(d.w.get(), dt, CUDNN_TENSOR_NCHW, 5, w), r.op);
  const int pad[3] = {i(g.pd), i(g.ph), i(g.pw)}, stride[3] = {i(g.sd), i(g.sh), i(g.sw)};
  const int dil[3] = {i(g.dd), i(g.dh), i(g.dw)};
  STRATA_CUDNN_CHECK(
      cudnnSetConvolutionNdDescriptor(d.conv.get(), 3, pad, stride, dil, CUDNN_CROSS_CORRELATION, compute), r.op);
}

cuda_conv::ConvCall describe(const ConvRun& r, Descriptors& d, int64_t first, int64_t count) {
  const Geometry& g = r.g;
  const cudnnDataType_t dt = cudnn_type(r.dtype);
  const cudnnTensorFormat_t f = r.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  const auto i = [](int64_t v) { return static_cast<int>(v); };  // checked by for_each_chunk and geometry
  const cudnnDataType_t compute = dt == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  if (g.rank == 3) {
    describe_3d(r, d, count, dt, compute);
  } else {
    STRATA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.x.get(), f, dt, i(count), i(g.c), i(g.h), i(g.w)), r.op);
    STRATA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.y.get(), f, dt, i(count), i(g.o), i(g.oh), i(g.ow)), r.op);
    STRATA_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d.w.get(), dt, f, i(g.o), i(g.c / g.groups), i(g.kh), i(g.kw)),
                       r.op);
    STRATA_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d.conv.get(), i(g.ph), i(g.pw), i(g.sh), i(g.sw), i(g.dh),
                                                       i(g.dw), CUDNN_CROSS_CORRELATION, compute),
                       r.op);
  }
  STRATA_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d.conv.get(), i(g.groups)), r.op);
  STRATA_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), cuda_conv::initial_math(dt, cuda::allow_tf32())), r.op);
  const int64_t esize = static_cast<int64_t>(itemsize(r.dtype));
  return {r.handle, d.x.get(), d.y.get(), d.w.get(), d.conv.get(), r.x + first * g.in_volume() * esize, r.w,
          r.y + first * g.out_volume() * esize};
}

cuda_conv::ConvSignature signature(const ConvRun& r, int64_t count) {
  const Geometry& g = r.g;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  return {r.device, r.kind, cudnn_type(r.dtype), r.nhwc, i(count), i(g.c), i(g.h), i(g.w), i(g.o), i(g.kh), i(g.kw),
          i(g.oh), i(g.ow), i(g.ph), i(g.pw), i(g.sh), i(g.sw), i(g.dh), i(g.dw), i(g.groups), cuda::allow_tf32(),
          cuda::deterministic(), cuda::benchmark_mode(), i(g.d), i(g.kd), i(g.od), i(g.pd), i(g.sd), i(g.dd), g.rank};
}

// Runs the first candidate whose workspace can be allocated and that cuDNN accepts; beta = 1
// adds to the output. False when cuDNN supports none of them (the problem is left unwritten).
bool execute(const ConvRun& r, const cuda_conv::ConvCall& c, const std::vector<ConvAlgorithm>& algos,
             bool accumulate) {
  const float one_f = 1.0f, zero_f = 0.0f;
  const double one_d = 1.0, zero_d = 0.0;
  const bool dbl = r.dtype == kFloat64;
  const void* alpha = dbl ? static_cast<const void*>(&one_d) : &one_f;
  const void* beta = accumulate ? alpha : dbl ? static_cast<const void*>(&zero_d) : &zero_f;
  bool out_of_memory = false;
  for (const ConvAlgorithm& a : algos) {
    Tensor workspace = cuda_conv::conv_workspace(r.device, a.workspace);
    if (a.workspace > 0 && !workspace.defined()) {  // no memory for it: the next candidate
      out_of_memory = true;
      continue;
    }
    void* ws = a.workspace > 0 ? workspace.data() : nullptr;
    STRATA_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv_desc, a.math), r.op);
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    const char* call = "";
    switch (r.kind) {
      case ConvKind::Forward:
        call = "cudnnConvolutionForward";
        st = cudnnConvolutionForward(c.handle, alpha, c.x_desc, c.x, c.w_desc, c.w, c.conv_desc,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), ws, a.workspace, beta, c.y_desc,
                                     c.y);
        break;
      case ConvKind::BackwardData:
        call = "cudnnConvolutionBackwardData";
        st = cudnnConvolutionBackwardData(c.handle, alpha, c.w_desc, c.w, c.y_desc, c.y, c.conv_desc,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo), ws, a.workspace, beta,
                                          c.x_desc, c.x);
        break;
      case ConvKind::BackwardFilter:
        call = "cudnnConvolutionBackwardFilter";
        st = cudnnConvolutionBackwardFilter(c.handle, alpha, c.x_desc, c.x, c.y_desc, c.y, c.conv_desc,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo), ws, a.workspace,
                                            beta, c.w_desc, c.w);
        break;
    }
    if (cuda::cudnn_not_supported(st)) continue;  // a heuristic candidate cuDNN then refuses
    cuda::cudnn_check(st, call, r.op);
    return true;
  }
  STRATA_CHECK(!out_of_memory, "[{}] no cuDNN algorithm for this convolution fits in the free GPU memory", r.op);
  return false;
}

// Runs r over all images; before_run(first, count) runs after the algorithm choice of each
// chunk (a timed search writes the output) and before the chunk is computed, and returns
// whether the chunk adds to what it wrote. Returns false, having computed nothing, when cuDNN
// supports no algorithm for the problem.
template <class BeforeRun>
bool run_chunks(const ConvRun& r, bool accumulate_chunks, const BeforeRun& before_run) {
  Descriptors d(r.op);
  bool supported = true, first_chunk = true;
  for_each_chunk(r.g, r.op, [&](int64_t first, int64_t count) {
    if (!supported) return;
    const cuda_conv::ConvCall c = describe(r, d, first, count);
    const std::vector<ConvAlgorithm> algos = cuda_conv::conv_algorithms(signature(r, count), c, r.op);
    const bool accumulate = !algos.empty() && (before_run(first, count) || (accumulate_chunks && !first_chunk));
    if (algos.empty() || !execute(r, c, algos, accumulate)) {
      STRATA_CHECK(first_chunk, "[{}] cuDNN supports this convolution for some batch sizes only", r.op);
      supported = false;
      return;
    }
    first_chunk = false;
  });
  return supported;
}

ConvRun make_run(ConvKind kind, const Geometry& full, const Tensor& x, const Tensor& w, const Tensor& y,
                 MemoryFormat f, const char* op) {
  const int device = x.device().index;
  return {kind, full, x.dtype(), f == MemoryFormat::ChannelsLast, device,
          cuda::cudnn_handle(device, cuda_launch::stream_for(x), op), op, static_cast<char*>(x.data()),
          static_cast<char*>(w.data()), static_cast<char*>(y.data())};
}

const Tensor* optional_tensor(std::span<const Tensor> ts, size_t i) {
  return ts.size() > i && ts[i].defined() ? &ts[i] : nullptr;
}

void check_bias(const char* op, const Tensor* b, const Geometry& g, const Tensor& x) {
  if (!b) return;
  STRATA_CHECK(b->dim() == 1 && b->size(0) == g.o && b->is_contiguous() && b->dtype() == x.dtype() &&
                   b->device() == x.device(),
               "[{}] kernel needs a contiguous {} bias of {} values on {}, got {} {} on {}", op, x.dtype(), g.o,
               x.device(), b->dtype(), b->shape(), b->device());
}

// ---- the three kernels, for 2-d (Args = F::Conv2dArgs) and 3-d (F::Conv3dArgs) problems -----------

template <class Args>
constexpr bool kIs3d = std::is_same_v<Args, F::Conv3dArgs>;
template <class Args>
constexpr const char* kForwardOp = kIs3d<Args> ? "conv3d" : "conv2d";
template <class Args>
constexpr const char* kBackwardInputOp = kIs3d<Args> ? "conv3d_backward_input" : "conv2d_backward_input";
template <class Args>
constexpr const char* kBackwardWeightOp = kIs3d<Args> ? "conv3d_backward_weight" : "conv2d_backward_weight";

// The bias broadcast over an output of shape `shape`.
Tensor bias_over(const Tensor& bias, const Shape& shape) {
  Shape v(shape.size(), 1);
  v[1] = bias.size(0);
  return bias.view(v).expand(shape);
}

void forward_in(const char* op, MemoryFormat f, bool& done, const Tensor& x0, const Tensor& w0, const Tensor* bias,
                Tensor& y, const Geometry& g) {
  const Geometry full = full_output(g);
  const bool cropped = !full_size(y, full);
  Tensor out = cropped ? empty_in(full_shape(full), y, f) : writable(y, f);
  if (x0.numel() == 0 || w0.numel() == 0) {  // nothing to convolve: the bias alone
    if (bias) out.copy_(bias_over(*bias, out.shape()));
    else out.zero_();
  } else {
    const Tensor x = dense(x0, f), w = dense(w0, f);
    const ConvRun r = make_run(ConvKind::Forward, full, x, w, out, f, op);
    done = run_chunks(r, false, [&](int64_t first, int64_t count) {
      if (!bias) return false;
      Tensor part = out.narrow(0, first, count);
      part.copy_(bias_over(*bias, part.shape()));
      return true;
    });
    if (!done) return;
  }
  done = true;
  if (cropped) y.copy_(leading(out, g.od, g.oh, g.ow));
  else if (!out.is_same(y)) y.copy_(out);
}

template <class Args>
void cuda_conv_forward(const KernelCall& call) {
  NoGradGuard no_grad;
  const char* op = kForwardOp<Args>;
  const Tensor &x = call.inputs[0], &w = call.inputs[1];
  const Tensor* bias = optional_tensor(call.inputs, 2);
  Tensor& y = call.outputs[0];
  const Geometry g = geometry(op, x, w, y, call.param<Args>());
  check_bias(op, bias, g, x);
  if (y.numel() == 0) return;
  cuda::DeviceGuard guard(y.device().index);
  bool done = false;
  const MemoryFormat f = layout_for(x, y);
  forward_in(op, f, done, x, w, bias, y, g);
  if (!done && f == MemoryFormat::ChannelsLast) forward_in(op, MemoryFormat::Contiguous, done, x, w, bias, y, g);
  STRATA_CHECK(done, "[{}] cuDNN has no algorithm for input {}, weight {} ({})", op, x.shape(), w.shape(), x.dtype());
}

void backward_input_in(const char* op, MemoryFormat f, bool& done, const Tensor& gy0, const Tensor& w0, Tensor& gx,
                       const Geometry& g) {
  const Geometry full = full_output(g);
  const Tensor gy = padded_to_full(dense(gy0, f), full, f), w = dense(w0, f);
  Tensor out = writable(gx, f);
  const ConvRun r = make_run(ConvKind::BackwardData, full, out, w, gy, f, op);
  done = run_chunks(r, false, [](int64_t, int64_t) { return false; });
  if (done && !out.is_same(gx)) gx.copy_(out);
}

template <class Args>
void cuda_conv_backward_input(const KernelCall& call) {
  NoGradGuard no_grad;
  const char* op = kBackwardInputOp<Args>;
  const Tensor &gy = call.inputs[0], &w = call.inputs[1];
  Tensor& gx = call.outputs[0];
  const Geometry g = geometry(op, gx, w, gy, call.param<Args>());
  if (gx.numel() == 0) return;
  cuda::DeviceGuard guard(gx.device().index);
  if (gy.numel() == 0 || w.numel() == 0) {
    gx.zero_();
    return;
  }
  bool done = false;
  const MemoryFormat f = layout_for(gx, gy);
  backward_input_in(op, f, done, gy, w, gx, g);
  if (!done && f == MemoryFormat::ChannelsLast) backward_input_in(op, MemoryFormat::Contiguous, done, gy, w, gx, g);
  STRATA_CHECK(done, "[{}] cuDNN has no algorithm for grad_output {}, weight {} ({})", op, gy.shape(), w.shape(),
               gy.dtype());
}

void backward_weight_in(const char* op, MemoryFormat f, bool& done, const Tensor& gy0, const Tensor& x0, Tensor& gw,
                        const Geometry& g) {
  const Geometry full = full_output(g);
  const Tensor gy = padded_to_full(dense(gy0, f), full, f), x = dense(x0, f);
  Tensor out = writable(gw, f);
  const ConvRun r = make_run(ConvKind::BackwardFilter, full, x, out, gy, f, op);
  done = run_chunks(r, true, [](int64_t, int64_t) { return false; });
  if (done && !out.is_same(gw)) gw.copy_(out);
}

// The bias gradient: gy summed over n and the spatial dims (kernels/cuda/batch_norm.cu's channel sums).
void bias_grad(const char* op, const Tensor& gy0, Tensor& gb) {
  const MemoryFormat f = strictly_channels_last(gy0) ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  const Tensor gy = dense(gy0, f);
  const int64_t volume = gy.numel() / std::max<int64_t>(gy.size(0) * gy.size(1), 1);
  const cuda_kernels::ChannelLayout l{gy.size(0), gy.size(1), volume, f == MemoryFormat::ChannelsLast};
  Tensor scratch = empty({cuda_kernels::batch_norm_scratch_doubles(l)}, TensorOptions(kFloat64, gy.device()));
  dispatch<DTypeSet::Floating>(gy.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(cuda_kernels::channel_sum<T>(l, cuda_launch::stream_for(gy),
                                                           static_cast<const T*>(gy.data()), static_cast<T*>(gb.data()),
                                                           static_cast<double*>(scratch.data())),
                              op);
  });
}

template <class Args>
void cuda_conv_backward_weight(const KernelCall& call) {
  NoGradGuard no_grad;
  const char* op = kBackwardWeightOp<Args>;
  const Tensor &gy = call.inputs[0], &x = call.inputs[1];
  Tensor& gw = call.outputs[0];
  Tensor* gb = call.outputs.size() > 1 && call.outputs[1].defined() ? &call.outputs[1] : nullptr;
  const Geometry g = geometry(op, x, gw, gy, call.param<Args>());
  check_bias(op, gb, g, x);
  cuda::DeviceGuard guard(gw.device().index);
  if (gb) bias_grad(op, gy, *gb);
  if (gw.numel() == 0) return;
  if (gy.numel() == 0 || x.numel() == 0) {
    gw.zero_();
    return;
  }
  bool done = false;
  const MemoryFormat f = layout_for(x, gy);
  backward_weight_in(op, f, done, gy, x, gw, g);
  if (!done && f == MemoryFormat::ChannelsLast) backward_weight_in(op, MemoryFormat::Contiguous, done, gy, x, gw, g);
  STRATA_CHECK(done, "[{}] cuDNN has no algorithm for input {}, grad_output {} ({})", op, x.shape(), gy.shape(),
               x.dtype());
}

}  // namespace

namespace detail {
void register_cuda_conv_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::conv2d, CUDA, kFloatDTypes, cuda_conv_forward<F::Conv2dArgs>);
  table.set(OpId::conv2d_backward_input, CUDA, kFloatDTypes, cuda_conv_backward_input<F::Conv2dArgs>);
  table.set(OpId::conv2d_backward_weight, CUDA, kFloatDTypes, cuda_conv_backward_weight<F::Conv2dArgs>);
  table.set(OpId::conv3d, CUDA, kFloatDTypes, cuda_conv_forward<F::Conv3dArgs>);
  table.set(OpId::conv3d_backward_input, CUDA, kFloatDTypes, cuda_conv_backward_input<F::Conv3dArgs>);
  table.set(OpId::conv3d_backward_weight, CUDA, kFloatDTypes, cuda_conv_backward_weight<F::Conv3dArgs>);
}
}  // namespace detail

}  // namespace strata
