// Tensor accessors, and the checked construction of tensors and views (the view ops
// themselves, with their backward, are in src/ops/view.cpp).
#include <algorithm>
#include <numeric>

#include <strata/core/tensor.hpp>

#include "core/tensor_internal.h"

namespace strata {

namespace detail {

void check_in_bounds(const Storage& storage, const Shape& shape, const Strides& strides, int64_t offset, DType dtype,
                     std::string_view op) {
  STRATA_CHECK(shape.size() == strides.size(), "[{}] shape {} and strides {} differ in length", op, shape, strides);
  STRATA_CHECK(offset >= 0, "[{}] negative storage offset {}", op, offset);
  int64_t numel = checked_numel(shape, op);
  if (numel == 0) return;
  int64_t last = offset;  // largest element index the view touches
  for (size_t d = 0; d < shape.size(); ++d) {
    STRATA_CHECK(strides[d] >= 0, "[{}] negative stride {} in strides {}", op, strides[d], strides);
    STRATA_CHECK(strides[d] == 0 || shape[d] - 1 <= (INT64_MAX - last) / strides[d],
                 "[{}] view of shape {} and strides {} overflows int64", op, shape, strides);
    last += (shape[d] - 1) * strides[d];
  }
  int64_t capacity = static_cast<int64_t>(storage.nbytes() / itemsize(dtype));
  STRATA_CHECK(last < capacity, "[{}] view of shape {}, strides {}, offset {} reaches element {} past the end of its "
               "storage of {} elements", op, shape, strides, offset, last, capacity);
}

Tensor make_view(const Tensor& base, Shape shape, Strides strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

Tensor make_tensor(const Shape& shape, DType dtype, Device device, Allocator* allocator) {
  int64_t n = checked_numel(shape, "empty");
  STRATA_CHECK(static_cast<uint64_t>(n) <= SIZE_MAX / itemsize(dtype), "[empty] shape {} of {} is too large", shape,
               dtype);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = Storage::allocate(static_cast<size_t>(n) * itemsize(dtype), device, allocator);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace detail

using detail::make_view;

int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[normalize_dim(d, dim(), "stride")]; }

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape()) n *= s;  // checked when the tensor was made
  return n;
}

void* Tensor::data() const {
  return static_cast<char*>(storage()->data()) + storage_offset() * static_cast<int64_t>(itemsize());
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t d = dim() - 1; d >= 0; --d) {
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return numel() == 0;
    expected *= shape()[d];
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Contiguous) return is_contiguous();
  if (dim() != 4) return false;
  // NHWC: C fastest, then W, then H, then N
  static constexpr int order[4] = {1, 3, 2, 0};
  int64_t expected = 1;
  for (int d : order) {
    if (shape()[d] != 1 && strides()[d] != expected) return numel() == 0;
    expected *= shape()[d];
  }
  return true;
}

void Tensor::set_data(const Tensor& other) const {
  STRATA_CHECK(other.defined(), "[set_data] source tensor is undefined");
  TensorImpl& dst = impl();
  const TensorImpl& src = other.impl();
  dst.storage = src.storage;
  dst.shape = src.shape;
  dst.strides = src.strides;
  dst.offset = src.offset;
  dst.dtype = src.dtype;
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), storage_offset()); }

}  // namespace strata
