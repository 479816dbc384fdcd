// Runs the state dict hooks (nn/hooks.hpp) of a module tree, for Module::state_dict() and
// load_state_dict(): every registration of a module, in registration order, with its dotted
// prefix; pre-hooks before a module's children, post-hooks after them, as torch's recursion runs them.
#pragma once

#include <string>

#include <strata/nn/module.hpp>

namespace strata::nn {

struct StateDictHooks {
  static void state_dict_pre(const Module& root);
  static void state_dict_post(const Module& root, StateDict& dict);
  static bool has_load_pre(const Module& root);
  static bool has_load_post(const Module& root);
  static void load_pre(Module& root, StateDict& dict);
  static void load_post(Module& root, LoadResult& keys);

 private:
  template <class Hook> using Member = hook_detail::HookList<Hook> hook_detail::HookRegistry::*;
  template <class Hook, class Call>
  static void walk(const Module& m, const std::string& prefix, Member<Hook> member, bool post_order, const Call& call);
  template <class Hook> static bool any(const Module& m, Member<Hook> member);
};

}  // namespace strata::nn
