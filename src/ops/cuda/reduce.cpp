// CUDA launchers of the reductions (src/ops/reduce.cpp, src/ops/reduce_stats.cpp): the same
// ReducePlan as the CPU kernels (detail::make_reduce_plan: any dims, strides, keepdim), dtype
// dispatch, and a launch on the output's device and current stream, with scratch memory from
// the caching allocator. Kernels: kernels/cuda/reduce_*.cu through kernels/cuda/reduce.cuh.
#include <strata/ops/reduce.hpp>

#include "core/registry_internal.h"
#include "kernels/cuda/reduce_ops.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/scratch.h"
#include "ops/dispatch.h"
#include "ops/reduce_plan.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

// What every reduction launch needs besides its pointers.
struct Target {
  const ReducePlan& plan;
  cudaStream_t stream;
  const ck::Scratch& scratch;
};

// Plans the reduction of inputs[0] into outputs[0] and calls launch(type_tag<T>, Target) for
// x's dtype T, raising an Error naming `op` when the launch fails.
template <DTypeSet Set, class Launch>
void run(const KernelCall& call, std::string_view op, Launch launch) {
  const Tensor& x = call.inputs[0];
  const Tensor& out = call.outputs[0];
  STRATA_CHECK(x.device() == out.device(), "[{}] expected input and output on one CUDA device, got {} and {}", op,
               x.device(), out.device());
  const ReducePlan plan = detail::make_reduce_plan(x, out, call.param<ReduceParams>().dims, op);
  cuda::DeviceGuard guard(out.device().index);
  cuda_launch::DeviceScratch pool(out.device());
  const ck::Scratch scratch = pool.handle();
  const Target target{plan, cuda_launch::stream_for(out), scratch};
  dispatch<Set>(x.dtype(), op, [&](auto tag) { cuda_launch::check_launch(launch(tag, target), op); });
}

template <class T> const T* in_ptr(const KernelCall& call) { return static_cast<const T*>(call.inputs[0].data()); }

template <class T> T* out_ptr(const KernelCall& call, std::string_view op) {
  const Tensor& out = call.outputs[0];
  STRATA_CHECK(out.dtype() == dtype_of_v<T>, "[{}] output dtype {} should be {}", op, out.dtype(), dtype_of_v<T>);
  return static_cast<T*>(out.data());
}

void cuda_sum(const KernelCall& call) {
  run<DTypeSet::All>(call, "sum", [&](auto tag, const Target& t) {
    using T = typename decltype(tag)::type;
    return ck::sum<T>(t.plan, t.stream, out_ptr<ck::fold_out_t<T>>(call, "sum"), in_ptr<T>(call), t.scratch);
  });
}

void cuda_mean(const KernelCall& call) {
  run<DTypeSet::Floating>(call, "mean", [&](auto tag, const Target& t) {
    using T = typename decltype(tag)::type;
    return ck::mean<T>(t.plan, t.stream, out_ptr<T>(call, "mean"), in_ptr<T>(call), t.scratch);
  });
}

void cuda_prod(const KernelCall& call) {
  run<DTypeSet::All>(call, "prod", [&](auto tag, const Target& t) {
    using T = typename decltype(tag)::type;
    return ck::prod<T>(t.plan, t.stream, out_ptr<ck::fold_out_t<T>>(call, "prod"), in_ptr<T>(call), t.scratch);
  });
}

template <bool IsMax>
void cuda_extreme(const KernelCall& call) {
  const char* op = IsMax ? "amax" : "amin";
  run<DTypeSet::All>(call, op, [&](auto tag, const Target& t) {
    using T = typename decltype(tag)::type;
    if constexpr (IsMax) return ck::amax<T>(t.plan, t.stream, out_ptr<T>(call, op), in_ptr<T>(call), t.scratch);
    else return ck::amin<T>(t.plan, t.stream, out_ptr<T>(call, op), in_ptr<T>(call), t.scratch);
  });
}

// outputs: int64 indices, and optionally the values (same shape and strides).
template <bool IsMax>
void cuda_arg(const KernelCall& call) {
  const char* op = IsMax ? "argmax" : "argmin";
  const Tensor& x = call.inputs[0];
  const Tensor* vals = call.outputs.size() > 1 ? &call.outputs[1] : nullptr;
  STRATA_CHECK(!vals || (vals->dtype() == x.dtype() && vals->strides() == call.outputs[0].strides() &&
                         vals->device() == x.device()),
               "[{}] values must be {} on {} and laid out like the indices", op, x.dtype(), x.device());
  run<DTypeSet::All>(call, op, [&](auto tag, const Target& t) {
    using T = typename decltype(tag)::type;
    STRATA_CHECK(t.plan.nred <= 1, "[{}] the reduced dims must form one dim in memory", op);
    int64_t* idx = out_ptr<int64_t>(call, op);
    T* v = vals ? static_cast<T*>(vals->data()) : nullptr;
    if constexpr (IsMax) return ck::argmax<T>(t.plan, t.stream, idx, v, in_ptr<T>(call), t.scratch);
    else return ck::argmin<T>(t.plan, t.stream, idx, v, in_ptr<T>(call), t.scratch);
  });
}

void cuda_var(const KernelCall& call) {
  const auto& p = call.param<ReduceParams>();
  run<DTypeSet::Floating>(call, "var", [&](auto tag, const Target& t) {
    using T = typename decltype(tag)::type;
    return ck::var<T>(t.plan, t.stream, out_ptr<T>(call, "var"), in_ptr<T>(call), p.correction, p.take_sqrt,
                      t.scratch);
  });
}

void cuda_logsumexp(const KernelCall& call) {
  run<DTypeSet::Floating>(call, "logsumexp", [&](auto tag, const Target& t) {
    using T = typename decltype(tag)::type;
    return ck::logsumexp<T>(t.plan, t.stream, out_ptr<T>(call, "logsumexp"), in_ptr<T>(call), t.scratch);
  });
}

void cuda_norm(const KernelCall& call) {
  const double p = call.param<ReduceParams>().p;
  run<DTypeSet::Floating>(call, "norm", [&](auto tag, const Target& t) {
    using T = typename decltype(tag)::type;
    return ck::norm<T>(t.plan, t.stream, out_ptr<T>(call, "norm"), in_ptr<T>(call), p, t.scratch);
  });
}

}  // namespace

namespace detail {
void register_cuda_reduce_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::sum, CUDA, kAllDTypes, cuda_sum);
  table.set(OpId::mean, CUDA, kFloatDTypes, cuda_mean);
  table.set(OpId::prod, CUDA, kAllDTypes, cuda_prod);
  table.set(OpId::amax, CUDA, kAllDTypes, cuda_extreme<true>);
  table.set(OpId::amin, CUDA, kAllDTypes, cuda_extreme<false>);
  table.set(OpId::argmax, CUDA, kAllDTypes, cuda_arg<true>);
  table.set(OpId::argmin, CUDA, kAllDTypes, cuda_arg<false>);
  table.set(OpId::var, CUDA, kFloatDTypes, cuda_var);
  table.set(OpId::logsumexp, CUDA, kFloatDTypes, cuda_logsumexp);
  table.set(OpId::norm, CUDA, kFloatDTypes, cuda_norm);
}
}  // namespace detail

}  // namespace strata
