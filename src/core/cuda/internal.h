// Helpers shared by the CUDA runtime files (device.cpp, stream.cpp, runtime.cpp).
#pragma once

#include <cstdint>

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
/// The event operations both caches (device blocks, pinned buffers) use to hold a freed
/// buffer back until a stream has passed it (stream.cpp); errors name `op`.
/// record_free_event never raises: nullptr means it could not record and waited for the stream.
void* record_free_event(int device, uintptr_t stream, const char* op) noexcept;
bool free_event_done(void* event, const char* op);
void synchronize_free_event(void* event, const char* op);
void release_free_event(void* event, const char* op);
}  // namespace cuda
}  // namespace strata

namespace strata::cuda {
/// The graph pools of the caching allocator of `device` (Note [Graph pools] in
/// src/core/block_pool.h): allocations of capture `capture` go to pool `pool` until
/// end_graph_allocations; release_graph_pool drops the hold a capture took.
void begin_graph_allocations(int device, uint64_t capture, uint64_t pool);
void end_graph_allocations(int device, uint64_t capture);
void release_graph_pool(int device, uint64_t pool);
}  // namespace strata::cuda
