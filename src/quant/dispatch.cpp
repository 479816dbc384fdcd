// The quantization kernels (see dispatch.h) as ops of the kernel registry, registered once on
// first use: CPU loops here, CUDA launchers in cuda_quant.cpp (or the stubs of no_cuda_quant.cpp,
// which raise naming the build option). Every call goes through run_kernel, the path every op
// takes, so the profiler records it and ext::register_kernel can replace a kernel.
#include "quant/dispatch.h"

#include <strata/core/error.hpp>
#include <strata/core/registry.hpp>
#include <strata/ops/creation.hpp>
#include <strata/quant/quantize.hpp>

#include "kernels/cpu/int4_gemv.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/quant.h"
#include "quant/cuda_quant.h"

namespace strata::quant::detail {

namespace cq = cpu::quant;

namespace {

// What the kernels take besides their tensors.
struct AffineParams {
  ChannelLayout layout;
  int32_t qmin = 0, qmax = 0;
};
struct Int8LinearParams {
  bool x_per_row;
};
struct Im2colParams {
  qmath::Im2colShape shape;
  uint8_t pad;
};
struct ConvParams {
  cpu::ConvGeometry g;
  bool* handled;  // whether oneDNN took the problem
};
struct Int4Params {
  int64_t group;
  bool symmetric = true;
  bool direct = false;  // the Linear: decode the codes in registers up to kInt4DirectMaxRows rows
};

void cpu_quantize(const KernelCall& c) {
  const auto& p = c.param<AffineParams>();
  const Tensor &x = c.inputs[0], &scale = c.inputs[1], &zero_point = c.inputs[2], &q = c.outputs[0];
  if (q.dtype() == kInt8) {
    cq::quantize_affine(ptr<float>(x), ptr<int8_t>(q), p.layout, ptr<float>(scale), ptr<int32_t>(zero_point), p.qmin,
                        p.qmax);
  } else {
    cq::quantize_affine(ptr<float>(x), ptr<uint8_t>(q), p.layout, ptr<float>(scale), ptr<int32_t>(zero_point), p.qmin,
                        p.qmax);
  }
}

void cpu_dequantize(const KernelCall& c) {
  const auto& p = c.param<AffineParams>();
  const Tensor &q = c.inputs[0], &scale = c.inputs[1], &zero_point = c.inputs[2], &out = c.outputs[0];
  if (q.dtype() == kInt8) {
    cq::dequantize_affine(ptr<int8_t>(q), ptr<float>(out), p.layout, ptr<float>(scale), ptr<int32_t>(zero_point));
  } else {
    cq::dequantize_affine(ptr<uint8_t>(q), ptr<float>(out), p.layout, ptr<float>(scale), ptr<int32_t>(zero_point));
  }
}

void cpu_fake_quantize(const KernelCall& c) {
  const auto& p = c.param<AffineParams>();
  cq::fake_quantize(ptr<float>(c.inputs[0]), ptr<float>(c.outputs[0]), ptr<uint8_t>(c.outputs[1]), p.layout,
                    ptr<float>(c.inputs[1]), ptr<int32_t>(c.inputs[2]), p.qmin, p.qmax);
}

void cpu_quantize_rows_uint8(const KernelCall& c) {
  const Tensor& x = c.inputs[0];
  cq::quantize_rows_uint8(ptr<float>(x), x.size(0), x.size(1), ptr<uint8_t>(c.outputs[0]), ptr<float>(c.outputs[1]),
                          ptr<int32_t>(c.outputs[2]));
}

// From this many rows oneDNN's integer GEMM beats gemm_8bit (bench_quant; see cpu_int8_linear).
constexpr int64_t kOneDnnRows = 32;

void cpu_int8_linear(const KernelCall& c) {
  const Tensor &xq = c.inputs[0], &wq = c.inputs[3];
  const int64_t M = xq.size(0), N = wq.size(0), K = xq.size(1);
  if (M >= kOneDnnRows) {
    const Tensor acc = empty({M, N}, kInt32);
    if (cpu::gemm_u8s8s32_dnnl(ptr<uint8_t>(xq), ptr<int8_t>(wq), ptr<int32_t>(acc), M, N, K)) {
      cq::int8_linear_from_sums(ptr<int32_t>(acc), ptr<float>(c.inputs[1]), ptr<int32_t>(c.inputs[2]),
                                c.param<Int8LinearParams>().x_per_row, ptr<float>(c.inputs[4]),
                                ptr<int32_t>(c.inputs[5]), ptr<float>(c.inputs[6]), ptr<float>(c.outputs[0]), M, N);
      return;
    }
  }
  cq::int8_linear(ptr<uint8_t>(xq), ptr<float>(c.inputs[1]), ptr<int32_t>(c.inputs[2]),
                  c.param<Int8LinearParams>().x_per_row, ptr<int8_t>(wq), ptr<float>(c.inputs[4]),
                  ptr<int32_t>(c.inputs[5]), ptr<float>(c.inputs[6]), ptr<float>(c.outputs[0]), xq.size(0),
                  wq.size(0), xq.size(1));
}

void cpu_im2col_u8(const KernelCall& c) {
  const auto& p = c.param<Im2colParams>();
  cq::im2col_u8(ptr<uint8_t>(c.inputs[0]), c.inputs[0].size(0), p.shape, p.pad, ptr<uint8_t>(c.outputs[0]));
}

void cpu_conv2d_int8(const KernelCall& c) {
  const auto& p = c.param<ConvParams>();
  const cpu::ConvGeometry& g = p.g;
  const Tensor& y = c.outputs[0];
  cpu::ConvProblem cp;
  cp.type = cpu::ConvType::U8S8;
  cp.g = g;
  const int64_t cg = g.c_in / g.groups;
  cp.src = {c.inputs[0].data(), {g.h_in * g.w_in * g.c_in, 1, g.w_in * g.c_in, g.c_in}};  // channels last
  cp.weight = {c.inputs[3].data(), {cg * g.kh * g.kw, g.kh * g.kw, g.kw, 1}};
  cp.src_zero_point = *ptr<int32_t>(c.inputs[2]);
  const Tensor acc = empty(y.shape(), kInt32);
  cp.dst = {acc.data(), {g.h_out * g.w_out * g.c_out, 1, g.w_out * g.c_out, g.c_out}};
  *p.handled = cpu::conv_forward_dnnl(cp);
  if (*p.handled)
    cq::int8_values(ptr<int32_t>(acc), *ptr<float>(c.inputs[1]), ptr<float>(c.inputs[4]), ptr<float>(c.inputs[5]),
                    ptr<float>(y), y.size(0), y.size(1));
}

void cpu_int8_gemm(const KernelCall& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  int32_t* out = ptr<int32_t>(c.outputs[0]);
  const int64_t N = b.size(0);
  cq::gemm_8bit(ptr<int8_t>(a), ptr<int8_t>(b), a.size(0), N, a.size(1),
                [&](int64_t m, int64_t n, int32_t sum) { out[m * N + n] = sum; });
}

void cpu_quantize_int4(const KernelCall& c) {
  const auto& p = c.param<Int4Params>();
  const Tensor& w = c.inputs[0];
  cq::quantize_int4_groups(ptr<float>(w), w.size(0), w.size(1), p.group, p.symmetric, ptr<uint8_t>(c.outputs[0]),
                           ptr<float>(c.outputs[1]), ptr<uint8_t>(c.outputs[2]));
}

void cpu_dequantize_int4(const KernelCall& c) {
  const Tensor& w = c.outputs[0];
  const int64_t N = w.size(0), K = w.size(1);
  for (int64_t n = 0; n < N; ++n)
    cq::dequantize_int4_row_fast(ptr<uint8_t>(c.inputs[0]), ptr<float>(c.inputs[1]), ptr<uint8_t>(c.inputs[2]), n,
                                 K, c.param<Int4Params>().group, ptr<float>(w) + n * K);
}

void cpu_int4_linear(const KernelCall& c) {
  const Tensor &x = c.inputs[0], &packed = c.inputs[1], &bias = c.inputs[4], &y = c.outputs[0];
  // float activations for either product (kernels/cpu/int4_gemv.h, qgemm.h); bfloat16 ones are converted
  const int64_t M = x.size(0), N = packed.size(0), K = x.size(1);
  const Tensor xf = x.to(kFloat32).contiguous(), bf = bias.defined() ? bias.to(kFloat32).contiguous() : bias;
  const Tensor yf = y.dtype() == kFloat32 ? y : empty(y.shape(), kFloat32);
  const auto& p = c.param<Int4Params>();
  const auto product = p.direct && M <= cq::kInt4DirectMaxRows ? cq::int4_linear_direct : cq::int4_linear;
  product(ptr<float>(xf), ptr<uint8_t>(packed), ptr<float>(c.inputs[2]), ptr<uint8_t>(c.inputs[3]), p.group,
          ptr<float>(bf), ptr<float>(yf), M, N, K);
  if (!yf.is_same(y)) y.copy_(yf);
}

struct QuantOps {
  OpId quantize, dequantize, fake_quantize, quantize_rows_uint8, int8_linear, im2col_u8, int8_gemm, quantize_int4,
      dequantize_int4, int4_linear, conv2d_int8_onednn;
};

const QuantOps& quant_ops() {
  static const QuantOps ops = [] {
    namespace cu = cuda_quant;
    QuantOps o;
    o.quantize = add_op("quant_quantize", 3, {kFloat32}, cpu_quantize, [](const KernelCall& c) {
      const auto& p = c.param<AffineParams>();
      cu::quantize(c.inputs[0], c.outputs[0], p.layout, c.inputs[1], c.inputs[2], p.qmin, p.qmax);
    });
    o.dequantize = add_op("quant_dequantize", 3, {kInt8, kUInt8}, cpu_dequantize, [](const KernelCall& c) {
      cu::dequantize(c.inputs[0], c.outputs[0], c.param<AffineParams>().layout, c.inputs[1], c.inputs[2]);
    });
    o.fake_quantize = add_op("quant_fake_quantize", 3, {kFloat32}, cpu_fake_quantize, [](const KernelCall& c) {
      const auto& p = c.param<AffineParams>();
      cu::fake_quantize(c.inputs[0], c.outputs[0], c.outputs[1], p.layout, c.inputs[1], c.inputs[2], p.qmin, p.qmax);
    });
    o.quantize_rows_uint8 =
        add_op("quant_quantize_rows_uint8", 1, {kFloat32}, cpu_quantize_rows_uint8, [](const KernelCall& c) {
          cu::quantize_rows_uint8(c.inputs[0], c.outputs[0], c.outputs[1], c.outputs[2]);
        });
    o.int8_linear = add_op("quant_int8_linear", 7, {kUInt8}, cpu_int8_linear, [](const KernelCall& c) {
      const auto& in = c.inputs;
      cu::int8_linear(in[0], in[1], in[2], c.param<Int8LinearParams>().x_per_row, in[3], in[4], in[5], in[6],
                      c.outputs[0]);
    });
    o.im2col_u8 = add_op("quant_im2col_u8", 1, {kUInt8}, cpu_im2col_u8, [](const KernelCall& c) {
      const auto& p = c.param<Im2colParams>();
      cu::im2col_u8(c.inputs[0], p.shape, p.pad, c.outputs[0]);
    });
    o.int8_gemm = add_op("quant_int8_gemm", 2, {kInt8}, cpu_int8_gemm, [](const KernelCall& c) {
      cu::int8_gemm(c.inputs[0], c.inputs[1], c.outputs[0]);
    });
    o.quantize_int4 = add_op("quant_quantize_int4", 1, {kFloat32}, cpu_quantize_int4, [](const KernelCall& c) {
      const auto& p = c.param<Int4Params>();
      cu::quantize_int4(c.inputs[0], p.group, p.symmetric, c.outputs[0], c.outputs[1], c.outputs[2]);
    });
    o.dequantize_int4 = add_op("quant_dequantize_int4", 3, {kUInt8}, cpu_dequantize_int4, [](const KernelCall& c) {
      cu::dequantize_int4(c.inputs[0], c.inputs[1], c.inputs[2], c.param<Int4Params>().group, c.outputs[0]);
    });
    o.int4_linear = add_op("quant_int4_linear", 5, {kFloat32, kBFloat16}, cpu_int4_linear, [](const KernelCall& c) {
      const auto& in = c.inputs;
      cu::int4_linear(in[0], in[1], in[2], in[3], c.param<Int4Params>().group, in[4], c.outputs[0]);
    });
    // CPU only: run_conv2d_int8_onednn sends no other device
    o.conv2d_int8_onednn = ext::register_op("quant_conv2d_int8_onednn", 6);
    ext::register_kernel(o.conv2d_int8_onednn, DeviceType::CPU, kUInt8, cpu_conv2d_int8);
    return o;
  }();
  return ops;
}

}  // namespace

OpId add_op(const char* name, int inputs, std::initializer_list<DType> dtypes, KernelFn cpu, KernelFn cuda) {
  const OpId op = ext::register_op(name, inputs);
  for (DType d : dtypes) {
    ext::register_kernel(op, DeviceType::CPU, d, cpu);
    ext::register_kernel(op, DeviceType::CUDA, d, cuda);
  }
  return op;
}

void run(OpId op, std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs, const void* params) {
  std::vector<Tensor> in(inputs), out(outputs);
  run_kernel(op, in.front().dtype(), KernelCall{in, out, params});
}

ChannelLayout layout_of(const Shape& shape, int64_t axis) {
  ChannelLayout l{1, 1, 1};
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t ax = static_cast<int64_t>(d);
    if (axis < 0 || ax > axis) {
      l.inner *= shape[d];
    } else if (ax < axis) {
      l.outer *= shape[d];
    } else {
      l.channels = shape[d];
    }
  }
  return l;
}

void run_quantize(const Tensor& x, const Tensor& q, ChannelLayout l, const Tensor& scale, const Tensor& zero_point,
                  int32_t qmin, int32_t qmax) {
  const AffineParams p{l, qmin, qmax};
  run(quant_ops().quantize, {x, scale, zero_point}, {q}, &p);
}

void run_dequantize(const Tensor& q, const Tensor& out, ChannelLayout l, const Tensor& scale,
                    const Tensor& zero_point) {
  const AffineParams p{l};
  run(quant_ops().dequantize, {q, scale, zero_point}, {out}, &p);
}

void run_fake_quantize(const Tensor& x, const Tensor& out, const Tensor& mask, ChannelLayout l, const Tensor& scale,
                       const Tensor& zero_point, int32_t qmin, int32_t qmax) {
  const AffineParams p{l, qmin, qmax};
  run(quant_ops().fake_quantize, {x, scale, zero_point}, {out, mask}, &p);
}

void run_quantize_rows_uint8(const Tensor& x, const Tensor& q, const Tensor& scale, const Tensor& zero_point) {
  run(quant_ops().quantize_rows_uint8, {x}, {q, scale, zero_point});
}

void run_int8_linear(const Tensor& xq, const Tensor& x_scale, const Tensor& x_zero, bool x_per_row, const Tensor& wq,
                     const Tensor& w_scale, const Tensor& w_row_sum, const Tensor& bias, const Tensor& y) {
  const Int8LinearParams p{x_per_row};
  run(quant_ops().int8_linear, {xq, x_scale, x_zero, wq, w_scale, w_row_sum, bias}, {y}, &p);
}

void run_im2col_u8(const Tensor& x, const qmath::Im2colShape& shape, uint8_t pad, const Tensor& cols) {
  const Im2colParams p{shape, pad};
  run(quant_ops().im2col_u8, {x}, {cols}, &p);
}

bool run_conv2d_int8_onednn(const Tensor& codes, const Tensor& x_scale, const Tensor& x_zero, const Tensor& wcodes,
                            const Tensor& w_scale, const Tensor& bias, const cpu::ConvGeometry& g, const Tensor& y) {
  if (!codes.device().is_cpu()) return false;
  bool handled = false;
  const ConvParams p{g, &handled};
  run(quant_ops().conv2d_int8_onednn, {codes, x_scale, x_zero, wcodes, w_scale, bias}, {y}, &p);
  return handled;
}

void run_int8_gemm(const Tensor& a, const Tensor& b, const Tensor& c) { run(quant_ops().int8_gemm, {a, b}, {c}); }

void run_quantize_int4(const Tensor& w, int64_t group, bool symmetric, const Tensor& packed, const Tensor& scale,
                       const Tensor& zero_point) {
  const Int4Params p{group, symmetric};
  run(quant_ops().quantize_int4, {w}, {packed, scale, zero_point}, &p);
}

void run_dequantize_int4(const Tensor& packed, const Tensor& scale, const Tensor& zero_point, int64_t group,
                         const Tensor& w) {
  const Int4Params p{group};
  run(quant_ops().dequantize_int4, {packed, scale, zero_point}, {w}, &p);
}

void run_int4_linear(const Tensor& x, const Tensor& packed, const Tensor& scale, const Tensor& zero_point,
                     int64_t group, const Tensor& bias, const Tensor& y) {
  const Int4Params p{group, true, int4_direct_kernel_enabled()};
  run(quant_ops().int4_linear, {x, packed, scale, zero_point, bias}, {y}, &p);
}

}  // namespace strata::quant::detail
