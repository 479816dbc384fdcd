// Helpers shared by the CUDA runtime files (device.cpp, stream.cpp, runtime.cpp).
#pragma once

namespace strata::cuda {

/// Device indices beyond this are refused (thread-local per-device state is a fixed array).
inline constexpr int kMaxDevices = 64;

/// `device` itself, or the current device for -1; raises Error ("[op] ...") when no such
/// device is visible.
int resolve_device(int device, const char* op);

}  // namespace strata::cuda

namespace strata {
class Allocator;
namespace cuda {
/// The caching allocator of `device` (a valid index).
Allocator& device_allocator(int device);
/// Frees the pinned host buffers the cache holds (runtime.cpp).
void empty_pinned_cache();
}  // namespace cuda
}  // namespace strata
