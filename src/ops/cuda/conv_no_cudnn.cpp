// A CUDA build without cuDNN (libcudnn was not found when configuring): convolutions on a
// GPU raise an Error naming the missing library, and the benchmark-mode switch of
// <strata/core/cuda.hpp> is a plain setting (deterministic mode still governs scatter_add and
// index_add). Pooling and batch norm do not need cuDNN and are registered as usual.
#include <atomic>

#include <strata/core/cuda.hpp>
#include <strata/core/error.hpp>

#include "core/registry_internal.h"

namespace strata {

namespace {

template <const char* Op>
void no_cudnn(const KernelCall&) {
  strata::detail::throw_error(
      "[{}] strata was built without cuDNN, which convolutions on CUDA need: libcudnn was not found in the CUDA "
      "toolkit's library folders when configuring (install cuDNN 9 there and reconfigure)",
      Op);
}

constexpr char kConv2d[] = "conv2d";
constexpr char kConv2dBackwardInput[] = "conv2d_backward_input";
constexpr char kConv2dBackwardWeight[] = "conv2d_backward_weight";
constexpr char kConv3d[] = "conv3d";
constexpr char kConv3dBackwardInput[] = "conv3d_backward_input";
constexpr char kConv3dBackwardWeight[] = "conv3d_backward_weight";

std::atomic<bool> g_benchmark{false}, g_deterministic{false};

}  // namespace

namespace detail {
void register_cuda_conv_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::conv2d, CUDA, kFloatDTypes, no_cudnn<kConv2d>);
  table.set(OpId::conv2d_backward_input, CUDA, kFloatDTypes, no_cudnn<kConv2dBackwardInput>);
  table.set(OpId::conv2d_backward_weight, CUDA, kFloatDTypes, no_cudnn<kConv2dBackwardWeight>);
  table.set(OpId::conv3d, CUDA, kFloatDTypes, no_cudnn<kConv3d>);
  table.set(OpId::conv3d_backward_input, CUDA, kFloatDTypes, no_cudnn<kConv3dBackwardInput>);
  table.set(OpId::conv3d_backward_weight, CUDA, kFloatDTypes, no_cudnn<kConv3dBackwardWeight>);
}
}  // namespace detail

namespace cuda {
void set_benchmark_mode(bool on) { g_benchmark.store(on, std::memory_order_relaxed); }
bool benchmark_mode() { return g_benchmark.load(std::memory_order_relaxed); }
void set_deterministic(bool on) { g_deterministic.store(on, std::memory_order_relaxed); }
bool deterministic() { return g_deterministic.load(std::memory_order_relaxed); }
ConvAlgorithmCacheStats conv_algorithm_cache_stats() { return {}; }
}  // namespace cuda

}  // namespace strata
