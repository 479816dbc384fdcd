// Module hooks, after torch.nn.Module's: a forward pre-hook sees (and may replace) a module's
// inputs before its forward, a forward hook sees the inputs and outputs (and may replace the
// outputs) after it, a full backward hook sees the gradients of the inputs and outputs (and may
// replace the inputs'), a full backward pre-hook sees (and may replace) the output gradients before
// the inputs' are computed. State dict hooks (nn/module.hpp) run around state_dict() and
// load_state_dict(). Hooks run whenever a module is called through one of its call operators
// (operator()(const Tensor&), and the multi-input ones: a loss's (input, target), attention's
// (query, key, value, ...), a recurrent layer's (input, state)), which is how containers call
// their children; forward() itself runs none. A hook returns std::nullopt (or nothing: a void
// callable) to keep the value. Registration returns a RemovableHandle; as torch's, it does not
// unregister when destroyed, only remove() does.
//
// Note [Hook forms]: a hook comes in two forms, picked at registration by what it takes. The
// one-input form (ForwardPreHook, ForwardHook, BackwardHook) takes single tensors: on a
// multi-input call it sees (and may replace) the first input and the first (primary) output. The
// args form (ForwardPreArgsHook, ForwardArgsHook, BackwardArgsHook) takes vectors, as torch's
// args tuple: a call's inputs are its tensor arguments in order, undefined where one was not
// given (attention's {query, key, value, key_padding_mask, attn_mask}), its outputs the tensors
// it returns (an LSTM's {output, h_n, c_n}); a hook may edit the vector in place or return a
// replacement of the same length.
//
//   auto h = model.fc1.register_forward_hook(
//       [](nn::Module&, const Tensor& in, const Tensor& out) { std::cout << out.shape(); });
//   attn.register_forward_pre_hook([](nn::Module&, std::vector<Tensor>& in) { in[1] = in[1] * 0.5; });
//   h.remove();
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::nn {

class Module;

/// (module, input) -> a replacement input, or std::nullopt to keep it. The one-input forms see
/// a multi-input call's first input and first output (Note [Hook forms]).
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

/// (module, grad_output) -> a replacement grad_output (its shape), or std::nullopt to keep it:
/// called once the gradient of the module's output is known, before the inputs' gradients are
/// computed (torch's full backward pre-hook); the full backward hooks then see the replacement.
/// The same signature as ForwardPreHook, on gradients.
using BackwardPreHook = ForwardPreHook;

/// The args forms (Note [Hook forms]): (module, inputs) -> replacement inputs (as many), or
/// std::nullopt to keep them (edits made in place stay).
using ForwardPreArgsHook = std::function<std::optional<std::vector<Tensor>>(Module&, std::vector<Tensor>& inputs)>;
/// (module, inputs, outputs) -> replacement outputs (as many), or std::nullopt to keep them. On
/// an always_call run after an error, outputs is empty unless forward returned.
using ForwardArgsHook = std::function<std::optional<std::vector<Tensor>>(Module&, const std::vector<Tensor>& inputs,
                                                                         std::vector<Tensor>& outputs)>;
/// (module, grad_inputs, grad_outputs) -> replacement grad_inputs, or std::nullopt: one gradient
/// per input, undefined for an input that does not require grad (its replacement is ignored),
/// one per output (zeros for an output the loss does not use, undefined for one not requiring
/// grad; all undefined when the gradient reached the inputs without passing the outputs). Called
/// once, when the inputs' gradients are known (or grad_outputs, if no input needs one).
using BackwardArgsHook = std::function<std::optional<std::vector<Tensor>>(
    Module&, std::vector<Tensor>& grad_inputs, const std::vector<Tensor>& grad_outputs)>;

/// (module, grad_outputs) -> replacement grad_outputs (as many), or std::nullopt: one per output,
/// as BackwardArgsHook's; a replacement for an output that does not require grad is ignored.
using BackwardPreArgsHook = ForwardPreArgsHook;

using StateDict = std::map<std::string, Tensor>;
struct LoadResult;
/// State dict hooks (torch's), run for each module with its dotted prefix ("fc1."), on every
/// registration of it. (module, prefix), before state_dict() collects anything.
using StateDictPreHook = std::function<void(const Module&, const std::string& prefix)>;
/// (module, state_dict, prefix): after the module's and its children's entries are in; edits the
/// dict in place (renames, adds or removes keys, replaces values).
using StateDictPostHook = std::function<void(const Module&, StateDict& state_dict, const std::string& prefix)>;
/// (module, state_dict, prefix): before load_state_dict() compares anything; edits (a copy of) the
/// dict being loaded in place.
using LoadStateDictPreHook = std::function<void(Module&, StateDict& state_dict, const std::string& prefix)>;
/// (module, incompatible_keys): after the values are written; may add or clear missing and
/// unexpected keys, which a strict load checks after these hooks, as torch's.
using LoadStateDictPostHook = std::function<void(Module&, LoadResult& incompatible_keys)>;

namespace hook_detail {

template <class Hook> struct HookEntry {
  uint64_t id = 0;
  Hook hook;
  bool always_call = false;
};

/// One kind of hooks, in calling order, copied on write: a call holds the list it started with,
/// so a hook may add or remove hooks (its own included) while they run, and a call copies no hook.
template <class Hook> using HookList = std::shared_ptr<const std::vector<HookEntry<Hook>>>;
template <class Hook> size_t size_of(const HookList<Hook>& list) { return list ? list->size() : 0; }

/// One module's hooks (or the global ones). Shared with the handles, which hold it weakly: a
/// handle outliving its module removes nothing, and a moved module keeps its hooks and handles.
struct STRATA_API HookRegistry {
  // one-input hooks are kept in the args form (the *_from_one_input converters)
  HookList<ForwardPreArgsHook> pre;
  HookList<ForwardArgsHook> post;
  HookList<BackwardArgsHook> backward;
  HookList<BackwardPreArgsHook> backward_pre;
  // a module keeps these in a registry of their own, so that they leave its calls on the fast path
  HookList<StateDictPreHook> state_dict_pre;
  HookList<StateDictPostHook> state_dict_post;
  HookList<LoadStateDictPreHook> load_pre;
  HookList<LoadStateDictPostHook> load_post;
  uint64_t next_id = 0;
  std::mutex* mutex = nullptr;  // the global registry's; a module's hooks are not locked
  bool empty() const {
    return size_of(pre) + size_of(post) + size_of(backward) + size_of(backward_pre) + size_of(state_dict_pre) +
               size_of(state_dict_post) + size_of(load_pre) + size_of(load_post) ==
           0;
  }
};

/// How many global hooks are registered: the one check a module call makes for them.
STRATA_API extern std::atomic<int> global_hook_count;

/// A callable returning void, the value or std::optional of it as a Hook returning std::optional
/// of the value; an empty std::function stays empty (registration refuses it).
template <class Hook, class F> Hook to_hook(F&& fn) {
  using Fn = std::decay_t<F>;
  using Result = typename Hook::result_type;
  if constexpr (std::is_same_v<Fn, Hook>) {
    if (!fn) return Hook();
  }
  return [fn = std::forward<F>(fn)](auto&&... args) mutable -> Result {
    using R = std::invoke_result_t<Fn&, decltype(args)...>;
    if constexpr (std::is_void_v<R>) {
      fn(args...);
      return std::nullopt;
    } else {
      return Result(fn(args...));
    }
  };
}

/// A one-input hook as an args-form one acting on the first input and output (Note [Hook forms]).
/// (ForwardHook and BackwardHook are the same type, hence three names.)
STRATA_API ForwardPreArgsHook pre_hook_from_one_input(ForwardPreHook hook);
STRATA_API ForwardArgsHook forward_hook_from_one_input(ForwardHook hook);
STRATA_API BackwardArgsHook backward_hook_from_one_input(BackwardHook hook);

/// Whether Fn can be called with Hook's arguments (whatever it returns).
template <class Hook, class Fn> struct takes_arguments_of;
template <class R, class... A, class Fn>
struct takes_arguments_of<std::function<R(A...)>, Fn> : std::is_invocable<Fn&, A...> {};

/// A hook callable of either form (Note [Hook forms]) as the args form: `OneInput` and `Args`
/// are the two std::function types, `convert` makes the first the second.
template <class OneInput, class Args, class F> Args either_form(F&& fn, Args (*convert)(OneInput)) {
  using Fn = std::decay_t<F>;
  if constexpr (takes_arguments_of<OneInput, Fn>::value) {
    return convert(to_hook<OneInput>(std::forward<F>(fn)));
  } else {
    static_assert(takes_arguments_of<Args, Fn>::value,
                  "a module hook takes (Module&, const Tensor&...) or the args form's vectors (nn/hooks.hpp)");
    return to_hook<Args>(std::forward<F>(fn));
  }
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
STRATA_API RemovableHandle add_global_hook(ForwardPreArgsHook hook);
STRATA_API RemovableHandle add_global_hook(ForwardArgsHook hook, bool always_call);
STRATA_API RemovableHandle add_global_hook(BackwardArgsHook hook);
STRATA_API RemovableHandle add_global_backward_pre_hook(BackwardPreArgsHook hook);
template <class F> ForwardPreArgsHook pre_hook_of(F&& fn) {
  return either_form<ForwardPreHook, ForwardPreArgsHook>(std::forward<F>(fn), &pre_hook_from_one_input);
}
template <class F> ForwardArgsHook forward_hook_of(F&& fn) {
  return either_form<ForwardHook, ForwardArgsHook>(std::forward<F>(fn), &forward_hook_from_one_input);
}
template <class F> BackwardArgsHook backward_hook_of(F&& fn) {
  return either_form<BackwardHook, BackwardArgsHook>(std::forward<F>(fn), &backward_hook_from_one_input);
}
}  // namespace hook_detail

/// Hooks run on every module's call, before the module's own (torch's
/// register_module_forward_pre_hook / register_module_forward_hook); `fn` is of either form
/// (Note [Hook forms]), or the same returning void. Thread-safe to register and remove.
template <class F> RemovableHandle register_module_forward_pre_hook(F&& fn) {
  return hook_detail::add_global_hook(hook_detail::pre_hook_of(std::forward<F>(fn)));
}
template <class F> RemovableHandle register_module_forward_hook(F&& fn, bool always_call = false) {
  return hook_detail::add_global_hook(hook_detail::forward_hook_of(std::forward<F>(fn)), always_call);
}
/// Hooks run in the backward of every module's call, before the module's own, as torch's
/// register_module_full_backward_pre_hook / register_module_full_backward_hook order them; `fn` is
/// of either form (a BackwardPreHook or BackwardPreArgsHook; a BackwardHook or BackwardArgsHook).
/// A call snapshots the hooks when it runs forward: its backward runs those.
template <class F> RemovableHandle register_module_full_backward_pre_hook(F&& fn) {
  return hook_detail::add_global_backward_pre_hook(hook_detail::pre_hook_of(std::forward<F>(fn)));
}
template <class F> RemovableHandle register_module_full_backward_hook(F&& fn) {
  return hook_detail::add_global_hook(hook_detail::backward_hook_of(std::forward<F>(fn)));
}
/// Whether any global hook, forward or backward, is registered (one relaxed atomic load).
inline bool has_global_forward_hooks() { return hook_detail::global_hook_count.load(std::memory_order_relaxed) > 0; }

}  // namespace strata::nn
