// Tensor accessors, and the checked construction of tensors and views (the view ops
// themselves, with their backward, are in src/ops/view.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
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

MemoryFormat suggested_format(const Tensor& t) {
  if (t.dim() != 4 || t.is_contiguous()) return MemoryFormat::Contiguous;
  if (t.is_contiguous(MemoryFormat::ChannelsLast)) return MemoryFormat::ChannelsLast;
  // not dense: channels-last when the channel stride is the smallest (a slice of one)
  const int64_t c = t.stride(1);
  bool smallest = t.size(1) > 1;
  for (int64_t d : {2, 3})
    if (t.size(d) > 1 && t.stride(d) <= c) smallest = false;
  return smallest ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

Tensor make_tensor_as(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  if (format == MemoryFormat::Contiguous) return make_tensor(shape, dtype, device);
  STRATA_CHECK(shape.size() == 4, "[empty] channels-last needs a 4-d shape, got {}", shape);
  return make_tensor({shape[0], shape[2], shape[3], shape[1]}, dtype, device).permute({0, 3, 1, 2});
}

}  // namespace detail

namespace detail {

std::pair<int64_t, int64_t> integer_range(DType t) {
  switch (t) {
    case DType::Bool: return {0, 1};
    case DType::UInt8: return {0, 255};
    case DType::Int8: return {-128, 127};
    case DType::Int32: return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    default: return {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  }
}

namespace {
// The bytes [first, last] a tensor's elements span in its storage.
std::pair<int64_t, int64_t> byte_span(const Tensor& t) {
  int64_t lo = t.storage_offset(), hi = lo;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = t.stride(d) * (t.size(d) - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  const auto item = static_cast<int64_t>(itemsize(t.dtype()));
  return {lo * item, hi * item + item - 1};
}
}  // namespace

bool same_view(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.dtype() == b.dtype() && a.storage_offset() == b.storage_offset() &&
         a.shape() == b.shape() && a.strides() == b.strides();
}

Tensor unaliased(const Tensor& src, const Tensor& dst) {
  if (src.storage() != dst.storage() || src.numel() == 0 || dst.numel() == 0) return src;
  if (same_view(src, dst)) return src;  // each element is read just before it is written
  const auto [a0, a1] = byte_span(src);
  const auto [b0, b1] = byte_span(dst);
  if (a1 < b0 || b1 < a0) return src;  // disjoint parts of one storage
  return src.clone();
}

bool elements_share_memory(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.strides()[d] == 0 && t.shape()[d] > 1) return true;
  return false;
}

void check_writable(const Tensor& self, std::string_view op) {
  if (self.numel() <= 1) return;
  STRATA_CHECK(!elements_share_memory(self), "[{}] the destination of shape {} and strides {} has elements that "
               "share memory (an expanded view); clone it first", op, self.shape(), self.strides());
}

void check_scalar_fits(Scalar value, DType t, std::string_view op) {
  if (!is_integral(t)) return;
  const auto [lo, hi] = integer_range(t);
  if (value.is_floating()) {
    const double d = std::trunc(value.to_double());
    // 2^63 rounds up from int64's max as a double, so the upper test is strict
    const bool fits = std::isfinite(d) && d >= static_cast<double>(lo) &&
                      (t == DType::Int64 ? d < 9223372036854775808.0 : d <= static_cast<double>(hi));
    STRATA_CHECK(fits, "[{}] value {} cannot be converted to {} without overflow", op, value.to_double(), t);
  } else {
    const int64_t i = value.to_int();
    STRATA_CHECK(i >= lo && i <= hi, "[{}] value {} cannot be converted to {} without overflow", op, i, t);
  }
}

void check_fill_value(Scalar value, DType t, std::string_view op) {
  check_scalar_fits(value, t, op);
  if (!is_floating(t) || t == DType::Float64 || !value.is_floating()) return;
  const double v = value.to_double(), max = t == DType::Float16    ? 65504.0
                                            : t == DType::BFloat16 ? 3.3895313892515355e38
                                                                   : 3.4028234663852886e38;
  STRATA_CHECK(!std::isfinite(v) || std::fabs(v) <= max, "[{}] value {} cannot be converted to {} without overflow",
               op, v, t);
}

}  // namespace detail

using detail::make_view;

int64_t Tensor::size(int64_t d) const {
  STRATA_CHECK(dim() > 0, "[size] dim {} is out of range: the tensor is 0-d", d);
  return shape()[normalize_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  STRATA_CHECK(dim() > 0, "[stride] dim {} is out of range: the tensor is 0-d", d);
  return strides()[normalize_dim(d, dim(), "stride")];
}

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
  dst.view_base.reset();  // the memory is other's now: no longer a view of anything
  dst.view_base_without_grad.reset();
  dst.view_without_grad = false;
}

namespace detail {
bool is_dense(const Tensor& t) {
  if (t.is_contiguous()) return true;  // the common case, without sorting
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that step
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;
  for (auto [stride, size] : dims) {
    if (stride != span) return false;
    span *= size;
  }
  return true;
}
}  // namespace detail

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), storage_offset()); }

}  // namespace strata
