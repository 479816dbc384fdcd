// nn::Module: the base of every layer. A module owns named parameters, buffers and child
// modules, and names them with PyTorch's dotted state_dict keys. Modules are plain classes:
// a layer can be a member of another module or live on the stack.
//
//   struct Net : nn::Module {
//     nn::Linear fc1{784, 64}, fc2{64, 10};
//     Net() { register_module("fc1", fc1); register_module("fc2", fc2); }
//     Tensor forward(const Tensor& x) override { return fc2(relu(fc1(x))); }
//   };
//
// Note [Member children]: a member child is remembered by its offset inside the parent, so a
// module stays valid when it is moved (into a Sequential, say). Children owned by containers
// live on the heap. register_module(name, child&) is only for data members of the module
// itself: a module that lives elsewhere (a local, another object's member, an element of a
// std::vector) must be handed over as a std::unique_ptr, or its offset points at nothing once
// the parent moves. Registration refuses a child it can tell is not a member (one that lies
// before the parent's members, or more than kMaxMemberOffset bytes past the parent, as a child
// on the heap of a parent on the stack does); a child on the heap just past a parent on the
// heap, or a local beside it, cannot be told from a member.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <strata/core/tensor.hpp>
#include <strata/nn/hooks.hpp>

namespace strata::nn {

/// What load_state_dict found: keys the module has but the dict lacks, and the reverse (torch's
/// incompatible_keys, which load post-hooks may edit).
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

class STRATA_API Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(Module&&) noexcept = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The one-input forward used by containers; modules with other signatures add overloads.
  virtual Tensor forward(const Tensor& input);
  /// forward(input) with the hooks around it (nn/hooks.hpp); without any registered, the
  /// cost is two checks. Call this, not forward(), to run a child. Modules with other call
  /// signatures add call operators that run the hooks through call_hooked.
  Tensor operator()(const Tensor& input) {
    if (!hooks_active()) return forward(input);
    return call_with_hooks(input);
  }
  /// Adds a hook run before forward, after those already registered (first, with prepend); `fn`
  /// is a ForwardPreHook or ForwardPreArgsHook (Note [Hook forms]), or the same returning void.
  template <class F> RemovableHandle register_forward_pre_hook(F&& fn, bool prepend = false) {
    return add_hook(hook_detail::pre_hook_of(std::forward<F>(fn)), prepend);
  }
  /// Adds a hook run after forward; `fn` is a ForwardHook or ForwardArgsHook, or the same
  /// returning void. With always_call it runs even when the call raises (see ForwardHook).
  template <class F> RemovableHandle register_forward_hook(F&& fn, bool prepend = false, bool always_call = false) {
    return add_hook(hook_detail::forward_hook_of(std::forward<F>(fn)), prepend, always_call);
  }
  /// Adds a hook run in the backward of each call made with grad mode on (see BackwardHook);
  /// `fn` is a BackwardHook or BackwardArgsHook, or the same returning void. The module must
  /// outlive the backward.
  template <class F> RemovableHandle register_full_backward_hook(F&& fn, bool prepend = false) {
    return add_backward_hook(hook_detail::backward_hook_of(std::forward<F>(fn)), prepend);
  }
  /// Adds a hook run in the backward of each call made with grad mode on, before the full backward
  /// hooks (see BackwardPreHook); `fn` is a BackwardPreHook or BackwardPreArgsHook, or the same
  /// returning void. The module must outlive the backward.
  template <class F> RemovableHandle register_full_backward_pre_hook(F&& fn, bool prepend = false) {
    return add_backward_pre_hook(hook_detail::pre_hook_of(std::forward<F>(fn)), prepend);
  }
  /// State dict hooks (nn/hooks.hpp), run in registration order; they leave the module's calls on
  /// the path without hooks. state_dict() runs the pre-hooks of this module and every submodule
  /// before the children's (pre-order), the post-hooks after them (post-order); load_state_dict()
  /// likewise. check_state_dict() runs the load pre-hooks (on a copy of the dict) and no others.
  RemovableHandle register_state_dict_pre_hook(StateDictPreHook hook);
  RemovableHandle register_state_dict_post_hook(StateDictPostHook hook);
  RemovableHandle register_load_state_dict_pre_hook(LoadStateDictPreHook hook);
  RemovableHandle register_load_state_dict_post_hook(LoadStateDictPostHook hook);
  /// Whether this module has call hooks of its own (global and state dict hooks aside).
  bool has_hooks() const { return hooks_ && !hooks_->empty(); }
  /// The class name shown in errors and printing ("Linear").
  virtual std::string name() const { return "Module"; }

  /// The listings below name each module and tensor once: one registered under two names (a
  /// shared submodule, a tied weight) comes under its first. state_dict() keeps every name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Module*> children() const;
  std::vector<std::pair<std::string, Module*>> named_children() const;
  /// This module and all below it, pre-order, with dotted names ("" for this one).
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// The submodule at the dotted path `target` ("" for this one), as torch's get_submodule;
  /// raises naming the part of the path that is not there.
  Module& get_submodule(const std::string& target) const;
  /// Puts `module` in the place of the submodule at `target` (torch's set_submodule) and returns
  /// the old one. Only a child its parent owns (an element of a container, or one registered as
  /// a std::unique_ptr) can be replaced; a data member raises (Note [Member children]). A parent
  /// that keeps a pointer to such a child must follow (or refuse) the change in replacing_child.
  std::unique_ptr<Module> set_submodule(const std::string& target, std::unique_ptr<Module> module);
  /// Whether set_submodule(target, ...) would find an owned child there to replace.
  bool owns_submodule(const std::string& target) const;
  /// Calls fn on every submodule (children first) and then on this module.
  Module& apply(const std::function<void(Module&)>& fn);

  /// Sets training mode here and below; virtual so that a module may keep a child in eval (a fused
  /// QAT module whose batch norm statistics are frozen).
  virtual Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

  /// Moves parameters and buffers in place: existing handles (an optimizer's) see the change.
  /// These conversions keep a channels-last tensor channels-last (PyTorch's preserve_format).
  Module& to(Device device);
  /// Converts floating parameters and buffers; integer buffers keep their dtype.
  Module& to(DType dtype);
  Module& to(Device device, DType dtype);
  /// Lays out every 4-d parameter and buffer (convolution weights) in `format`, in place, as
  /// PyTorch's to(memory_format=...): a channels-last network then reads its weights without
  /// converting them each step. Other tensors keep their layout.
  Module& to(MemoryFormat format);

  /// Drops the parameters' gradients, or zeroes them in place, detached (Optimizer::zero_grad).
  void zero_grad(bool set_to_none = true);
  int64_t num_parameters() const;

  /// Parameters and persistent buffers by dotted name: detached tensors sharing memory with the
  /// module (PyTorch's keep_vars=False), as the state dict hooks leave them.
  StateDict state_dict() const;
  /// Copies values in. strict: every key must match both ways. Shapes must always match (a
  /// one-element [1] tensor loads into a 0-d one, as in PyTorch). A key the module marks as
  /// optional (batch norm's num_batches_tracked, absent from older checkpoints) may be missing:
  /// its value is kept. Raises Error listing every missing key, unexpected key, shape mismatch
  /// and destination that cannot be written (an expanded view), before writing anything. With
  /// load post-hooks below this module, missing and unexpected keys are judged after the values
  /// are written and the hooks ran (as torch's); if that check or a hook raises, the old values
  /// are put back (the load keeps a copy of them for this).
  LoadResult load_state_dict(const StateDict& dict, bool strict = true);
  /// What load_state_dict(dict, strict) would refuse, one line per problem, without writing
  /// anything; empty when it would load (load_checkpoint checks the model this way first). With
  /// load post-hooks registered, missing and unexpected keys are left to the load (they may
  /// clear them).
  std::vector<std::string> check_state_dict(const StateDict& dict, bool strict = true) const;
  /// Whether a state-dict entry of `saved`'s shape loads into `into`: the same shape, or a
  /// one-element [1] tensor into a 0-d one, as PyTorch allows (checkpoints from before 0-d
  /// tensors existed).
  static bool shape_loads_into(const Tensor& saved, const Tensor& into);

  /// Adds a buffer (public, as PyTorch's, so tools such as compress's pruning can attach state
  /// like "weight_mask"); persistent buffers are in the state dict.
  Tensor register_buffer(std::string name, Tensor value, bool persistent = true);
  /// Unregisters this module's own buffer `name` and returns it; raises Error when there is none.
  Tensor remove_buffer(const std::string& name);

 protected:
  /// Assignment through a base reference would replace only the Module part (`list[i] =
  /// nn::Linear(...)` would list the new weights while forward kept using the old ones), so only
  /// a derived class's own assignment, which moves everything, may call it.
  Module& operator=(Module&&) noexcept = default;
  /// How far past the parent a member child may lie; a larger distance means the child is not
  /// a data member (see Note [Member children]).
  static constexpr std::ptrdiff_t kMaxMemberOffset = std::ptrdiff_t{1} << 20;

  /// Adds a parameter (a leaf that requires grad) and returns the handle to keep.
  Tensor register_parameter(std::string name, Tensor value, bool requires_grad = true);
  /// Registers a child that is a member of this module (see Note [Member children]).
  template <class M> M& register_module(std::string name, M& child) {
    add_member_child(std::move(name), child);
    return child;
  }
  /// Registers a child this module owns.
  template <class M> M& register_module(std::string name, std::unique_ptr<M> child) {
    M* raw = child.get();
    add_owned_child(std::move(name), std::move(child));  // refuses a null child
    return *raw;
  }
  /// Replaces a registered parameter's or buffer's value (same name), keeping the handle; a
  /// buffer registered undefined has no value to replace and raises.
  void set_tensor(const std::string& name, const Tensor& value);
  /// Whether this module's own buffer `name` is persistent (in the state dict); false when there is none.
  bool is_persistent_buffer(const std::string& name) const;
  /// Removes this module's own parameter or owned child `name` (a layer that changes form, as a
  /// quantized Linear dropping its float weight) and returns the child (null for a parameter);
  /// raises when neither has that name or the child is a data member (remove_buffer for buffers).
  std::unique_ptr<Module> unregister(const std::string& name);
  /// Called by set_submodule before the child `old` gives its place to `now`: a container updates
  /// the pointers it keeps; a layer raises for a child it must keep (its form).
  virtual void replacing_child(Module* old, Module* now) {
    (void)old;
    (void)now;
  }
  /// Names of this module's own state_dict entries that a load may lack (their values are kept).
  virtual std::vector<std::string> optional_state_keys() const { return {}; }

  /// Whether a call must take the hooked path: this module or the process has hooks.
  bool hooks_active() const { return hooks_ || has_global_forward_hooks(); }
  /// The hooked path of a call operator: runs the hooks around fn, which computes the call from
  /// the inputs the pre-hooks leave. `inputs` are the call's tensor arguments in order
  /// (undefined where not given); fn returns a Tensor or a std::vector<Tensor> (the primary
  /// output first), and so does call_hooked (Note [Hook forms]). A call operator checks
  /// hooks_active() first, so that a call without hooks builds no vectors:
  ///
  ///   Tensor operator()(const Tensor& input, const Tensor& target) {
  ///     if (!hooks_active()) return forward(input, target);
  ///     return call_hooked({input, target}, [&](const std::vector<Tensor>& in) { return forward(in[0], in[1]); });
  ///   }
  template <class Fn> auto call_hooked(std::vector<Tensor> inputs, Fn&& fn) {
    using R = std::invoke_result_t<Fn&, const std::vector<Tensor>&>;
    if constexpr (std::is_same_v<R, Tensor>) {
      return run_hooked(std::move(inputs), [&fn](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{fn(in)};
      })[0];
    } else {
      static_assert(std::is_same_v<R, std::vector<Tensor>>, "call_hooked's fn returns Tensor or std::vector<Tensor>");
      return run_hooked(std::move(inputs), std::forward<Fn>(fn));
    }
  }

 private:
  struct Child {
    std::string name;
    std::ptrdiff_t offset = 0;       // member children: address relative to the parent
    std::unique_ptr<Module> owned;   // owned children
  };
  RemovableHandle add_hook(ForwardPreArgsHook hook, bool prepend);
  RemovableHandle add_hook(ForwardArgsHook hook, bool prepend, bool always_call);
  RemovableHandle add_backward_hook(BackwardArgsHook hook, bool prepend);
  RemovableHandle add_backward_pre_hook(BackwardPreArgsHook hook, bool prepend);
  friend struct StateDictHooks;  // runs the state dict hooks of a module tree (module_state_hooks.cpp)
  /// The state dict without hooks: what load_state_dict writes into.
  StateDict own_state_dict() const;
  Tensor call_with_hooks(const Tensor& input);
  std::vector<Tensor> run_hooked(std::vector<Tensor> inputs,
                                 const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn);
  void add_member_child(std::string name, Module& child);
  void add_owned_child(std::string name, std::unique_ptr<Module> child);
  void check_new_name(const std::string& name) const;
  Module* child_at(const Child& c) const;
  /// The parent of the submodule at `target` and the child's entry there (null when absent).
  std::pair<Module*, Child*> find_child(const std::string& target) const;
  // Every registration, a module or tensor registered twice included (state_dict keeps both
  // names, as PyTorch's does; the public listings name each object once).
  std::vector<std::pair<std::string, Module*>> registered_children() const;
  std::vector<std::pair<std::string, Tensor>> registered_parameters() const;
  template <class F> void for_each_tensor(F&& f);
  /// f(prefix, module) for this module and every registration below it ("" for this one).
  void visit_prefixed(const std::function<void(const std::string&, const Module&)>& f) const;
  /// Every optional_state_keys() entry below this module, by dotted name.
  std::set<std::string> all_optional_state_keys() const;

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<bool> buffer_persistent_;
  std::vector<Child> children_;
  // null until the first hook; dropped again when the last is removed, so that a call checks
  // one pointer. Moves with the module, and handles hold it weakly.
  std::shared_ptr<hook_detail::HookRegistry> hooks_;
  std::shared_ptr<hook_detail::HookRegistry> state_hooks_;  // the state dict hooks; null until the first
  bool training_ = true;
};

}  // namespace strata::nn
