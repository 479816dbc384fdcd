// CUDA launcher of dropout (src/nn/dropout.cpp): contiguous input and outputs, the same
// Philox seed and offset as the CPU kernel, so the mask matches the CPU's bit for bit.
// Kernel: kernels/cuda/dropout.cu.
#include <strata/nn/functional.hpp>

#include "core/registry_internal.h"
#include "kernels/cuda/index_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

// inputs (x contiguous); outputs (y, mask) contiguous of x's shape and dtype.
void cuda_dropout(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  Tensor& mask = call.outputs[1];
  const auto& p = call.param<nn::DropoutParams>();
  STRATA_CHECK(x.is_contiguous() && y.is_contiguous() && mask.is_contiguous(),
               "[dropout] expected contiguous input and outputs");
  cuda::DeviceGuard guard(x.device().index);
  const uint64_t* state = cuda_launch::philox_state(x, p.generator, static_cast<uint64_t>((x.numel() + 3) / 4),
                                                    "dropout");
  dispatch<DTypeSet::Floating>(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::dropout(x.numel(), cuda_launch::stream_for(x), static_cast<const T*>(x.data()),
                                          static_cast<T*>(y.data()), static_cast<T*>(mask.data()),
                                          static_cast<float>(p.p), 1.0 / (1.0 - p.p), p.seed, p.offset, state),
                              "dropout");
  });
}

}  // namespace

namespace detail {
void register_cuda_dropout_kernels(KernelTable& table) {
  table.set(OpId::dropout, DeviceType::CUDA, kFloatDTypes, cuda_dropout);
}
}  // namespace detail

}  // namespace strata
