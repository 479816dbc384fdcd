// Module forward hooks: per-module and global registries, their handles, and the call path
// operator() takes when any hook is registered.
#include <algorithm>
#include <any>
#include <exception>

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
  global_hook_count.store(static_cast<int>(r.pre.size() + r.post.size()), std::memory_order_relaxed);
}

template <class Hook>
RemovableHandle add_to(const std::shared_ptr<HookRegistry>& r, std::vector<HookEntry<Hook>>& list, Hook hook,
                       bool prepend, bool always_call = false) {
  STRATA_CHECK(hook != nullptr, "[register_forward_hook] the hook is empty");
  const uint64_t id = r->next_id++;
  list.insert(prepend ? list.begin() : list.end(), HookEntry<Hook>{id, std::move(hook), always_call});
  return RemovableHandle(r, id);
}

}  // namespace

RemovableHandle add_global_hook(ForwardPreHook hook) {
  const auto& r = global_registry();
  std::lock_guard<std::mutex> lock(global_mutex);
  RemovableHandle h = add_to(r, r->pre, std::move(hook), false);
  recount_global(*r);
  return h;
}

RemovableHandle add_global_hook(ForwardHook hook, bool always_call) {
  const auto& r = global_registry();
  std::lock_guard<std::mutex> lock(global_mutex);
  RemovableHandle h = add_to(r, r->post, std::move(hook), false, always_call);
  recount_global(*r);
  return h;
}

}  // namespace hook_detail

void RemovableHandle::remove() {
  std::shared_ptr<hook_detail::HookRegistry> r = registry_.lock();
  if (!r) return;  // the module is gone, or its hooks all removed already
  std::unique_lock<std::mutex> lock;
  if (r->mutex) lock = std::unique_lock<std::mutex>(*r->mutex);
  auto has_id = [&](const auto& e) { return e.id == id_; };
  std::erase_if(r->pre, has_id);
  std::erase_if(r->post, has_id);
  std::erase_if(r->backward, has_id);
  if (r->mutex) hook_detail::recount_global(*r);
  registry_.reset();
}

RemovableHandle Module::add_hook(ForwardPreHook hook, bool prepend) {
  if (!hooks_) hooks_ = std::make_shared<hook_detail::HookRegistry>();
  return hook_detail::add_to(hooks_, hooks_->pre, std::move(hook), prepend);
}

RemovableHandle Module::add_hook(ForwardHook hook, bool prepend, bool always_call) {
  if (!hooks_) hooks_ = std::make_shared<hook_detail::HookRegistry>();
  return hook_detail::add_to(hooks_, hooks_->post, std::move(hook), prepend, always_call);
}

RemovableHandle Module::add_backward_hook(BackwardHook hook, bool prepend) {
  if (!hooks_) hooks_ = std::make_shared<hook_detail::HookRegistry>();
  return hook_detail::add_to(hooks_, hooks_->backward, std::move(hook), prepend);
}

namespace {

// Note [Full backward hooks]: as torch's BackwardHook, one call's input and output pass through
// identity functions; the output's records grad_output, the input's runs the hooks with
// grad_input (or the output's does, with no grad_input, when the input needs none).
struct BackwardHookCall {
  Module* module = nullptr;
  std::vector<BackwardHook> hooks;
  Tensor grad_output;
  bool input_requires_grad = false;

  Tensor run(Tensor grad_input) const {
    for (const BackwardHook& h : hooks)
      if (std::optional<Tensor> r = h(*module, grad_input, grad_output); r && grad_input.defined()) {
        STRATA_CHECK(r->defined() && r->shape() == grad_input.shape(), "[{}] a backward hook must return a "
                     "gradient of shape {} for the input, got {}", module->name(), grad_input.shape(),
                     r->defined() ? fmt::format("{}", r->shape()) : std::string("an undefined tensor"));
        grad_input = std::move(*r);
      }
    return grad_input;
  }
};

using CallPtr = std::shared_ptr<BackwardHookCall>;

struct BackwardHookOutput : autograd::Function<BackwardHookOutput> {
  static Tensor forward(AutogradContext& ctx, const Tensor& output, const CallPtr& call) {
    ctx.saved_data["call"] = call;
    return output;
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grads) {
    const auto call = std::any_cast<CallPtr>(ctx.saved_data.at("call"));
    call->grad_output = grads[0];
    if (!call->input_requires_grad) call->run(Tensor());
    return {grads[0]};
  }
};

struct BackwardHookInput : autograd::Function<BackwardHookInput> {
  static Tensor forward(AutogradContext& ctx, const Tensor& input, const CallPtr& call) {
    ctx.saved_data["call"] = call;
    return input;
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grads) {
    return {std::any_cast<CallPtr>(ctx.saved_data.at("call"))->run(grads[0])};
  }
};

}  // namespace

Tensor Module::call_with_hooks(const Tensor& input) {
  if (hooks_ && hooks_->empty()) hooks_.reset();  // back to the one-check path
  // copies, so that a hook may add or remove hooks (its own included) while they run
  std::vector<hook_detail::HookEntry<ForwardPreHook>> pre;
  std::vector<hook_detail::HookEntry<ForwardHook>> post;
  auto take = [&](const hook_detail::HookRegistry& r) {
    pre.insert(pre.end(), r.pre.begin(), r.pre.end());
    post.insert(post.end(), r.post.begin(), r.post.end());
  };
  if (has_global_forward_hooks()) {  // global hooks first, as torch's
    std::lock_guard<std::mutex> lock(hook_detail::global_mutex);
    take(*hook_detail::global_registry());
  }
  if (hooks_) take(*hooks_);
  CallPtr backward_call;
  if (hooks_ && !hooks_->backward.empty() && autograd::is_grad_enabled()) {
    backward_call = std::make_shared<BackwardHookCall>();
    backward_call->module = this;
    for (const auto& e : hooks_->backward) backward_call->hooks.push_back(e.hook);
  }

  Tensor x = input, out;
  size_t posts_called = 0;
  try {
    for (const auto& e : pre)
      if (std::optional<Tensor> r = e.hook(*this, x)) {
        STRATA_CHECK(r->defined(), "[{}] a forward pre-hook returned an undefined tensor", name());
        x = std::move(*r);
      }
    if (backward_call && x.requires_grad()) {
      backward_call->input_requires_grad = true;
      x = BackwardHookInput::apply(x, backward_call);
    }
    out = forward(x);
    for (const auto& e : post) {
      ++posts_called;
      if (std::optional<Tensor> r = e.hook(*this, x, out)) {
        STRATA_CHECK(r->defined(), "[{}] a forward hook returned an undefined tensor", name());
        out = std::move(*r);
      }
    }
  } catch (...) {
    // the always_call hooks not yet called run (their errors dropped), and the first error goes on
    for (size_t i = posts_called; i < post.size(); ++i)
      if (post[i].always_call) try {
          post[i].hook(*this, x, out);
        } catch (...) {
        }
    throw;
  }
  if (backward_call && out.requires_grad()) out = BackwardHookOutput::apply(out, backward_call);
  return out;
}

}  // namespace strata::nn
