// Storage: device memory owned through an allocator, or user memory with a deleter.
#include <strata/core/storage.hpp>

#include "core/backend.h"

namespace strata {

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device, Allocator* allocator) {
  Allocator& a = allocator ? *allocator : backend::allocator_for(device);
  std::shared_ptr<Storage> s(new Storage());
  s->data_ = a.allocate(nbytes);
  s->nbytes_ = nbytes;
  s->device_ = device;
  s->allocator_ = &a;
  s->pinned_ = allocator == &pinned_allocator() && pinned_memory_is_page_locked();
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
    allocator_->deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace strata
