// The device backend of a build without CUDA: only the CPU exists, and naming a GPU raises
// an Error that says which build option turns it on.
#include <cstring>

#include <strata/core/error.hpp>

#include "core/backend.h"

namespace strata {

namespace cuda {
bool is_available() { return false; }
int device_count() { return 0; }
}  // namespace cuda

Allocator& pinned_allocator() { return cpu_allocator(); }
bool pinned_memory_is_page_locked() { return false; }

namespace backend {

void check_device(Device device, const char* op) {
  STRATA_CHECK(device.is_cpu(), "[{}] device {} is not available: strata was built without CUDA "
               "(reconfigure with -DSTRATA_WITH_CUDA=ON)", op, device);
}

Allocator& allocator_for(Device device) {
  check_device(device, "allocate");
  return cpu_allocator();
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes, bool) {
  check_device(dst_device, "copy");
  check_device(src_device, "copy");
  if (nbytes) std::memcpy(dst, src, nbytes);
}

}  // namespace backend
}  // namespace strata
