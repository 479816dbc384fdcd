// isclose, allclose and equal. allclose and equal read one bool result per element back on
// the host and reduce it there, so they work wherever isclose and eq have kernels.
#include <algorithm>

#include <strata/ops/binary.hpp>
#include <strata/ops/compare.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/compare_math.h"
#include "kernels/common/convert.h"
#include "kernels/cpu/elementwise.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

// inputs (a, b) of one dtype, outputs (bool, broadcast shape).
void cpu_isclose(const KernelCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& out = call.outputs[0];
  const auto& p = call.param<IsCloseParams>();
  const math::IsClose f{p.rtol, p.atol, p.equal_nan};
  auto loop = make_loop<3>(out, {&a, &b}, "isclose");
  dispatch(a.dtype(), "isclose", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::elementwise(
        loop, static_cast<bool*>(out.data()),
        [f](T x, T y) {
          if constexpr (std::is_integral_v<T>) return f.integers(x, y);
          else return f(convert<double>(x), convert<double>(y));
        },
        static_cast<const T*>(a.data()), static_cast<const T*>(b.data()));
  });
}

bool all_true(const Tensor& flags) {
  Tensor host = flags.to(kCPU).contiguous();
  const bool* p = static_cast<const bool*>(host.data());
  return std::all_of(p, p + host.numel(), [](bool v) { return v; });
}

void check_pair(const Tensor& a, const Tensor& b, std::string_view op) {
  STRATA_CHECK(a.defined() && b.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(a.device() == b.device(), "[{}] inputs are on different devices: {} and {}", op, a.device(),
               b.device());
}

}  // namespace

namespace detail {
void register_compare_kernels(KernelTable& table) {
  table.set(OpId::isclose, DeviceType::CPU, kAllDTypes, cpu_isclose);
}
}  // namespace detail

Tensor isclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  check_pair(a, b, "isclose");
  STRATA_CHECK(rtol >= 0 && atol >= 0, "[isclose] rtol ({}) and atol ({}) must be non-negative", rtol, atol);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), "isclose");
  DType t = promote_types(a.dtype(), b.dtype());
  Tensor out = detail::make_tensor(shape, kBool, a.device());
  if (out.numel() == 0) return out;
  const Tensor in[2] = {a.to(t), b.to(t)};
  IsCloseParams p{rtol, atol, equal_nan};
  run_kernel(OpId::isclose, t, KernelCall{in, {&out, 1}, &p});
  return out;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  return all_true(isclose(a, b, rtol, atol, equal_nan));
}

bool equal(const Tensor& a, const Tensor& b) {
  check_pair(a, b, "equal");
  if (a.shape() != b.shape()) return false;
  if (a.numel() == 0) return true;
  return all_true(eq(a, b));
}

}  // namespace strata
