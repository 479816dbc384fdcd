// Whether ops record the autograd graph on this thread: NoGradGuard turns recording off for a
// scope (inference, optimizer updates), EnableGradGuard turns it back on.
#pragma once

#include <strata/core/export.hpp>

namespace strata::autograd {

STRATA_API bool is_grad_enabled();
STRATA_API void set_grad_enabled(bool enabled);

class STRATA_API NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

class STRATA_API EnableGradGuard {
 public:
  explicit EnableGradGuard(bool enabled = true) : prev_(is_grad_enabled()) { set_grad_enabled(enabled); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace strata

namespace strata {
using autograd::EnableGradGuard;
using autograd::NoGradGuard;
}  // namespace strata
