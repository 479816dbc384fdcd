// The kernel registry: a table indexed by (op, device type, dtype), filled at start-up by each
// op family's register function and open to strata::ext at run time.
#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <stdexcept>
#include <vector>

#include <strata/core/registry.hpp>
#include <strata/core/tensor.hpp>

#include "core/registry_internal.h"

namespace strata {

namespace {

// A kernel is shared: run_kernel holds its own reference while it runs, so an override from
// another thread (ext::register_kernel) never frees a function that is running.
using KernelSlots = std::array<std::shared_ptr<const KernelFn>, kNumDeviceTypes * kNumDTypes>;

struct Registry final : detail::KernelTable {
  std::shared_mutex mutex;
  std::deque<OpInfo> ops;  // a deque: op_info's references stay valid as register_op adds ops
  std::vector<std::unique_ptr<KernelSlots>> kernels;  // one slot array per op
  std::atomic<OpObserver*> observer{nullptr};

  Registry() {
#define STRATA_OP_INFO(name, inputs, differentiable) add_op(#name, inputs, differentiable);
    STRATA_OP_TABLE(STRATA_OP_INFO)
#undef STRATA_OP_INFO
  }
  OpId add_op(std::string name, int inputs, bool differentiable) {
    ops.push_back(OpInfo{std::move(name), inputs, differentiable});
    kernels.push_back(std::make_unique<KernelSlots>());
    return static_cast<OpId>(ops.size() - 1);
  }
  void set(OpId op, DeviceType device, DType dtype, KernelFn kernel) override {
    (*kernels[static_cast<size_t>(op)])[slot(device, dtype)] = std::make_shared<const KernelFn>(std::move(kernel));
  }
  static size_t slot(DeviceType d, DType t) { return static_cast<size_t>(d) * kNumDTypes + static_cast<size_t>(t); }
};

Registry& table() {
  static Registry* r = [] {
    auto* reg = new Registry();  // leaked on purpose: kernels may run during static destruction
    detail::register_builtin_kernels(*reg);
    return reg;
  }();
  return *r;
}

}  // namespace

const OpInfo& op_info(OpId op) {
  Registry& r = table();
  std::shared_lock lock(r.mutex);
  size_t i = static_cast<size_t>(op);
  STRATA_CHECK(i < r.ops.size(), "[registry] unknown op id {}", i);
  return r.ops[i];
}

std::string_view op_name(OpId op) { return op_info(op).name; }

void run_kernel(OpId op, DType dtype, const KernelCall& call) {
  Registry& r = table();
  Device device = !call.outputs.empty() ? call.outputs[0].device()
                  : !call.inputs.empty() ? call.inputs[0].device() : kCPU;
  std::shared_ptr<const KernelFn> fn;
  {
    std::shared_lock lock(r.mutex);
    size_t i = static_cast<size_t>(op);
    STRATA_CHECK(i < r.ops.size(), "[registry] unknown op id {}", i);
    fn = (*r.kernels[i])[Registry::slot(device.type, dtype)];
    if (!fn) {
      const char* hint = device.is_cuda() && !cuda::is_available() ? " (no CUDA device is available)" : "";
      detail::throw_error("[{}] no kernel registered for dtype {} on {}{}", r.ops[i].name, dtype, device, hint);
    }
  }
  OpObserver* obs = r.observer.load(std::memory_order_acquire);
  if (obs) obs->on_begin(op, call);
  struct EndNotice {  // on_end also when the kernel raises, so observers' begin/end pairs match
    OpObserver* obs;
    OpId op;
    const KernelCall& call;
    ~EndNotice() {
      if (obs) obs->on_end(op, call);
    }
  } end_notice{obs, op, call};
  try {
    (*fn)(call);
  } catch (const std::bad_alloc&) {  // a kernel's own scratch space (sort buffers, partial sums)
    detail::throw_error("[{}] out of host memory for the kernel's scratch space ({} on {})", op_name(op), dtype,
                        device);
  } catch (const std::length_error&) {
    detail::throw_error("[{}] the kernel's scratch space is too large ({} on {})", op_name(op), dtype, device);
  }
}

void set_op_observer(OpObserver* observer) { table().observer.store(observer, std::memory_order_release); }

namespace ext {

void register_kernel(OpId op, DeviceType device, DType dtype, KernelFn kernel) {
  Registry& r = table();
  std::unique_lock lock(r.mutex);
  size_t i = static_cast<size_t>(op);
  STRATA_CHECK(i < r.ops.size(), "[register_kernel] unknown op id {}", i);
  STRATA_CHECK(kernel != nullptr, "[register_kernel] empty kernel for op {}", r.ops[i].name);
  r.set(op, device, dtype, std::move(kernel));
}

OpId register_op(std::string name, int num_inputs, bool differentiable) {
  Registry& r = table();
  std::unique_lock lock(r.mutex);
  STRATA_CHECK(!name.empty(), "[register_op] empty op name");
  STRATA_CHECK(num_inputs >= 0, "[register_op] op {} has a negative input count {}", name, num_inputs);
  for (const OpInfo& o : r.ops) STRATA_CHECK(o.name != name, "[register_op] op {} is already registered", name);
  return r.add_op(std::move(name), num_inputs, differentiable);
}

OpId find_op(std::string_view name) {
  Registry& r = table();
  std::shared_lock lock(r.mutex);
  for (size_t i = 0; i < r.ops.size(); ++i)
    if (r.ops[i].name == name) return static_cast<OpId>(i);
  detail::throw_error("[find_op] no op named {}", name);
}

KernelFn get_kernel(OpId op, DeviceType device, DType dtype) {
  Registry& r = table();
  std::shared_lock lock(r.mutex);
  size_t i = static_cast<size_t>(op);
  STRATA_CHECK(i < r.ops.size(), "[get_kernel] unknown op id {}", i);
  const auto& k = (*r.kernels[i])[Registry::slot(device, dtype)];
  return k ? *k : KernelFn();
}

bool has_kernel(OpId op, DeviceType device, DType dtype) {
  Registry& r = table();
  std::shared_lock lock(r.mutex);
  size_t i = static_cast<size_t>(op);
  return i < r.ops.size() && (*r.kernels[i])[Registry::slot(device, dtype)] != nullptr;
}

}  // namespace ext
}  // namespace strata
