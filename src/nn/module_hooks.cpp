// Module forward hooks: per-module and global registries, their handles, and the call path
// operator() takes when any hook is registered.
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

std::mutex global_mutex;

const std::shared_ptr<HookRegistry>& global_registry() {
  static const std::shared_ptr<HookRegistry> registry = [] {
    auto r = std::make_shared<HookRegistry>();
    r->mutex = &global_mutex;
    return r;
  }();
  return registry;
}

void recount_global(const HookRegistry& r) {
  global_hook_count.store(static_cast<int>(size_of(r.pre) + size_of(r.post)), std::memory_order_relaxed);
}

template <class Hook>
RemovableHandle add_to(const std::shared_ptr<HookRegistry>& r, HookList<Hook>& list, Hook hook, bool prepend,
                       bool always_call = false) {
  STRATA_CHECK(hook != nullptr, "[register_forward_hook] the hook is empty");
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
  std::lock_guard<std::mutex> lock(global_mutex);
  RemovableHandle h = add_to(r, r->pre, std::move(hook), false);
  recount_global(*r);
  return h;
}

RemovableHandle add_global_hook(ForwardArgsHook hook, bool always_call) {
  const auto& r = global_registry();
  std::lock_guard<std::mutex> lock(global_mutex);
  RemovableHandle h = add_to(r, r->post, std::move(hook), false, always_call);
  recount_global(*r);
  return h;
}

// The one-input forms act on the first input and output (Note [Hook forms]); a call has at least
// one input, and outputs are empty only on an always_call run after forward raised.
ForwardPreArgsHook pre_hook_from_one_input(ForwardPreHook hook) {
  if (!hook) return {};
  return [hook = std::move(hook)](Module& m, std::vector<Tensor>& inputs) -> std::optional<std::vector<Tensor>> {
    if (std::optional<Tensor> r = hook(m, inputs[0])) {
      STRATA_CHECK(r->defined(), "[{}] a forward pre-hook returned an undefined tensor", m.name());
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

namespace {

// Note [Full backward hooks]: as torch's BackwardHook, one call's inputs and outputs that require
// grad pass through two identity functions, one over all the inputs and one over all the outputs;
// the outputs' records grad_outputs, the inputs' runs the hooks with grad_inputs (or the outputs'
// does, with no grad_inputs, when no input needs one).
struct BackwardHookCall {
  Module* module = nullptr;
  hook_detail::HookList<BackwardArgsHook> hooks;
  size_t num_inputs = 0, num_outputs = 0;
  std::vector<size_t> input_slots, output_slots;  // the inputs and outputs through the identities
  std::vector<Tensor> grad_outputs;

  // The full-length vector of `slots`' gradients, undefined elsewhere.
  static std::vector<Tensor> spread(const std::vector<Tensor>& grads, const std::vector<size_t>& slots, size_t n) {
    std::vector<Tensor> full(n);
    for (size_t i = 0; i < slots.size(); ++i) full[slots[i]] = grads[i];
    return full;
  }

  // The hooks on `grads` (those of input_slots); returns the gradients they leave, of input_slots.
  std::vector<Tensor> run(const std::vector<Tensor>& grads) const {
    std::vector<Tensor> grad_inputs = spread(grads, input_slots, num_inputs);
    // undefined output gradients when the gradient reached the inputs without the outputs (a
    // tensor forward kept elsewhere)
    const std::vector<Tensor> outs = grad_outputs.empty() ? std::vector<Tensor>(num_outputs) : grad_outputs;
    for (const auto& e : *hooks)
      if (std::optional<std::vector<Tensor>> r = e.hook(*module, grad_inputs, outs)) {
        STRATA_CHECK(r->size() == num_inputs, "[{}] a backward hook must return {} input gradients, got {}",
                     module->name(), num_inputs, r->size());
        for (size_t i : input_slots) grad_inputs[i] = std::move((*r)[i]);
      }
    std::vector<Tensor> out;
    for (size_t i = 0; i < input_slots.size(); ++i) {
      const Tensor& g = grad_inputs[input_slots[i]];
      STRATA_CHECK(g.defined() && g.shape() == grads[i].shape(), "[{}] a backward hook must return a gradient of "
                   "shape {} for input {}, got {}", module->name(), grads[i].shape(), input_slots[i],
                   g.defined() ? fmt::format("{}", g.shape()) : std::string("an undefined tensor"));
      out.push_back(g);
    }
    return out;
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
    call->grad_outputs = BackwardHookCall::spread(grads, call->output_slots, call->num_outputs);
    if (call->input_slots.empty()) call->run({});
    return grads;
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
  if (has_global_forward_hooks()) {
    std::lock_guard<std::mutex> lock(hook_detail::global_mutex);
    pre[0] = hook_detail::global_registry()->pre;
    post[0] = hook_detail::global_registry()->post;
  }
  if (hooks_) {
    pre[1] = hooks_->pre;
    post[1] = hooks_->post;
  }
  CallPtr backward_call;
  if (hooks_ && hooks_->backward && autograd::is_grad_enabled()) {
    backward_call = std::make_shared<BackwardHookCall>();
    backward_call->module = this;
    backward_call->hooks = hooks_->backward;
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
