// CUDA device discovery, properties, the current device and DeviceGuard.
#include <strata/core/cuda.hpp>

#include "core/cuda/capture.h"
#include "core/cuda/check.h"
#include "core/cuda/internal.h"

namespace strata::cuda {

int device_count() {
  // Cached: the set of visible devices is fixed for the life of the process.
  static const int n = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no device" error: no GPU is not a failure here
      return 0;
    }
    return count;
  }();
  return n;
}

bool is_available() { return device_count() > 0; }

int resolve_device(int device, const char* op) {
  int n = device_count();
  STRATA_CHECK(n > 0, "[{}] no CUDA device is visible", op);
  if (device < 0) device = current_device();
  STRATA_CHECK(device < n, "[{}] device cuda:{} is not available: {} CUDA device(s) visible", op, device, n);
  STRATA_CHECK(device < kMaxDevices, "[{}] device cuda:{}: a process addresses at most {} CUDA devices", op, device,
               kMaxDevices);
  return device;
}

int current_device() {
  int d = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&d), "current_device");
  return d;
}

void set_device(int device) {
  device = resolve_device(device, "set_device");
  STRATA_CUDA_CHECK(cudaSetDevice(device), "set_device");
}

void synchronize(int device) {
  device = resolve_device(device, "synchronize");
  STRATA_CHECK(!capture_underway(device), "[synchronize] cannot wait for cuda:{} while a CUDA graph is being "
               "captured on it: synchronize before the capture or after capture_end", device);
  DeviceGuard guard(device);
  STRATA_CUDA_CHECK(cudaDeviceSynchronize(), "synchronize");
}

DeviceProperties get_device_properties(int device) {
  device = resolve_device(device, "get_device_properties");
  cudaDeviceProp p{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&p, device), "get_device_properties");
  DeviceProperties out;
  out.name = p.name;
  out.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  out.multiprocessor_count = p.multiProcessorCount;
  out.major = p.major;
  out.minor = p.minor;
  out.shared_memory_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  return out;
}

DeviceGuard::DeviceGuard(int device) {
  device = resolve_device(device, "DeviceGuard");
  STRATA_CUDA_CHECK(cudaGetDevice(&previous_), "DeviceGuard");
  if (previous_ != device) STRATA_CUDA_CHECK(cudaSetDevice(device), "DeviceGuard");
}

DeviceGuard::~DeviceGuard() {
  // A destructor cannot raise; a failure to switch back is reported, not swallowed.
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now == previous_) return;
  STRATA_CUDA_WARN(cudaSetDevice(previous_), "DeviceGuard");
}

}  // namespace strata::cuda
