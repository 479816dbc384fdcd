// Module hooks: per-module and global registries, their handles, and the call path operator()
// takes when any call hook is registered (forward, backward pre- and full backward hooks).
#include <algorithm>
#include <any>
#include <exception>
#include <string>

#include <strata/autograd/function.hpp>
#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

namespace hook_detail {

std::atomic<int> global_hook_count{0};

namespace {

// Never destroyed: a module called (or a handle removed) during static destruction, after this
// file's statics are gone, still finds the registry and its mutex.
const std::shared_ptr<HookRegistry>& global_registry() {
  static const auto* registry = new std::shared_ptr<HookRegistry>([] {
    auto r = std::make_shared<HookRegistry>();
    r->mutex = new std::mutex;
    return r;
  }());
  return *registry;
}

void recount_global(const HookRegistry& r) {
  global_hook_count.store(static_cast<int>(size_of(r.pre) + size_of(r.post) + size_of(r.backward) +
                                           size_of(r.backward_pre)),
                          std::memory_order_relaxed);
}

template <class Hook>
RemovableHandle add_to(const std::shared_ptr<HookRegistry>& r, HookList<Hook>& list, Hook hook, bool prepend,
                       bool always_call = false) {
  STRATA_CHECK(hook != nullptr, "[register_hook] the hook is empty");
  const uint64_t id = r->next_id++;
  auto changed = list ? std::make_shared<std::vector<HookEntry<Hook>>>(*list)
                      : std::make_shared<std::vector<HookEntry<Hook>>>();
  changed->insert(prepend ? changed->begin() : changed->end(), HookEntry<Hook>{id, std::move(hook), always_call});
  list = std::move(changed);
  return RemovableHandle(r, id);
}

template <class Hook> void remove_from(HookList<Hook>& list, uint64_t id) {
  if (!list || std::none_of(list->begin(), list->end(), [&](const auto& e) { return e.id == id; })) return;
  auto changed = std::make_shared<std::vector<HookEntry<Hook>>>(*list);
  std::erase_if(*changed, [&](const auto& e) { return e.id == id; });
  list = changed->empty() ? nullptr : std::move(changed);
}

}  // namespace

RemovableHandle add_global_hook(ForwardPreArgsHook hook) {
  const auto& r = global_registry();
  std::lock_guard<std::mutex> lock(*r->mutex);
  RemovableHandle h = add_to(r, r->pre, std::move(hook), false);
  recount_global(*r);
  return h;
}

RemovableHandle add_global_hook(ForwardArgsHook hook, bool always_call) {
  const auto& r = global_registry();
  std::lock_guard<std::mutex> lock(*r->mutex);
  RemovableHandle h = add_to(r, r->post, std::move(hook), false, always_call);
  recount_global(*r);
  return h;
}

RemovableHandle add_global_hook(BackwardArgsHook hook) {
  const auto& r = global_registry();
  std::lock_guard<std::mutex> lock(*r->mutex);
  RemovableHandle h = add_to(r, r->backward, std::move(hook), false);
  recount_global(*r);
  return h;
}

RemovableHandle add_global_backward_pre_hook(BackwardPreArgsHook hook) {
  const auto& r = global_registry();
  std::lock_guard<std::mutex> lock(*r->mutex);
  RemovableHandle h = add_to(r, r->backward_pre, std::move(hook), false);
  recount_global(*r);
  return h;
}

// The one-input forms act on the first input and output (Note [Hook forms]); a call has at least
// one input, and outputs are empty only on an always_call run after forward raised.
ForwardPreArgsHook pre_hook_from_one_input(ForwardPreHook hook) {
  if (!hook) return {};
  return [hook = std::move(hook)](Module& m, std::vector<Tensor>& inputs) -> std::optional<std::vector<Tensor>> {
    if (std::optional<Tensor> r = hook(m, inputs[0])) {
      STRATA_CHECK(r->defined(), "[{}] a pre-hook returned an undefined tensor", m.name());
      inputs[0] = std::move(*r);
    }
    return std::nullopt;
  };
}

ForwardArgsHook forward_hook_from_one_input(ForwardHook hook) {
  if (!hook) return {};
  return [hook = std::move(hook)](Module& m, const std::vector<Tensor>& inputs,
                                  std::vector<Tensor>& outputs) -> std::optional<std::vector<Tensor>> {
    if (std::optional<Tensor> r = hook(m, inputs[0], outputs.empty() ? Tensor() : outputs[0]); r && !outputs.empty()) {
      STRATA_CHECK(r->defined(), "[{}] a forward hook returned an undefined tensor", m.name());
      outputs[0] = std::move(*r);
    }
    return std::nullopt;
  };
}

BackwardArgsHook backward_hook_from_one_input(BackwardHook hook) {
  if (!hook) return {};
  return [hook = std::move(hook)](Module& m, std::vector<Tensor>& grad_inputs,
                                  const std::vector<Tensor>& grad_outputs) -> std::optional<std::vector<Tensor>> {
    if (std::optional<Tensor> r = hook(m, grad_inputs[0], grad_outputs[0])) grad_inputs[0] = std::move(*r);
    return std::nullopt;
  };
}

}  // namespace hook_detail

void RemovableHandle::remove() {
  std::shared_ptr<hook_detail::HookRegistry> r = registry_.lock();
  if (!r) return;  // the module is gone, or its hooks all removed already
  std::unique_lock<std::mutex> lock;
  if (r->mutex) lock = std::unique_lock<std::mutex>(*r->mutex);
  hook_detail::remove_from(r->pre, id_);
  hook_detail::remove_from(r->post, id_);
  hook_detail::remove_from(r->backward, id_);
  hook_detail::remove_from(r->backward_pre, id_);
  hook_detail::remove_from(r->state_dict_pre, id_);
  hook_detail::remove_from(r->state_dict_post, id_);
  hook_detail::remove_from(r->load_pre, id_);
  hook_detail::remove_from(r->load_post, id_);
  if (r->mutex) hook_detail::recount_global(*r);
  registry_.reset();
}

RemovableHandle Module::add_hook(ForwardPreArgsHook hook, bool prepend) {
  if (!hooks_) hooks_ = std::make_shared<hook_detail::HookRegistry>();
  return hook_detail::add_to(hooks_, hooks_->pre, std::move(hook), prepend);
}

RemovableHandle Module::add_hook(ForwardArgsHook hook, bool prepend, bool always_call) {
  if (!hooks_) hooks_ = std::make_shared<hook_detail::HookRegistry>();
  return hook_detail::add_to(hooks_, hooks_->post, std::move(hook), prepend, always_call);
}

RemovableHandle Module::add_backward_hook(BackwardArgsHook hook, bool prepend) {
  if (!hooks_) hooks_ = std::make_shared<hook_detail::HookRegistry>();
  return hook_detail::add_to(hooks_, hooks_->backward, std::move(hook), prepend);
}

RemovableHandle Module::add_backward_pre_hook(BackwardPreArgsHook hook, bool prepend) {
  if (!hooks_) hooks_ = std::make_shared<hook_detail::HookRegistry>();
  return hook_detail::add_to(hooks_, hooks_->backward_pre, std::move(hook), prepend);
}

// The state dict hooks live in state_hooks_, apart from the call hooks, so that a module with only
// these keeps its calls on the path without hooks (hooks_ stays null).
template <class Hook>
static RemovableHandle add_state_hook(std::shared_ptr<hook_detail::HookRegistry>& r,
                                      hook_detail::HookList<Hook> hook_detail::HookRegistry::*list, Hook hook) {
  if (!r) r = std::make_shared<hook_detail::HookRegistry>();
  return hook_detail::add_to(r, (*r).*list, std::move(hook), false);
}

RemovableHandle Module::register_state_dict_pre_hook(StateDictPreHook hook) {
  return add_state_hook(state_hooks_, &hook_detail::HookRegistry::state_dict_pre, std::move(hook));
}
RemovableHandle Module::register_state_dict_post_hook(StateDictPostHook hook) {
  return add_state_hook(state_hooks_, &hook_detail::HookRegistry::state_dict_post, std::move(hook));
}
RemovableHandle Module::register_load_state_dict_pre_hook(LoadStateDictPreHook hook) {
  return add_state_hook(state_hooks_, &hook_detail::HookRegistry::load_pre, std::move(hook));
}
RemovableHandle Module::register_load_state_dict_post_hook(LoadStateDictPostHook hook) {
  return add_state_hook(state_hooks_, &hook_detail::HookRegistry::load_post, std::move(hook));
}

namespace {

// Note [Full backward hooks]: as torch's BackwardHook, one call's inputs and outputs that require
// grad pass through two identity functions, one over all the inputs and one over all the outputs;
// the outputs' records grad_outputs after the backward pre-hooks replaced them, the inputs' runs
// the hooks with grad_inputs (or the outputs' does, with no grad_inputs, when no input needs one).
// Both lists are taken when the call runs forward, the global hooks first, as torch's.
struct BackwardHookCall {
  Module* module = nullptr;
  hook_detail::HookList<BackwardPreArgsHook> pre_hooks[2];  // global, the module's
  hook_detail::HookList<BackwardArgsHook> hooks[2];
  size_t num_inputs = 0, num_outputs = 0;
  std::vector<size_t> input_slots, output_slots;  // the inputs and outputs through the identities
  std::vector<Tensor> grad_outputs;

  // The full-length vector of `slots`' gradients, undefined elsewhere.
  static std::vector<Tensor> spread(const std::vector<Tensor>& grads, const std::vector<size_t>& slots, size_t n) {
    std::vector<Tensor> full(n);
    for (size_t i = 0; i < slots.size(); ++i) full[slots[i]] = grads[i];
    return full;
  }

  // The entries of `full` at `slots`, checked against the shapes, dtypes and devices of `grads`
  // (the engine's), as the engine checks a tensor hook's result; `allow_undefined`: an undefined
  // entry passes (no gradient flows there, as torch's None).
  std::vector<Tensor> gather(const std::vector<Tensor>& full, const std::vector<size_t>& slots,
                             const std::vector<Tensor>& grads, const char* hook, const char* of,
                             bool allow_undefined = false) const {
    std::vector<Tensor> out;
    for (size_t i = 0; i < slots.size(); ++i) {
      const Tensor &g = full[slots[i]], &want = grads[i];
      if (allow_undefined && !g.defined()) {
        out.emplace_back();
        continue;
      }
      STRATA_CHECK(g.defined() && g.shape() == want.shape() && g.dtype() == want.dtype() && g.device() == want.device(),
                   "[{}] a {} must return a gradient of shape {} ({}, {}) for {} {}, got {}", module->name(), hook,
                   want.shape(), want.dtype(), want.device(), of, slots[i],
                   g.defined() ? fmt::format("{} ({}, {})", g.shape(), g.dtype(), g.device())
                               : std::string("an undefined tensor"));
      out.push_back(g);
    }
    return out;
  }

  // The pre-hooks on `grads` (those of output_slots); keeps the result as grad_outputs and returns
  // it, of output_slots. A pre-hook may leave an output's gradient undefined (torch's None).
  std::vector<Tensor> run_pre(const std::vector<Tensor>& grads) {
    grad_outputs = spread(grads, output_slots, num_outputs);
    for (const auto& list : pre_hooks)
      if (list)
        for (const auto& e : *list)
          if (std::optional<std::vector<Tensor>> r = e.hook(*module, grad_outputs)) {
            STRATA_CHECK(r->size() == num_outputs, "[{}] a backward pre-hook must return {} output gradients, "
                         "got {}", module->name(), num_outputs, r->size());
            for (size_t i : output_slots) grad_outputs[i] = std::move((*r)[i]);
          }
    return gather(grad_outputs, output_slots, grads, "backward pre-hook", "output", /*allow_undefined=*/true);
  }

  // The hooks on `grads` (those of input_slots); returns the gradients they leave, of input_slots.
  std::vector<Tensor> run(const std::vector<Tensor>& grads) {
    std::vector<Tensor> grad_inputs = spread(grads, input_slots, num_inputs);
    // undefined output gradients when the gradient reached the inputs without the outputs (a
    // tensor forward kept elsewhere); taken, not kept: a later backward has its own, and the
    // graph does not hold them once the hooks ran
    const std::vector<Tensor> outs = grad_outputs.empty() ? std::vector<Tensor>(num_outputs) : std::move(grad_outputs);
    grad_outputs.clear();
    for (const auto& list : hooks)
      if (list)
        for (const auto& e : *list)
          if (std::optional<std::vector<Tensor>> r = e.hook(*module, grad_inputs, outs)) {
            STRATA_CHECK(r->size() == num_inputs, "[{}] a backward hook must return {} input gradients, got {}",
                         module->name(), num_inputs, r->size());
            for (size_t i : input_slots) grad_inputs[i] = std::move((*r)[i]);
          }
    return gather(grad_inputs, input_slots, grads, "backward hook", "input");
  }
};

using CallPtr = std::shared_ptr<BackwardHookCall>;

struct BackwardHookOutputs : autograd::Function<BackwardHookOutputs> {
  static std::vector<Tensor> forward(AutogradContext& ctx, const std::vector<Tensor>& outputs, const CallPtr& call) {
    ctx.saved_data["call"] = call;
    return outputs;
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grads) {
    const auto call = std::any_cast<CallPtr>(ctx.saved_data.at("call"));
    std::vector<Tensor> replaced = call->run_pre(grads);
    if (call->input_slots.empty()) call->run({});
    return replaced;
  }
};

struct BackwardHookInputs : autograd::Function<BackwardHookInputs> {
  static std::vector<Tensor> forward(AutogradContext& ctx, const std::vector<Tensor>& inputs, const CallPtr& call) {
    ctx.saved_data["call"] = call;
    return inputs;
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grads) {
    return std::any_cast<CallPtr>(ctx.saved_data.at("call"))->run(grads);
  }
};

// Passes the entries of `values` that require grad through Identity, recording their indices.
template <class Identity>
void through_identity(std::vector<Tensor>& values, std::vector<size_t>& slots, const CallPtr& call) {
  std::vector<Tensor> picked;
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].defined() && values[i].requires_grad()) {
      slots.push_back(i);
      picked.push_back(values[i]);
    }
  if (picked.empty()) return;
  std::vector<Tensor> passed = Identity::apply(picked, call);
  for (size_t i = 0; i < slots.size(); ++i) values[slots[i]] = std::move(passed[i]);
}

void check_replacement(const Module& m, const char* hook, const char* per, size_t got, size_t want) {
  STRATA_CHECK(got == want, "[{}] a {} must return {} tensors (one per {}), got {}", m.name(), hook, want, per, got);
}

}  // namespace

Tensor Module::call_with_hooks(const Tensor& input) {
  return call_hooked({input}, [this](const std::vector<Tensor>& in) { return forward(in[0]); });
}

std::vector<Tensor> Module::run_hooked(std::vector<Tensor> inputs,
                                       const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn) {
  STRATA_CHECK(!inputs.empty(), "[{}] a hooked call needs at least one input", name());
  if (hooks_ && hooks_->empty()) hooks_.reset();  // back to the one-check path
  // the lists as the call starts (HookList), global hooks first, as torch's
  hook_detail::HookList<ForwardPreArgsHook> pre[2];
  hook_detail::HookList<ForwardArgsHook> post[2];
  hook_detail::HookList<BackwardPreArgsHook> backward_pre[2];
  hook_detail::HookList<BackwardArgsHook> backward[2];
  auto take = [&](const hook_detail::HookRegistry& r, int at) {
    pre[at] = r.pre;
    post[at] = r.post;
    backward_pre[at] = r.backward_pre;
    backward[at] = r.backward;
  };
  if (has_global_forward_hooks()) {
    std::lock_guard<std::mutex> lock(*hook_detail::global_registry()->mutex);
    take(*hook_detail::global_registry(), 0);
  }
  if (hooks_) take(*hooks_, 1);
  CallPtr backward_call;
  if ((backward_pre[0] || backward_pre[1] || backward[0] || backward[1]) && autograd::is_grad_enabled()) {
    backward_call = std::make_shared<BackwardHookCall>();
    backward_call->module = this;
    for (int at = 0; at < 2; ++at) {
      backward_call->pre_hooks[at] = std::move(backward_pre[at]);
      backward_call->hooks[at] = std::move(backward[at]);
    }
  }

  std::vector<Tensor> outputs;
  size_t posts_called = 0;  // of post[0] then post[1]
  try {
    for (const auto& list : pre)
      if (list)
        for (const auto& e : *list)
          if (std::optional<std::vector<Tensor>> r = e.hook(*this, inputs)) {
            check_replacement(*this, "forward pre-hook", "input", r->size(), inputs.size());
            inputs = std::move(*r);
          }
    if (backward_call) {
      backward_call->num_inputs = inputs.size();
      through_identity<BackwardHookInputs>(inputs, backward_call->input_slots, backward_call);
    }
    outputs = fn(inputs);
    STRATA_CHECK(!outputs.empty(), "[{}] a hooked call returned no outputs", name());
    for (const auto& list : post)
      if (list)
        for (const auto& e : *list) {
          ++posts_called;
          if (std::optional<std::vector<Tensor>> r = e.hook(*this, inputs, outputs)) {
            check_replacement(*this, "forward hook", "output", r->size(), outputs.size());
            outputs = std::move(*r);
          }
        }
  } catch (...) {
    // the always_call hooks not yet called run (their errors dropped), and the first error goes on
    size_t index = 0;
    for (const auto& list : post)
      if (list)
        for (const auto& e : *list)
          if (index++ >= posts_called && e.always_call) try {
              e.hook(*this, inputs, outputs);
            } catch (...) {
            }
    throw;
  }
  if (backward_call) {
    backward_call->num_outputs = outputs.size();
    through_identity<BackwardHookOutputs>(outputs, backward_call->output_slots, backward_call);
  }
  return outputs;
}

}  // namespace strata::nn
