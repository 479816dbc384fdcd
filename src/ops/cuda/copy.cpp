// CUDA launchers of copy (dtype conversion, strides, broadcast, on one device) and fill, so
// contiguous(), to(dtype), clone() and full/zeros/ones work on GPU tensors. Transfers between
// host and device stay byte copies (src/core/cuda/runtime.cpp). Kernels: kernels/cuda/copy.cu.
#include <strata/ops/creation.hpp>

#include "core/registry_internal.h"
#include "kernels/common/convert.h"
#include "kernels/cuda/elementwise_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

// inputs[0] -> outputs[0], both on the same CUDA device; same shape after broadcast.
void cuda_copy(const KernelCall& call) {
  const Tensor& src = call.inputs[0];
  Tensor& dst = call.outputs[0];
  STRATA_CHECK(src.device() == dst.device(), "[copy] expected tensors on one CUDA device, got {} and {}",
               src.device(), dst.device());
  cuda::DeviceGuard guard(dst.device().index);
  cudaStream_t stream = cuda_launch::stream_for(dst);
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() && src.shape() == dst.shape()) {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream),
                      "copy");
    return;
  }
  auto loop = make_loop<2>(dst, {&src}, "copy");
  dispatch(src.dtype(), "copy", [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    dispatch(dst.dtype(), "copy", [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      cuda_launch::check_launch(
          ck::copy(loop, stream, static_cast<Out*>(dst.data()), static_cast<const In*>(src.data())), "copy");
    });
  });
}

void cuda_fill(const KernelCall& call) {
  Tensor& dst = call.outputs[0];
  const Scalar& value = call.param<FillParams>().value;
  auto loop = make_loop<1>(dst, {}, "fill");
  cuda::DeviceGuard guard(dst.device().index);
  dispatch(dst.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v = value.kind() == Scalar::Kind::Float ? convert<T>(value.to_double()) : convert<T>(value.to_int());
    cuda_launch::check_launch(ck::fill(loop, cuda_launch::stream_for(dst), static_cast<T*>(dst.data()), v), "fill");
  });
}

}  // namespace

namespace detail {
void register_cuda_copy_kernels(KernelTable& table) {
  table.set(OpId::copy, DeviceType::CUDA, kAllDTypes, cuda_copy);
  table.set(OpId::fill, DeviceType::CUDA, kAllDTypes, cuda_fill);
}
}  // namespace detail

}  // namespace strata
