// What core needs from a device backend: its allocator and raw byte copies between devices.
// src/core/no_cuda.cpp provides the CPU-only build; src/core/cuda/runtime.cpp the CUDA one.
#pragma once

#include <cstddef>

#include <strata/core/allocator.hpp>
#include <strata/core/device.hpp>

namespace strata::backend {

/// The default allocator for tensors on `device`; raises Error when the device is absent.
Allocator& allocator_for(Device device);
/// Copies `nbytes` between any two devices. Contiguous bytes only.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, bool non_blocking);
/// Raises Error when `device` cannot be used in this build or on this machine.
void check_device(Device device, const char* op);

}  // namespace strata::backend
