// A block of memory on one device shared by a tensor and all of its views. It carries the
// version counter that autograd uses to detect in-place writes to saved tensors.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include <strata/core/allocator.hpp>
#include <strata/core/device.hpp>
#include <strata/core/export.hpp>

namespace strata {

class STRATA_API Storage {
 public:
  /// Allocates `nbytes` from `allocator` (the device's default allocator when null).
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device, Allocator* allocator = nullptr);
  /// Wraps memory strata does not own; `deleter` (may be empty) runs when the last view dies.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Device device,
                                       std::function<void(void*)> deleter);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  /// True when the memory came from the pinned-host allocator.
  bool is_pinned() const { return pinned_; }

  int64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;  // owner of data_, or null for wrapped memory
  std::function<void(void*)> deleter_;
  bool pinned_ = false;
  std::atomic<int64_t> version_{0};
};

}  // namespace strata
