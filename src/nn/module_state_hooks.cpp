// The state dict hooks' runs over a module tree (module_state_hooks.h); their registration is with
// the other hooks' in module_hooks.cpp.
#include "nn/module_state_hooks.h"

namespace strata::nn {

template <class Hook, class Call>
void StateDictHooks::walk(const Module& m, const std::string& prefix, Member<Hook> member, bool post_order,
                          const Call& call) {
  auto own = [&] {
    if (!m.state_hooks_) return;
    // the list as it starts: a hook may add or remove hooks, its own included
    const hook_detail::HookList<Hook> list = (*m.state_hooks_).*member;
    if (list)
      for (const auto& e : *list) call(e.hook, m, prefix);
  };
  if (!post_order) own();
  for (const auto& [name, child] : m.registered_children()) walk(*child, prefix + name + ".", member, post_order, call);
  if (post_order) own();
}

template <class Hook> bool StateDictHooks::any(const Module& m, Member<Hook> member) {
  if (m.state_hooks_ && hook_detail::size_of((*m.state_hooks_).*member) > 0) return true;
  for (const auto& [name, child] : m.registered_children())
    if (any(*child, member)) return true;
  return false;
}

void StateDictHooks::state_dict_pre(const Module& root) {
  walk(root, "", &hook_detail::HookRegistry::state_dict_pre, false,
       [](const StateDictPreHook& hook, const Module& m, const std::string& prefix) { hook(m, prefix); });
}

void StateDictHooks::state_dict_post(const Module& root, StateDict& dict) {
  walk(root, "", &hook_detail::HookRegistry::state_dict_post, true,
       [&](const StateDictPostHook& hook, const Module& m, const std::string& prefix) { hook(m, dict, prefix); });
}

bool StateDictHooks::has_load_pre(const Module& root) { return any(root, &hook_detail::HookRegistry::load_pre); }
bool StateDictHooks::has_load_post(const Module& root) { return any(root, &hook_detail::HookRegistry::load_post); }

// The load hooks take the module non-const: load_state_dict holds the root so, and the children
// are the parent's own (registered_children hands out non-const pointers).
void StateDictHooks::load_pre(Module& root, StateDict& dict) {
  walk(root, "", &hook_detail::HookRegistry::load_pre, false,
       [&](const LoadStateDictPreHook& hook, const Module& m, const std::string& prefix) {
         hook(const_cast<Module&>(m), dict, prefix);
       });
}

void StateDictHooks::load_post(Module& root, LoadResult& keys) {
  walk(root, "", &hook_detail::HookRegistry::load_post, true,
       [&](const LoadStateDictPostHook& hook, const Module& m, const std::string&) {
         hook(const_cast<Module&>(m), keys);
       });
}

}  // namespace strata::nn
