// CUDA launchers of the factories with kernels (uniform, normal, randint, arange/linspace):
// the same parameters and Philox counters as the CPU kernels in src/ops/creation.cpp, whose
// callers hand every kernel a contiguous output. Kernels: kernels/cuda/creation.cu.
#include <strata/ops/creation.hpp>

#include "core/registry_internal.h"
#include "kernels/cuda/elementwise_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

template <DTypeSet Set, class Launch>
void launch_contiguous(Tensor& out, std::string_view op, Launch launch) {
  STRATA_CHECK(out.is_contiguous(), "[{}] expected a contiguous output", op);
  cuda::DeviceGuard guard(out.device().index);
  dispatch<Set>(out.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(launch(static_cast<T*>(out.data()), cuda_launch::stream_for(out)), op);
  });
}

void cuda_uniform(const KernelCall& call) {
  const auto& p = call.param<RandomParams>();
  const int64_t n = call.outputs[0].numel();
  const uint64_t* state = cuda_launch::philox_state(call.outputs[0], p.generator, p.blocks, "uniform");
  launch_contiguous<DTypeSet::Floating>(call.outputs[0], "uniform", [&](auto* out, cudaStream_t s) {
    return ck::uniform(n, s, out, p.seed, p.offset, p.a, p.b, state);
  });
}

void cuda_normal(const KernelCall& call) {
  const auto& p = call.param<RandomParams>();
  const int64_t n = call.outputs[0].numel();
  const uint64_t* state = cuda_launch::philox_state(call.outputs[0], p.generator, p.blocks, "normal");
  launch_contiguous<DTypeSet::Floating>(call.outputs[0], "normal", [&](auto* out, cudaStream_t s) {
    return ck::normal(n, s, out, p.seed, p.offset, p.a, p.b, state);
  });
}

void cuda_randint(const KernelCall& call) {
  const auto& p = call.param<RandomParams>();
  const int64_t n = call.outputs[0].numel();
  const uint64_t* state = cuda_launch::philox_state(call.outputs[0], p.generator, p.blocks, "randint");
  launch_contiguous<DTypeSet::Numeric>(call.outputs[0], "randint", [&](auto* out, cudaStream_t s) {
    return ck::randint(n, s, out, p.seed, p.offset, static_cast<int64_t>(p.a), static_cast<int64_t>(p.b), state);
  });
}

void cuda_arange(const KernelCall& call) {
  const auto& p = call.param<RangeParams>();
  const int64_t n = call.outputs[0].numel();
  launch_contiguous<DTypeSet::Numeric>(call.outputs[0], "arange", [&](auto* out, cudaStream_t s) {
    return ck::arange(n, s, out, p.start, p.step, p.is_linspace, p.end);
  });
}

}  // namespace

namespace detail {
void register_cuda_creation_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::uniform, CUDA, kFloatDTypes, cuda_uniform);
  table.set(OpId::normal, CUDA, kFloatDTypes, cuda_normal);
  table.set(OpId::randint, CUDA, kNumericDTypes, cuda_randint);
  table.set(OpId::arange, CUDA, kNumericDTypes, cuda_arange);
}
}  // namespace detail

}  // namespace strata
