// Ties the pointer-level kernels to strata: declares the op, registers a kernel per
// (device, dtype) that turns the KernelCall's tensors into pointers, and defines the public
// function through a custom autograd::Function whose backward is written with strata ops,
// so it runs wherever those ops have kernels.
#include "swish.hpp"

#include <any>
#include <cmath>

#include "swish_kernels.h"

namespace swish {

using namespace strata;

namespace {

// inputs[0] is x, outputs[0] is y; both dense (scaled_swish makes x contiguous) and of dtype T.
template <class T>
void cpu_kernel(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  forward_cpu(x.data_ptr<T>(), y.data_ptr<T>(), y.numel(), static_cast<T>(call.param<Params>().beta));
}

template <class T>
void cuda_kernel(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  // The registry hands kernels no stream: strata's ops (the copy that made x contiguous, the
  // allocation of y) run on the device's current stream, the legacy default one unless a
  // StreamGuard chose a user stream, which does not synchronize with the default one; so the
  // kernel goes on the current stream too.
  void* stream = cuda::Stream::current(y.device().index).handle();
  const char* err = forward_cuda(x.data_ptr<T>(), y.data_ptr<T>(), y.numel(),
                                 static_cast<T>(call.param<Params>().beta), y.device().index, stream);
  STRATA_CHECK(err == nullptr, "[scaled_swish] CUDA kernel launch on {} failed: {}", y.device(), err);
}

OpId register_all() {
  // one input, differentiable: the table row strata's own ops get from op_table.hpp
  OpId op = ext::register_op("scaled_swish", 1, true);
  ext::register_kernel(op, DeviceType::CPU, kFloat32, cpu_kernel<float>);
  ext::register_kernel(op, DeviceType::CPU, kFloat64, cpu_kernel<double>);
  if (cuda_compiled()) {
    ext::register_kernel(op, DeviceType::CUDA, kFloat32, cuda_kernel<float>);
    ext::register_kernel(op, DeviceType::CUDA, kFloat64, cuda_kernel<double>);
  }
  return op;
}

// Forward runs the fused kernel; backward composes strata ops:
//   d/dx [x * s(bx)] = s + b x s (1 - s) = s * (1 + b x (1 - s)),  s = sigmoid(b x).
struct ScaledSwishFunction : autograd::Function<ScaledSwishFunction> {
  static Tensor forward(AutogradContext& ctx, const Tensor& x, double beta) {
    STRATA_CHECK(x.defined(), "[scaled_swish] input tensor is undefined");
    STRATA_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64,
                 "[scaled_swish] expects a float32 or float64 tensor, got {}", x.dtype());
    STRATA_CHECK(std::isfinite(beta), "[scaled_swish] beta must be finite, got {}", beta);
    Tensor in = x.contiguous();  // the kernels take dense memory; a view is copied first
    Tensor out = empty(x.shape(), TensorOptions(x.dtype(), x.device()));
    const Params params{beta};
    run_kernel(register_scaled_swish(), x.dtype(), KernelCall{{&in, 1}, {&out, 1}, &params});
    ctx.save_for_backward({x});
    ctx.saved_data["beta"] = beta;
    return out;
  }

  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grads) {
    const Tensor x = ctx.saved()[0];
    const double beta = std::any_cast<double>(ctx.saved_data.at("beta"));
    const Tensor bx = x * beta;
    const Tensor s = sigmoid(bx);
    return {grads[0] * s * (1 + bx * (1 - s))};  // one gradient per Tensor argument of forward
  }
};

}  // namespace

OpId register_scaled_swish() {
  static const OpId op = register_all();  // thread-safe, once per process
  return op;
}

bool has_cuda_kernel() { return ext::has_kernel(register_scaled_swish(), DeviceType::CUDA, kFloat32); }

Tensor scaled_swish(const Tensor& x, double beta) { return ScaledSwishFunction::apply(x, beta); }

}  // namespace swish
