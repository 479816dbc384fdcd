// strata::Tensor: a strided view (shape, strides, offset, dtype) of a shared Storage. Copying
// a Tensor copies a handle; views share storage. Methods that compute are thin forwards to
// the free functions of include/strata/ops/.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include <strata/core/device.hpp>
#include <strata/core/dtype.hpp>
#include <strata/core/error.hpp>
#include <strata/core/export.hpp>
#include <strata/core/scalar.hpp>
#include <strata/core/shape.hpp>
#include <strata/core/storage.hpp>

namespace strata {

namespace autograd {
struct AutogradMeta;  // defined in include/strata/autograd/graph.hpp
class Node;
}

/// Memory layout of a 4-D tensor: NCHW (contiguous) or NHWC (channels last).
enum class MemoryFormat : uint8_t { Contiguous, ChannelsLast };

/// dtype and device of a new tensor. Converts from a DType or a Device alone.
struct TensorOptions {
  DType dtype_ = kFloat32;
  Device device_ = kCPU;
  bool requires_grad_ = false;

  TensorOptions() = default;
  TensorOptions(DType d) : dtype_(d) {}
  TensorOptions(Device d) : device_(d) {}
  TensorOptions(DType t, Device d) : dtype_(t), device_(d) {}
  TensorOptions dtype(DType t) const { auto o = *this; o.dtype_ = t; return o; }
  TensorOptions device(Device d) const { auto o = *this; o.device_ = d; return o; }
  TensorOptions requires_grad(bool r = true) const { auto o = *this; o.requires_grad_ = r; return o; }
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;
  int64_t offset = 0;  // in elements
  DType dtype = kFloat32;
  std::shared_ptr<autograd::AutogradMeta> autograd;  // null until autograd needs it
  // Views and in-place ops under autograd (Note [Views under autograd], src/autograd/views.cpp):
  // a view made by a view op keeps the tensor its memory belongs to (the first of a chain of
  // views), whose history an in-place write to the view rewrites; weakly when made with grad
  // mode off, so that it keeps no graph alive.
  std::shared_ptr<TensorImpl> view_base;
  std::weak_ptr<TensorImpl> view_base_without_grad;
  bool view_without_grad = false;  // view_base_without_grad was set
  // atomic: a view's history may be rebuilt while another thread asks for it
  std::atomic<uint64_t> history_version = 0;       // bumped when an in-place op replaces the history
  std::atomic<uint64_t> base_history_version = 0;  // a view's: view_base's history_version it is of
};

class STRATA_API Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  Tensor(const Tensor&) = default;
  Tensor(Tensor&&) noexcept = default;
  ~Tensor() = default;
  /// Assigning to a named tensor rebinds the handle: `y = x` makes y another handle on x.
  Tensor& operator=(const Tensor&) & = default;
  Tensor& operator=(Tensor&&) & noexcept = default;
  /// Assigning to a temporary writes its elements, as in LibTorch: `x[1] = y` is
  /// `x[1].copy_(y)` and `x.select(1, 0) = 0` is `fill_(0)`, under autograd too.
  Tensor& operator=(const Tensor& src) && {
    copy_(src);
    return *this;
  }
  Tensor& operator=(Tensor&& src) && {
    copy_(src);
    return *this;
  }
  Tensor& operator=(Scalar value) && {
    fill_(value);
    return *this;
  }

  // ---- what it is -----------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& sizes() const { return impl().shape; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;
  const Strides& strides() const { return impl().strides; }
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  bool is_cuda() const { return device().is_cuda(); }
  int64_t storage_offset() const { return impl().offset; }
  size_t itemsize() const { return strata::itemsize(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  bool is_contiguous() const;
  bool is_contiguous(MemoryFormat format) const;
  bool is_pinned() const { return impl().storage->is_pinned(); }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  TensorImpl& impl() const {
    STRATA_CHECK(impl_ != nullptr, "[tensor] use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// True when both handles are the same tensor object (not merely equal values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  /// Address of element 0 (storage data plus offset).
  void* data() const;
  /// Typed address of element 0; raises Error when T does not match dtype().
  template <class T> T* data_ptr() const {
    STRATA_CHECK(dtype_of_v<T> == dtype(), "[data_ptr] requested {} but the tensor is {}", dtype_of_v<T>, dtype());
    return static_cast<T*>(data());
  }
  /// The value of a one-element tensor, converted to T (copies from the GPU if needed).
  /// Raises Error when T cannot hold the value (NaN or 3e10 into int32_t, -1 into uint8_t).
  template <class T> T item() const {
    const Scalar s = item_scalar();
    STRATA_CHECK(s.fits<T>(), "[item] the value {} cannot be converted to a {}-bit {} without overflow",
                 s.to_double(), 8 * sizeof(T),
                 std::is_floating_point_v<T> ? "float" : std::is_signed_v<T> ? "signed integer" : "unsigned integer");
    return s.to<T>();
  }
  Scalar item_scalar() const;

  // ---- conversions ------------------------------------------------------------------------
  Tensor to(DType dtype) const;
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor to(Device device, DType dtype, bool non_blocking = false) const;
  Tensor to(MemoryFormat format) const;
  Tensor cpu() const { return to(kCPU); }
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  /// This tensor when already contiguous, else a contiguous copy.
  Tensor contiguous() const;
  Tensor clone() const;
  /// A copy in page-locked host memory (plain memory without CUDA or without a GPU).
  Tensor pin_memory() const;

  // ---- views (no copy) -------------------------------------------------------------------
  Tensor view(const Shape& shape) const;
  /// A view when the strides allow it, else a copy.
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(const Shape& shape) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unflatten(int64_t dim, const Shape& sizes) const;
  Tensor as_strided(const Shape& shape, const Strides& strides, std::optional<int64_t> offset = std::nullopt) const;
  Tensor detach() const;
  /// Makes this tensor (and every handle to it) refer to other's data, shape and dtype,
  /// keeping its autograd identity (requires_grad, hooks). Used to move parameters in place.
  void set_data(const Tensor& other) const;

  // ---- in place --------------------------------------------------------------------------
  // Under autograd (grad mode on, and this tensor, an operand or the tensor this one views
  // requires grad) an in-place op runs as its out-of-place op and this tensor takes over the
  // result's history, as in PyTorch: `h.add_(x)` in a forward is `h = h + x` for the gradient,
  // and a buffer joins the graph through copy_. A write through a view rewrites its base's history, and views of a
  // written tensor follow it (Note [Views under autograd]); a value saved for backward raises
  // there. Refused with strata::Error: a leaf that requires grad, or a view of one (update
  // parameters under NoGradGuard); a custom Function's output sharing its input's memory; a
  // tensor not dense in memory when views or its own history need rebuilding. Note [In-place
  // under autograd].
  //
  // In-place methods are const, as LibTorch's: a Tensor is a handle, and a write through a const
  // handle (a `const Tensor&` argument, `p.grad()`) changes the elements, never the handle.
  const Tensor& fill_(Scalar value) const;
  const Tensor& zero_() const { return fill_(0); }
  /// Copies `src` into this tensor, broadcasting and converting dtype and device.
  const Tensor& copy_(const Tensor& src, bool non_blocking = false) const;
  const Tensor& add_(const Tensor& other, Scalar alpha = 1) const;
  const Tensor& add_(Scalar other) const;
  const Tensor& sub_(const Tensor& other, Scalar alpha = 1) const;
  const Tensor& sub_(Scalar other) const;
  const Tensor& mul_(const Tensor& other) const;
  const Tensor& mul_(Scalar other) const;
  const Tensor& div_(const Tensor& other) const;
  const Tensor& div_(Scalar other) const;
  const Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max) const;
  const Tensor& relu_() const;
  const Tensor& masked_fill_(const Tensor& mask, Scalar value) const;
  const Tensor& operator+=(const Tensor& other) const { return add_(other); }
  const Tensor& operator+=(Scalar other) const { return add_(other); }
  const Tensor& operator-=(const Tensor& other) const { return sub_(other); }
  const Tensor& operator-=(Scalar other) const { return sub_(other); }
  const Tensor& operator*=(const Tensor& other) const { return mul_(other); }
  const Tensor& operator*=(Scalar other) const { return mul_(other); }
  const Tensor& operator/=(const Tensor& other) const { return div_(other); }
  const Tensor& operator/=(Scalar other) const { return div_(other); }

  // ---- reductions (include/strata/ops/reduce.hpp) ----------------------------------------
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false) const;

  // ---- elementwise (include/strata/ops/unary.hpp, binary.hpp) ----------------------------
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor abs() const;
  Tensor neg() const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor pow(Scalar exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor clamp(std::optional<Scalar> min, std::optional<Scalar> max) const;
  Tensor matmul(const Tensor& other) const;

  // ---- method forms of the ops (include/strata/ops/), as LibTorch's ----------------------
  Tensor add(const Tensor& other, Scalar alpha = 1) const;
  Tensor add(Scalar other) const;
  Tensor sub(const Tensor& other, Scalar alpha = 1) const;
  Tensor sub(Scalar other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(Scalar other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(Scalar other) const;
  Tensor square() const;
  Tensor masked_fill(const Tensor& mask, Scalar value) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor sum(int64_t dim, bool keepdim = false) const;
  Tensor mean(int64_t dim, bool keepdim = false) const;
  Tensor cumsum(int64_t dim) const;
  Tensor all() const;
  Tensor any() const;
  Tensor isnan() const;
  Tensor nonzero() const;
  Tensor masked_select(const Tensor& mask) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor flip(const std::vector<int64_t>& dims) const;
  Tensor repeat(const std::vector<int64_t>& repeats) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> unbind(int64_t dim = 0) const;
  Tensor view_as(const Tensor& other) const { return view(other.shape()); }
  TensorOptions options() const { return TensorOptions(dtype(), device()); }
  /// this += weight * (end - this), as an exponential moving average updates.
  const Tensor& lerp_(const Tensor& end, Scalar weight) const;

  // ---- autograd (include/strata/autograd/) ------------------------------------------------
  bool requires_grad() const;
  /// Marks a leaf as requiring grad (floating dtypes only).
  const Tensor& requires_grad_(bool requires_grad = true) const;
  const Tensor& set_requires_grad(bool requires_grad) const { return requires_grad_(requires_grad); }
  /// True for tensors not produced by a recorded op.
  bool is_leaf() const;
  /// The accumulated gradient; undefined until backward reaches this tensor.
  const Tensor& grad() const;
  /// Replaces the gradient (an undefined tensor clears it).
  void set_grad(const Tensor& grad) const;
  std::shared_ptr<autograd::Node> grad_fn() const;
  /// Backward from this tensor; `gradient` may be omitted for a one-element tensor.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false, bool create_graph = false) const;
  /// Keeps .grad for a non-leaf tensor too.
  void retain_grad() const;
  /// Runs `hook` on this tensor's gradient during backward; a defined return replaces it.
  void register_hook(std::function<Tensor(const Tensor&)> hook) const;
  /// Runs `hook` on a leaf right after its .grad has been accumulated.
  void register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;
  /// The storage's version counter (bumped by every in-place write).
  int64_t version() const { return storage()->version(); }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace strata
