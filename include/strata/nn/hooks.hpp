// Module hooks, after torch.nn.Module's: a forward pre-hook sees (and may replace) a module's
// input before its forward, a forward hook sees the input and output (and may replace the
// output) after it, a full backward hook sees the gradients of the input and output (and may
// replace the input's). Hooks run whenever a module is called through operator()(const Tensor&),
// which containers use for their children; a hook returns std::nullopt (or nothing: a void
// callable) to keep the value. Registration returns a RemovableHandle; as torch's, it does not
// unregister when destroyed, only remove() does.
//
//   auto h = model.fc1.register_forward_hook(
//       [](nn::Module&, const Tensor& in, const Tensor& out) { std::cout << out.shape(); });
//   h.remove();
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::nn {

class Module;

/// (module, input) -> a replacement input, or std::nullopt to keep it.
using ForwardPreHook = std::function<std::optional<Tensor>(Module&, const Tensor& input)>;
/// (module, input, output) -> a replacement output, or std::nullopt to keep it. `input` is the
/// one forward saw (after the pre-hooks). A hook registered with always_call also runs when the
/// forward (or a hook before it) raised: `output` is then undefined unless forward returned,
/// its result is ignored, and the error goes on (torch's always_call).
using ForwardHook = std::function<std::optional<Tensor>(Module&, const Tensor& input, const Tensor& output)>;

/// (module, grad_input, grad_output) -> a replacement grad_input (its shape), or std::nullopt to
/// keep it: the gradients of the loss with respect to the module's input and output, called
/// once the input's gradient is computed (torch's full backward hook). grad_input is undefined
/// when the input does not require grad (the hook then runs when grad_output is known).
using BackwardHook =
    std::function<std::optional<Tensor>(Module&, const Tensor& grad_input, const Tensor& grad_output)>;

namespace hook_detail {

template <class Hook> struct HookEntry {
  uint64_t id = 0;
  Hook hook;
  bool always_call = false;
};

/// One module's hooks (or the global ones), in calling order. Shared with the handles, which
/// hold it weakly: a handle outliving its module removes nothing, and a moved module keeps its
/// hooks and handles.
struct STRATA_API HookRegistry {
  std::vector<HookEntry<ForwardPreHook>> pre;
  std::vector<HookEntry<ForwardHook>> post;
  std::vector<HookEntry<BackwardHook>> backward;  // a module's only
  uint64_t next_id = 0;
  std::mutex* mutex = nullptr;  // the global registry's; a module's hooks are not locked
  bool empty() const { return pre.empty() && post.empty() && backward.empty(); }
};

/// How many global hooks are registered: the one check a module call makes for them.
STRATA_API extern std::atomic<int> global_hook_count;

/// A callable returning void or std::optional<Tensor> (or Tensor) as one returning
/// std::optional<Tensor>; an empty std::function stays empty (registration refuses it).
template <class Hook, class F> Hook to_hook(F&& fn) {
  using Fn = std::decay_t<F>;
  if constexpr (std::is_same_v<Fn, Hook>) {
    if (!fn) return Hook();
  }
  return [fn = std::forward<F>(fn)](auto&&... args) mutable -> std::optional<Tensor> {
    using R = std::invoke_result_t<Fn&, decltype(args)...>;
    if constexpr (std::is_void_v<R>) {
      fn(args...);
      return std::nullopt;
    } else {
      return std::optional<Tensor>(fn(args...));
    }
  };
}

}  // namespace hook_detail

/// Unregisters one hook (torch.utils.hooks.RemovableHandle). Destroying it leaves the hook in
/// place; remove() twice, or after the module is gone, does nothing.
class STRATA_API RemovableHandle {
 public:
  RemovableHandle() = default;
  RemovableHandle(std::weak_ptr<hook_detail::HookRegistry> registry, uint64_t id)
      : registry_(std::move(registry)), id_(id) {}
  void remove();
  /// The id of the hook within its module (increasing in registration order).
  uint64_t id() const { return id_; }

 private:
  std::weak_ptr<hook_detail::HookRegistry> registry_;
  uint64_t id_ = 0;
};

namespace hook_detail {
STRATA_API RemovableHandle add_global_hook(ForwardPreHook hook);
STRATA_API RemovableHandle add_global_hook(ForwardHook hook, bool always_call);
}  // namespace hook_detail

/// Hooks run on every module's call, before the module's own (torch's
/// register_module_forward_pre_hook / register_module_forward_hook); `fn` is a ForwardPreHook
/// (ForwardHook) or the same returning void. Thread-safe to register and remove.
template <class F> RemovableHandle register_module_forward_pre_hook(F&& fn) {
  return hook_detail::add_global_hook(hook_detail::to_hook<ForwardPreHook>(std::forward<F>(fn)));
}
template <class F> RemovableHandle register_module_forward_hook(F&& fn, bool always_call = false) {
  return hook_detail::add_global_hook(hook_detail::to_hook<ForwardHook>(std::forward<F>(fn)), always_call);
}
/// Whether any global hook is registered (one relaxed atomic load).
inline bool has_global_forward_hooks() { return hook_detail::global_hook_count.load(std::memory_order_relaxed) > 0; }

}  // namespace strata::nn
