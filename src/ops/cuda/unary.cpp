// CUDA launchers of the unary ops (src/ops/unary.cpp): tensors -> StridedLoop and pointers,
// dispatch on dtype, launch on the tensor's device and current stream. The kernels are in
// kernels/cuda/unary_*.cu; this file is plain C++ because nvcc cannot parse strata's
// fmt-based headers.
#include <strata/ops/unary.hpp>

#include "core/registry_internal.h"
#include "kernels/common/unary_math.h"
#include "kernels/cuda/elementwise_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"
#include "ops/loop.h"
#include "ops/unary_functor.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

template <class F, DTypeSet Set>
void cuda_unary(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  const F f = unary_functor::make<F>(call);
  auto loop = make_loop<2>(out, {&x}, "unary");
  cuda::DeviceGuard guard(out.device().index);
  dispatch<Set>(x.dtype(), "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(
        ck::unary(loop, cuda_launch::stream_for(out), static_cast<T*>(out.data()), static_cast<const T*>(x.data()), f),
        "unary");
  });
}

void cuda_logical_not(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<2>(out, {&x}, "logical_not");
  cuda::DeviceGuard guard(out.device().index);
  dispatch(x.dtype(), "logical_not", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::logical_not(loop, cuda_launch::stream_for(out), static_cast<bool*>(out.data()),
                                              static_cast<const T*>(x.data())),
                              "logical_not");
  });
}

}  // namespace

namespace detail {
void register_cuda_unary_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::exp, CUDA, kFloatDTypes, cuda_unary<math::Exp, DTypeSet::Floating>);
  table.set(OpId::log, CUDA, kFloatDTypes, cuda_unary<math::Log, DTypeSet::Floating>);
  table.set(OpId::sqrt, CUDA, kFloatDTypes, cuda_unary<math::Sqrt, DTypeSet::Floating>);
  table.set(OpId::rsqrt, CUDA, kFloatDTypes, cuda_unary<math::Rsqrt, DTypeSet::Floating>);
  table.set(OpId::sin, CUDA, kFloatDTypes, cuda_unary<math::Sin, DTypeSet::Floating>);
  table.set(OpId::cos, CUDA, kFloatDTypes, cuda_unary<math::Cos, DTypeSet::Floating>);
  table.set(OpId::tanh, CUDA, kFloatDTypes, cuda_unary<math::Tanh, DTypeSet::Floating>);
  table.set(OpId::sigmoid, CUDA, kFloatDTypes, cuda_unary<math::Sigmoid, DTypeSet::Floating>);
  table.set(OpId::gelu, CUDA, kFloatDTypes, cuda_unary<math::GeluErf, DTypeSet::Floating>);
  table.set(OpId::gelu_tanh, CUDA, kFloatDTypes, cuda_unary<math::GeluTanh, DTypeSet::Floating>);
  table.set(OpId::silu, CUDA, kFloatDTypes, cuda_unary<math::Silu, DTypeSet::Floating>);
  table.set(OpId::reciprocal, CUDA, kFloatDTypes, cuda_unary<math::Reciprocal, DTypeSet::Floating>);
  table.set(OpId::leaky_relu, CUDA, kFloatDTypes, cuda_unary<math::LeakyRelu, DTypeSet::Floating>);
  table.set(OpId::erf, CUDA, kFloatDTypes, cuda_unary<math::Erf, DTypeSet::Floating>);
  table.set(OpId::log1p, CUDA, kFloatDTypes, cuda_unary<math::Log1p, DTypeSet::Floating>);
  table.set(OpId::expm1, CUDA, kFloatDTypes, cuda_unary<math::Expm1, DTypeSet::Floating>);
  table.set(OpId::floor, CUDA, kFloatDTypes, cuda_unary<math::Floor, DTypeSet::Floating>);
  table.set(OpId::ceil, CUDA, kFloatDTypes, cuda_unary<math::Ceil, DTypeSet::Floating>);
  table.set(OpId::round, CUDA, kFloatDTypes, cuda_unary<math::Round, DTypeSet::Floating>);
  table.set(OpId::trunc, CUDA, kFloatDTypes, cuda_unary<math::Trunc, DTypeSet::Floating>);
  table.set(OpId::tan, CUDA, kFloatDTypes, cuda_unary<math::Tan, DTypeSet::Floating>);
  table.set(OpId::asin, CUDA, kFloatDTypes, cuda_unary<math::Asin, DTypeSet::Floating>);
  table.set(OpId::acos, CUDA, kFloatDTypes, cuda_unary<math::Acos, DTypeSet::Floating>);
  table.set(OpId::atan, CUDA, kFloatDTypes, cuda_unary<math::Atan, DTypeSet::Floating>);
  table.set(OpId::sinh, CUDA, kFloatDTypes, cuda_unary<math::Sinh, DTypeSet::Floating>);
  table.set(OpId::cosh, CUDA, kFloatDTypes, cuda_unary<math::Cosh, DTypeSet::Floating>);
  table.set(OpId::asinh, CUDA, kFloatDTypes, cuda_unary<math::Asinh, DTypeSet::Floating>);
  table.set(OpId::acosh, CUDA, kFloatDTypes, cuda_unary<math::Acosh, DTypeSet::Floating>);
  table.set(OpId::atanh, CUDA, kFloatDTypes, cuda_unary<math::Atanh, DTypeSet::Floating>);
  table.set(OpId::log2, CUDA, kFloatDTypes, cuda_unary<math::Log2, DTypeSet::Floating>);
  table.set(OpId::log10, CUDA, kFloatDTypes, cuda_unary<math::Log10, DTypeSet::Floating>);
  table.set(OpId::exp2, CUDA, kFloatDTypes, cuda_unary<math::Exp2, DTypeSet::Floating>);
  table.set(OpId::neg, CUDA, kNumericDTypes, cuda_unary<math::Neg, DTypeSet::Numeric>);
  table.set(OpId::abs, CUDA, kNumericDTypes, cuda_unary<math::Abs, DTypeSet::Numeric>);
  table.set(OpId::sign, CUDA, kNumericDTypes, cuda_unary<math::Sign, DTypeSet::Numeric>);
  table.set(OpId::relu, CUDA, kNumericDTypes, cuda_unary<math::Relu, DTypeSet::Numeric>);
  table.set(OpId::square, CUDA, kNumericDTypes, cuda_unary<math::Square, DTypeSet::Numeric>);
  table.set(OpId::pow_scalar, CUDA, kNumericDTypes, cuda_unary<math::PowScalar, DTypeSet::Numeric>);
  table.set(OpId::clamp, CUDA, kNumericDTypes, cuda_unary<math::Clamp, DTypeSet::Numeric>);
  table.set(OpId::logical_not, CUDA, kAllDTypes, cuda_logical_not);
}
}  // namespace detail

}  // namespace strata
