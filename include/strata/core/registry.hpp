// The op table and the kernel registry: (op, device type, dtype) -> kernel. Built-in kernels
// register at start-up; user code adds kernels for new ops, or overrides built-in ones, at
// run time through strata::ext. Every op's compute goes through run_kernel().
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include <strata/core/dtype.hpp>
#include <strata/core/device.hpp>
#include <strata/core/export.hpp>
#include <strata/core/op_table.hpp>

namespace strata {

class Tensor;

enum class OpId : uint16_t {
#define STRATA_OP_ENUM(name, inputs, differentiable) name,
  STRATA_OP_TABLE(STRATA_OP_ENUM)
#undef STRATA_OP_ENUM
  num_builtin
};
static_assert(static_cast<int>(OpId::num_builtin) == STRATA_NUM_BUILTIN_OPS,
              "op table and STRATA_NUM_BUILTIN_OPS disagree");

struct OpInfo {
  std::string name;
  int num_inputs;
  bool differentiable;
};

/// What a kernel receives: its inputs, its preallocated outputs, and the op's
/// parameter struct (declared in the op family's header under include/strata/ops/), or null.
struct KernelCall {
  std::span<const Tensor> inputs;
  std::span<Tensor> outputs;
  const void* params = nullptr;
  template <class P> const P& param() const { return *static_cast<const P*>(params); }
};

using KernelFn = std::function<void(const KernelCall&)>;

STRATA_API const OpInfo& op_info(OpId op);
STRATA_API std::string_view op_name(OpId op);

/// Runs the kernel registered for (op, device of the call, dtype). The device is that of the
/// first output, or of the first input when there are no outputs. Raises Error naming the
/// op, device and dtype when none is registered.
STRATA_API void run_kernel(OpId op, DType dtype, const KernelCall& call);

/// Observes every run_kernel call (the profiler's hook). on_end follows every on_begin, also
/// when the kernel raises, and must not throw. Installed observers must outlive their
/// installation; nullptr removes it.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void on_begin(OpId op, const KernelCall& call) = 0;
  virtual void on_end(OpId op, const KernelCall& call) = 0;
};
STRATA_API void set_op_observer(OpObserver* observer);

namespace ext {
/// Adds or replaces the kernel for (op, device, dtype).
STRATA_API void register_kernel(OpId op, DeviceType device, DType dtype, KernelFn kernel);
/// Declares a new op at run time and returns its id; the name must be new.
STRATA_API OpId register_op(std::string name, int num_inputs, bool differentiable = false);
/// Looks an op up by name (built-in or registered); raises Error when unknown.
STRATA_API OpId find_op(std::string_view name);
/// The kernel registered for (op, device, dtype), or an empty function.
STRATA_API KernelFn get_kernel(OpId op, DeviceType device, DType dtype);
/// True when a kernel is registered for (op, device, dtype).
STRATA_API bool has_kernel(OpId op, DeviceType device, DType dtype);
}  // namespace ext

}  // namespace strata
