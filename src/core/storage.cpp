// Storage: device memory owned through an allocator, or user memory with a deleter.
#include <strata/core/storage.hpp>

#include "core/backend.h"
#include "core/storage_trace.h"

namespace strata {

namespace detail {
namespace {
std::atomic<bool> g_trace_storage{false};
}  // namespace
StorageTrace& storage_trace() {
  thread_local StorageTrace trace;
  return trace;
}
void set_storage_trace_enabled(bool enabled) { g_trace_storage.store(enabled, std::memory_order_relaxed); }
}  // namespace detail

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device, Allocator* allocator) {
  Allocator& a = allocator ? *allocator : backend::allocator_for(device);
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = a.allocate(nbytes);
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->allocator_ = &a;
  s->pinned_ = allocator == &pinned_allocator() && pinned_memory_is_page_locked();
  if (detail::g_trace_storage.load(std::memory_order_relaxed)) {
    detail::StorageTrace& t = detail::storage_trace();
    t.allocated_bytes += static_cast<int64_t>(nbytes);
    // a storage freed while the trace was off left its entry: this one may have its address
    t.take_recent(s.get());
    t.recent[t.next] = s.get();
    t.recent_bytes[t.next] = static_cast<int64_t>(nbytes);
    t.next = (t.next + 1) % detail::StorageTrace::kRecent;
  }
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter) {
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->deleter_ = std::move(deleter);
  return s;
}

Storage::~Storage() {
  if (allocator_) {
    if (detail::g_trace_storage.load(std::memory_order_relaxed)) {
      detail::StorageTrace& t = detail::storage_trace();
      t.freed_bytes += static_cast<int64_t>(nbytes_);
      t.take_recent(this);  // its address may come back for a new storage
    }
    allocator_->deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace strata
