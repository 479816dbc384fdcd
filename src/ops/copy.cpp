// copy_ (with broadcast, dtype conversion and device transfer), fill_, and the conversions
// built on them: to(), contiguous(), clone(), item(), pin_memory().
#include <cstring>

#include <strata/autograd/graph.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/unary.hpp>

#include "autograd/inplace.h"
#include "autograd/views.h"
#include "core/backend.h"
#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/convert.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/transpose.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

// inputs[0] -> outputs[0]; same shape after broadcast, any two dtypes.
void cpu_copy(const KernelCall& call) {
  const Tensor& src = call.inputs[0];
  Tensor& dst = call.outputs[0];
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() && src.shape() == dst.shape()) {
    char* d = static_cast<char*>(dst.data());
    const char* s = static_cast<const char*>(src.data());
    cpu::parallel_for(0, static_cast<int64_t>(dst.nbytes()), int64_t(1) << 20,
                      [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, static_cast<size_t>(e - b)); });
    return;
  }
  auto loop = make_loop<2>(dst, {&src}, "copy");
  dispatch(src.dtype(), "copy", [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    dispatch(dst.dtype(), "copy", [&](auto out_tag) {
      using Out = typename decltype(out_tag)::type;
      auto f = [](In x) { return convert<Out>(x); };
      Out* out = static_cast<Out*>(dst.data());
      const In* in = static_cast<const In*>(src.data());
      if (!cpu::transpose_copy(loop, out, in, f)) cpu::elementwise(loop, out, f, in);
    });
  });
}

void cpu_fill(const KernelCall& call) {
  Tensor& dst = call.outputs[0];
  const Scalar& value = call.param<FillParams>().value;
  auto loop = make_loop<1>(dst, {}, "fill");
  dispatch(dst.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v = value.kind() == Scalar::Kind::Float ? convert<T>(value.to_double()) : convert<T>(value.to_int());
    cpu::elementwise(loop, static_cast<T*>(dst.data()), [v]() { return v; });
  });
}

// Writes src (already of dst's dtype and shape, maybe on another device) into dst.
void copy_across_devices(Tensor& dst, const Tensor& src, bool non_blocking) {
  // both dense in one layout (contiguous, or channels-last with the same strides, as a copy
  // of a channels-last tensor to another device is): the bytes move as they are
  const bool same_dense_layout =
      (dst.is_contiguous() && src.is_contiguous()) ||
      (dst.strides() == src.strides() && src.is_contiguous(MemoryFormat::ChannelsLast));
  if (same_dense_layout && dst.dtype() == src.dtype() && dst.shape() == src.shape()) {
    backend::copy_bytes(dst.data(), dst.device(), src.data(), src.device(), dst.nbytes(), non_blocking);
    return;
  }
  // stage through a contiguous tensor on the destination device, then copy locally
  Tensor staged = detail::make_tensor(src.shape(), src.dtype(), dst.device());
  Tensor csrc = src.contiguous();
  backend::copy_bytes(staged.data(), staged.device(), csrc.data(), csrc.device(), staged.nbytes(), false);
  dst.copy_(staged);
}

}  // namespace

namespace detail {
void register_copy_kernels(KernelTable& table) {
  table.set(OpId::copy, DeviceType::CPU, kAllDTypes, cpu_copy);
  table.set(OpId::fill, DeviceType::CPU, kAllDTypes, cpu_fill);
}
}  // namespace detail

// The copy functions below are differentiable as the identity: the engine converts the
// gradient back to the source's dtype and device.
Tensor recorded_copy(const char* name, const Tensor& src, Tensor out) {
  autograd::record(name, {src}, {out}, {}, [](const autograd::Grads& g, const autograd::Saved&) {
    return autograd::Grads{g[0]};
  });
  return out;
}

const Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) const {
  STRATA_CHECK(src.defined(), "[copy_] source tensor is undefined");
  Shape b = broadcast_shapes(shape(), src.shape(), "copy_");
  STRATA_CHECK(b == shape(), "[copy_] source of shape {} does not broadcast to destination shape {}", src.shape(),
               shape());
  detail::check_writable(*this, "copy_");
  Tensor self = *this;  // another handle on the same tensor, for the functions that take Tensor&
  if (autograd::detail::inplace_records(self, {&src})) {  // Note [In-place under autograd]
    autograd::record_inplace(self, "copy_", false, [&](const Tensor& old) {
      Tensor out = empty_like(old);
      {
        NoGradGuard no_grad;
        out.copy_(src, non_blocking);
      }
      // the old value gets no gradient; src gets self's, summed over broadcast dims
      autograd::record("copy_", {old, src}, {out}, {}, [](const autograd::Grads& g, const autograd::Saved&) {
        return autograd::Grads{Tensor(), g[0]};
      });
      return out;
    });
    return *this;
  }
  if (numel() == 0) return *this;
  if (detail::same_view(src, *this)) return *this;  // a memcpy of a block onto itself is undefined
  if (src.device() != device()) {
    Tensor s = src.expand(shape()).contiguous();
    copy_across_devices(self, s, non_blocking);
  } else {
    Tensor out = *this;
    const Tensor in = detail::unaliased(src, *this);
    run_kernel(OpId::copy, src.dtype(), KernelCall{{&in, 1}, {&out, 1}});
  }
  storage()->bump_version();
  return *this;
}

namespace {
void run_fill(Tensor& t, Scalar value) {
  FillParams p{value};
  Tensor out = t;
  if (t.numel() > 0) run_kernel(OpId::fill, t.dtype(), KernelCall{{}, {&out, 1}, &p});
  t.storage()->bump_version();
}
}  // namespace

const Tensor& Tensor::fill_(Scalar value) const {
  detail::check_fill_value(value, dtype(), "fill_");
  detail::check_writable(*this, "fill_");
  Tensor self = *this;
  if (autograd::detail::inplace_records(self))  // Note [In-place under autograd]
    autograd::detail::record_overwrite(self, "fill_", [&](Tensor& out) { run_fill(out, value); });
  else
    run_fill(self, value);
  return *this;
}

Tensor detail::scalar_operand(Scalar value, DType t, Device device) {
  Tensor out = detail::make_tensor({}, t, device);
  run_fill(out, value);
  return out;
}

namespace {
// A copy of x in a new tensor of dtype t on device d, laid out in `format`.
Tensor copied(const Tensor& x, const char* op, DType t, Device d, MemoryFormat format) {
  Tensor out = detail::make_tensor_as(x.shape(), t, d, format);
  {
    NoGradGuard no_grad;
    out.copy_(x);
  }
  return recorded_copy(op, x, out);
}
}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return copied(*this, "clone", dtype(), device(), MemoryFormat::Contiguous);
}

// As PyTorch's default preserve_format, a channels-last tensor's copies stay channels-last.
Tensor Tensor::clone() const { return copied(*this, "clone", dtype(), device(), detail::suggested_format(*this)); }

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  return copied(*this, "to", t, device(), detail::suggested_format(*this));
}

Tensor Tensor::to(Device d, bool non_blocking) const { return to(d, dtype(), non_blocking); }

Tensor Tensor::to(Device d, DType t, bool non_blocking) const {
  if (d == device() && t == dtype()) return *this;
  backend::check_device(d, "to");
  Tensor out = detail::make_tensor_as(shape(), t, d, detail::suggested_format(*this));
  {
    NoGradGuard no_grad;
    // convert on the source side, then move the bytes
    out.copy_(d != device() && t != dtype() ? to(t) : *this, non_blocking);
  }
  return recorded_copy("to", *this, out);
}

Tensor Tensor::to(MemoryFormat format) const {
  if (format == MemoryFormat::Contiguous) return contiguous();
  if (is_contiguous(format)) return *this;
  STRATA_CHECK(dim() == 4, "[to] channels-last needs a 4-d tensor, got shape {}", shape());
  return copied(*this, "to", dtype(), device(), format);
}

Tensor Tensor::pin_memory() const {
  STRATA_CHECK(device().is_cpu(), "[pin_memory] expects a CPU tensor, got one on {}", device());
  Tensor out = detail::make_tensor(shape(), dtype(), kCPU, &pinned_allocator());
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  return recorded_copy("pin_memory", *this, out);  // differentiable, as clone
}

Scalar Tensor::item_scalar() const {
  STRATA_CHECK(numel() == 1, "[item] expects a tensor of one element, got shape {}", shape());
  Tensor t = device().is_cpu() ? *this : to(kCPU);
  return dispatch(t.dtype(), "item", [&](auto tag) -> Scalar {
    using T = typename decltype(tag)::type;
    T v = *static_cast<const T*>(t.data());
    if constexpr (std::is_same_v<T, bool>) return Scalar(v);
    else if constexpr (std::is_integral_v<T>) return Scalar(static_cast<int64_t>(v));
    else return Scalar(static_cast<double>(static_cast<compute_t<T>>(v)));
  });
}

Tensor cast(const Tensor& x, DType dtype) { return x.to(dtype); }

}  // namespace strata
