// Temporary device memory for the kernel entry points that take a cuda_kernels::Scratch
// (kernels/cuda/index_ops.h): each block is a uint8 tensor from the caching allocator on the
// current stream, held until this object goes out of scope. Work queued on that stream
// before then may still use it; the allocator's stream order makes that safe.
#pragma once

#include <algorithm>
#include <vector>

#include <strata/ops/creation.hpp>

#include "kernels/cuda/index_ops.h"

namespace strata::cuda_launch {

class DeviceScratch {
 public:
  explicit DeviceScratch(Device device) : device_(device) {}
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  cuda_kernels::Scratch handle() { return {&DeviceScratch::alloc, this}; }

 private:
  static void* alloc(void* ctx, size_t bytes) {
    auto* self = static_cast<DeviceScratch*>(ctx);
    const auto n = static_cast<int64_t>(std::max<size_t>(bytes, 1));
    self->blocks_.push_back(empty({n}, TensorOptions(kUInt8, self->device_)));
    return self->blocks_.back().data();
  }

  Device device_;
  std::vector<Tensor> blocks_;
};

}  // namespace strata::cuda_launch
