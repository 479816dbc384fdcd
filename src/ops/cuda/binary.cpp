// CUDA launchers of the binary ops, comparisons, where (src/ops/binary.cpp) and isclose
// (src/ops/compare.cpp), with the
// same broadcasting StridedLoop as the CPU kernels. Kernels: kernels/cuda/binary.cu.
#include <type_traits>

#include <strata/ops/compare.hpp>

#include "core/registry_internal.h"
#include "kernels/common/binary_math.h"
#include "kernels/cuda/elementwise_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

template <class F, DTypeSet Set, bool BoolOut>
void cuda_binary(const KernelCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<3>(out, {&a, &b}, "binary");
  cuda::DeviceGuard guard(out.device().index);
  dispatch<Set>(a.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Out = std::conditional_t<BoolOut, bool, T>;
    cuda_launch::check_launch(ck::binary(loop, cuda_launch::stream_for(out), static_cast<Out*>(out.data()),
                                         static_cast<const T*>(a.data()), static_cast<const T*>(b.data()), F{}),
                              "binary");
  });
}

// bool-only ops (logical and/or, bool + bool, bool * bool): instantiated for bool alone.
template <class F>
void cuda_logical(const KernelCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& out = call.outputs[0];
  STRATA_CHECK(a.dtype() == kBool, "[logical] expected bool inputs, got {}", a.dtype());
  auto loop = make_loop<3>(out, {&a, &b}, "logical");
  cuda::DeviceGuard guard(out.device().index);
  cuda_launch::check_launch(ck::binary(loop, cuda_launch::stream_for(out), static_cast<bool*>(out.data()),
                                       static_cast<const bool*>(a.data()), static_cast<const bool*>(b.data()), F{}),
                            "logical");
}

void cuda_where(const KernelCall& call) {
  const Tensor& cond = call.inputs[0];
  const Tensor& a = call.inputs[1];
  const Tensor& b = call.inputs[2];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<4>(out, {&cond, &a, &b}, "where");
  cuda::DeviceGuard guard(out.device().index);
  dispatch(a.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::where(loop, cuda_launch::stream_for(out), static_cast<T*>(out.data()),
                                        static_cast<const bool*>(cond.data()), static_cast<const T*>(a.data()),
                                        static_cast<const T*>(b.data())),
                              "where");
  });
}

void cuda_isclose(const KernelCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& out = call.outputs[0];
  const auto& p = call.param<IsCloseParams>();
  auto loop = make_loop<3>(out, {&a, &b}, "isclose");
  cuda::DeviceGuard guard(out.device().index);
  dispatch(a.dtype(), "isclose", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::isclose(loop, cuda_launch::stream_for(out), static_cast<bool*>(out.data()),
                                          static_cast<const T*>(a.data()), static_cast<const T*>(b.data()), p.rtol,
                                          p.atol, p.equal_nan),
                              "isclose");
  });
}

}  // namespace

namespace detail {
void register_cuda_binary_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::add, CUDA, kNumericDTypes, cuda_binary<math::Add, DTypeSet::Numeric, false>);
  table.set(OpId::add, CUDA, kBool, cuda_logical<math::LogicalOr>);  // bool + bool = or
  table.set(OpId::sub, CUDA, kNumericDTypes, cuda_binary<math::Sub, DTypeSet::Numeric, false>);
  table.set(OpId::mul, CUDA, kNumericDTypes, cuda_binary<math::Mul, DTypeSet::Numeric, false>);
  table.set(OpId::mul, CUDA, kBool, cuda_logical<math::LogicalAnd>);  // bool * bool = and
  table.set(OpId::div, CUDA, kFloatDTypes, cuda_binary<math::Div, DTypeSet::Floating, false>);
  table.set(OpId::maximum, CUDA, kNumericDTypes, cuda_binary<math::Maximum, DTypeSet::Numeric, false>);
  table.set(OpId::minimum, CUDA, kNumericDTypes, cuda_binary<math::Minimum, DTypeSet::Numeric, false>);
  table.set(OpId::maximum, CUDA, kBool, cuda_logical<math::LogicalOr>);   // max of bools = or
  table.set(OpId::minimum, CUDA, kBool, cuda_logical<math::LogicalAnd>);  // min of bools = and
  table.set(OpId::pow, CUDA, kNumericDTypes, cuda_binary<math::Pow, DTypeSet::Numeric, false>);
  table.set(OpId::fmod, CUDA, kNumericDTypes, cuda_binary<math::Fmod, DTypeSet::Numeric, false>);
  table.set(OpId::remainder, CUDA, kNumericDTypes, cuda_binary<math::Remainder, DTypeSet::Numeric, false>);
  table.set(OpId::atan2, CUDA, kFloatDTypes, cuda_binary<math::Atan2, DTypeSet::Floating, false>);
  table.set(OpId::eq, CUDA, kAllDTypes, cuda_binary<math::Eq, DTypeSet::All, true>);
  table.set(OpId::ne, CUDA, kAllDTypes, cuda_binary<math::Ne, DTypeSet::All, true>);
  table.set(OpId::lt, CUDA, kAllDTypes, cuda_binary<math::Lt, DTypeSet::All, true>);
  table.set(OpId::le, CUDA, kAllDTypes, cuda_binary<math::Le, DTypeSet::All, true>);
  table.set(OpId::gt, CUDA, kAllDTypes, cuda_binary<math::Gt, DTypeSet::All, true>);
  table.set(OpId::ge, CUDA, kAllDTypes, cuda_binary<math::Ge, DTypeSet::All, true>);
  table.set(OpId::logical_and, CUDA, kBool, cuda_logical<math::LogicalAnd>);
  table.set(OpId::logical_or, CUDA, kBool, cuda_logical<math::LogicalOr>);
  table.set(OpId::where, CUDA, kAllDTypes, cuda_where);
  table.set(OpId::isclose, CUDA, kAllDTypes, cuda_isclose);
}
}  // namespace detail

}  // namespace strata
