// CUDA kernels of conv2d, conv2d_backward_input and conv2d_backward_weight through cuDNN's
// convolution API (src/nn/conv.cpp has the argument checks, shapes, autograd and the kernel
// contracts; src/ops/cuda/conv_algorithms.cpp picks the algorithms).
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
#include <climits>
#include <span>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/cuda.hpp>
#include <strata/nn/functional_conv.hpp>
#include <strata/ops/creation.hpp>

#include "core/cuda/cudnn.h"
#include "core/registry_internal.h"
#include "kernels/cuda/nn_ops.h"
#include "ops/cuda/conv_algorithms.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace F = nn::functional;
using cuda_conv::ConvAlgorithm;
using cuda_conv::ConvKind;

struct Geometry {
  int64_t n, c, h, w;  // input activation
  int64_t o, kh, kw;   // filter (o, c / groups, kh, kw)
  int64_t oh, ow;      // output activation
  int64_t sh, sw, ph, pw, dh, dw, groups;
};

int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

// The CPU launchers' checks (src/nn/conv.cpp), and one device and dtype for all operands.
Geometry geometry(const char* op, const Tensor& x, const Tensor& w, const Tensor& y, const F::Conv2dArgs& a) {
  STRATA_CHECK(x.dim() == 4 && w.dim() == 4 && y.dim() == 4, "[{}] kernel needs 4-d operands, got {}, {}, {}", op,
               x.shape(), w.shape(), y.shape());
  STRATA_CHECK(x.dtype() == w.dtype() && y.dtype() == x.dtype() && x.device() == w.device() &&
                   y.device() == x.device(),
               "[{}] operands must share one dtype and device, got {} {}, {} {}, {} {}", op, x.dtype(), x.device(),
               w.dtype(), w.device(), y.dtype(), y.device());
  const Geometry g{x.size(0), x.size(1), x.size(2), x.size(3), y.size(1), w.size(2), w.size(3), y.size(2), y.size(3),
                   a.stride.h, a.stride.w, a.padding.h, a.padding.w, a.dilation.h, a.dilation.w, a.groups};
  STRATA_CHECK(g.groups > 0 && g.c % g.groups == 0 && g.o % g.groups == 0 && w.size(0) == g.o &&
                   w.size(1) * g.groups == g.c && y.size(0) == g.n && g.kh > 0 && g.kw > 0,
               "[{}] kernel operands do not match: x {}, w {}, y {}, groups {}", op, x.shape(), w.shape(), y.shape(),
               g.groups);
  STRATA_CHECK(g.sh > 0 && g.sw > 0 && g.dh > 0 && g.dw > 0 && g.ph >= 0 && g.pw >= 0 && g.sh <= INT_MAX &&
                   g.sw <= INT_MAX && g.dh <= INT_MAX && g.dw <= INT_MAX && g.ph <= INT_MAX && g.pw <= INT_MAX,
               "[{}] bad kernel arguments", op);
  STRATA_CHECK(g.oh >= 1 && g.ow >= 1 && g.oh <= conv_out(g.h, g.kh, g.sh, g.ph, g.dh) &&
                   g.ow <= conv_out(g.w, g.kw, g.sw, g.pw, g.dw),
               "[{}] output {} does not fit the input {}", op, y.shape(), x.shape());
  return g;
}

// The geometry cuDNN sees: the full output size.
Geometry full_output(Geometry g) {
  g.oh = conv_out(g.h, g.kh, g.sh, g.ph, g.dh);
  g.ow = conv_out(g.w, g.kw, g.sw, g.pw, g.dw);
  return g;
}

// ---- layouts ---------------------------------------------------------------------------------

bool strictly_channels_last(const Tensor& t) {
  return !t.is_contiguous() && t.is_contiguous(MemoryFormat::ChannelsLast);
}

MemoryFormat layout_for(const Tensor& a, const Tensor& b) {
  return strictly_channels_last(a) || strictly_channels_last(b) ? MemoryFormat::ChannelsLast
                                                                 : MemoryFormat::Contiguous;
}

Tensor dense(const Tensor& t, MemoryFormat f) { return t.is_contiguous(f) ? t : t.to(f); }

Tensor empty_in(const Shape& s, const Tensor& like, MemoryFormat f) {
  const TensorOptions o(like.dtype(), like.device());
  if (f == MemoryFormat::Contiguous) return empty(s, o);
  return empty({s[0], s[2], s[3], s[1]}, o).permute({0, 3, 1, 2});
}

// An output the kernel can write in layout f: `out` itself, or a temporary to copy back.
Tensor writable(const Tensor& out, MemoryFormat f) { return out.is_contiguous(f) ? out : empty_in(out.shape(), out, f); }

// dy zero-padded at the bottom and right to the full output size of g.
Tensor padded_to_full(const Tensor& dy, const Geometry& g, MemoryFormat f) {
  if (dy.size(2) == g.oh && dy.size(3) == g.ow) return dy;
  Tensor full = empty_in({g.n, g.o, g.oh, g.ow}, dy, f);
  full.zero_();
  full.slice(2, 0, dy.size(2)).slice(3, 0, dy.size(3)).copy_(dy);
  return full;
}

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
  const int64_t per_image = std::max(g.c * g.h * g.w, g.o * g.oh * g.ow);
  STRATA_CHECK(per_image <= INT_MAX && g.o * (g.c / g.groups) * g.kh * g.kw <= INT_MAX,
               "[{}] one image ({} values) or the filter is past cuDNN's 2^31-element limit", op, per_image);
  const int64_t step = std::max<int64_t>(1, std::min<int64_t>(g.n, INT_MAX / std::max<int64_t>(per_image, 1)));
  for (int64_t first = 0; first < g.n; first += step) f(first, std::min(step, g.n - first));
}

cuda_conv::ConvCall describe(const ConvRun& r, Descriptors& d, int64_t first, int64_t count) {
  const Geometry& g = r.g;
  const cudnnDataType_t dt = cudnn_type(r.dtype);
  const cudnnTensorFormat_t f = r.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  const auto i = [](int64_t v) { return static_cast<int>(v); };  // checked by for_each_chunk and geometry
  STRATA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.x.get(), f, dt, i(count), i(g.c), i(g.h), i(g.w)), r.op);
  STRATA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d.y.get(), f, dt, i(count), i(g.o), i(g.oh), i(g.ow)), r.op);
  STRATA_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d.w.get(), dt, f, i(g.o), i(g.c / g.groups), i(g.kh), i(g.kw)), r.op);
  STRATA_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d.conv.get(), i(g.ph), i(g.pw), i(g.sh), i(g.sw), i(g.dh),
                                                     i(g.dw), CUDNN_CROSS_CORRELATION,
                                                     dt == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT),
                     r.op);
  STRATA_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d.conv.get(), i(g.groups)), r.op);
  STRATA_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), cuda_conv::initial_math(dt, cuda::allow_tf32())), r.op);
  const int64_t esize = static_cast<int64_t>(itemsize(r.dtype));
  return {r.handle, d.x.get(), d.y.get(), d.w.get(), d.conv.get(), r.x + first * g.c * g.h * g.w * esize, r.w,
          r.y + first * g.o * g.oh * g.ow * esize};
}

cuda_conv::ConvSignature signature(const ConvRun& r, int64_t count) {
  const Geometry& g = r.g;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  return {r.device, r.kind, cudnn_type(r.dtype), r.nhwc, i(count), i(g.c), i(g.h), i(g.w), i(g.o), i(g.kh), i(g.kw),
          i(g.oh), i(g.ow), i(g.ph), i(g.pw), i(g.sh), i(g.sw), i(g.dh), i(g.dw), i(g.groups), cuda::allow_tf32(),
          cuda::deterministic(), cuda::benchmark_mode()};
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

// ---- the three kernels -------------------------------------------------------------------------

void forward_in(MemoryFormat f, bool& done, const Tensor& x0, const Tensor& w0, const Tensor* bias, Tensor& y,
                const Geometry& g) {
  const char* op = "conv2d";
  const Geometry full = full_output(g);
  const bool cropped = full.oh != g.oh || full.ow != g.ow;
  Tensor out = cropped ? empty_in({g.n, g.o, full.oh, full.ow}, y, f) : writable(y, f);
  if (x0.numel() == 0 || w0.numel() == 0) {  // nothing to convolve: the bias alone
    if (bias) out.copy_(bias->view({1, g.o, 1, 1}).expand(out.shape()));
    else out.zero_();
  } else {
    const Tensor x = dense(x0, f), w = dense(w0, f);
    const ConvRun r = make_run(ConvKind::Forward, full, x, w, out, f, op);
    done = run_chunks(r, false, [&](int64_t first, int64_t count) {
      if (!bias) return false;
      Tensor part = out.narrow(0, first, count);
      part.copy_(bias->view({1, g.o, 1, 1}).expand(part.shape()));
      return true;
    });
    if (!done) return;
  }
  done = true;
  if (cropped) y.copy_(out.slice(2, 0, g.oh).slice(3, 0, g.ow));
  else if (!out.is_same(y)) y.copy_(out);
}

void cuda_conv2d(const KernelCall& call) {
  NoGradGuard no_grad;
  const Tensor &x = call.inputs[0], &w = call.inputs[1];
  const Tensor* bias = optional_tensor(call.inputs, 2);
  Tensor& y = call.outputs[0];
  const Geometry g = geometry("conv2d", x, w, y, call.param<F::Conv2dArgs>());
  check_bias("conv2d", bias, g, x);
  if (y.numel() == 0) return;
  cuda::DeviceGuard guard(y.device().index);
  bool done = false;
  const MemoryFormat f = layout_for(x, y);
  forward_in(f, done, x, w, bias, y, g);
  if (!done && f == MemoryFormat::ChannelsLast) forward_in(MemoryFormat::Contiguous, done, x, w, bias, y, g);
  STRATA_CHECK(done, "[conv2d] cuDNN has no algorithm for input {}, weight {} ({})", x.shape(), w.shape(), x.dtype());
}

void backward_input_in(MemoryFormat f, bool& done, const Tensor& gy0, const Tensor& w0, Tensor& gx,
                       const Geometry& g) {
  const char* op = "conv2d_backward_input";
  const Geometry full = full_output(g);
  const Tensor gy = padded_to_full(dense(gy0, f), full, f), w = dense(w0, f);
  Tensor out = writable(gx, f);
  const ConvRun r = make_run(ConvKind::BackwardData, full, out, w, gy, f, op);
  done = run_chunks(r, false, [](int64_t, int64_t) { return false; });
  if (done && !out.is_same(gx)) gx.copy_(out);
}

void cuda_conv2d_backward_input(const KernelCall& call) {
  NoGradGuard no_grad;
  const Tensor &gy = call.inputs[0], &w = call.inputs[1];
  Tensor& gx = call.outputs[0];
  const Geometry g = geometry("conv2d_backward_input", gx, w, gy, call.param<F::Conv2dArgs>());
  if (gx.numel() == 0) return;
  cuda::DeviceGuard guard(gx.device().index);
  if (gy.numel() == 0 || w.numel() == 0) {
    gx.zero_();
    return;
  }
  bool done = false;
  const MemoryFormat f = layout_for(gx, gy);
  backward_input_in(f, done, gy, w, gx, g);
  if (!done && f == MemoryFormat::ChannelsLast) backward_input_in(MemoryFormat::Contiguous, done, gy, w, gx, g);
  STRATA_CHECK(done, "[conv2d_backward_input] cuDNN has no algorithm for grad_output {}, weight {} ({})", gy.shape(),
               w.shape(), gy.dtype());
}

void backward_weight_in(MemoryFormat f, bool& done, const Tensor& gy0, const Tensor& x0, Tensor& gw,
                        const Geometry& g) {
  const char* op = "conv2d_backward_weight";
  const Geometry full = full_output(g);
  const Tensor gy = padded_to_full(dense(gy0, f), full, f), x = dense(x0, f);
  Tensor out = writable(gw, f);
  const ConvRun r = make_run(ConvKind::BackwardFilter, full, x, out, gy, f, op);
  done = run_chunks(r, true, [](int64_t, int64_t) { return false; });
  if (done && !out.is_same(gw)) gw.copy_(out);
}

// The bias gradient: gy summed over n, h and w (kernels/cuda/batch_norm.cu's channel sums).
void bias_grad(const Tensor& gy0, Tensor& gb) {
  const MemoryFormat f = strictly_channels_last(gy0) ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
  const Tensor gy = dense(gy0, f);
  const cuda_kernels::ChannelLayout l{gy.size(0), gy.size(1), gy.size(2) * gy.size(3),
                                      f == MemoryFormat::ChannelsLast};
  Tensor scratch = empty({cuda_kernels::batch_norm_scratch_doubles(l)}, TensorOptions(kFloat64, gy.device()));
  dispatch<DTypeSet::Floating>(gy.dtype(), "conv2d_backward_weight", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(cuda_kernels::channel_sum<T>(l, cuda_launch::stream_for(gy),
                                                           static_cast<const T*>(gy.data()), static_cast<T*>(gb.data()),
                                                           static_cast<double*>(scratch.data())),
                              "conv2d_backward_weight");
  });
}

void cuda_conv2d_backward_weight(const KernelCall& call) {
  NoGradGuard no_grad;
  const Tensor &gy = call.inputs[0], &x = call.inputs[1];
  Tensor& gw = call.outputs[0];
  Tensor* gb = call.outputs.size() > 1 && call.outputs[1].defined() ? &call.outputs[1] : nullptr;
  const Geometry g = geometry("conv2d_backward_weight", x, gw, gy, call.param<F::Conv2dArgs>());
  check_bias("conv2d_backward_weight", gb, g, x);
  cuda::DeviceGuard guard(gw.device().index);
  if (gb) bias_grad(gy, *gb);
  if (gw.numel() == 0) return;
  if (gy.numel() == 0 || x.numel() == 0) {
    gw.zero_();
    return;
  }
  bool done = false;
  const MemoryFormat f = layout_for(x, gy);
  backward_weight_in(f, done, gy, x, gw, g);
  if (!done && f == MemoryFormat::ChannelsLast) backward_weight_in(MemoryFormat::Contiguous, done, gy, x, gw, g);
  STRATA_CHECK(done, "[conv2d_backward_weight] cuDNN has no algorithm for input {}, grad_output {} ({})", x.shape(),
               gy.shape(), x.dtype());
}

}  // namespace

namespace detail {
void register_cuda_conv_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::conv2d, CUDA, kFloatDTypes, cuda_conv2d);
  table.set(OpId::conv2d_backward_input, CUDA, kFloatDTypes, cuda_conv2d_backward_input);
  table.set(OpId::conv2d_backward_weight, CUDA, kFloatDTypes, cuda_conv2d_backward_weight);
}
}  // namespace detail

}  // namespace strata
