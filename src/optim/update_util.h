// What the optimizer implementations share: dtype dispatch over the two parameter dtypes,
// lazily created state tensors (on the parameter's device), and option checks with uniform
// messages.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <strata/ops/creation.hpp>
#include <strata/optim/optimizer.hpp>

#include "core/tensor_internal.h"

namespace strata::optim::detail {

/// Calls f((T*)nullptr) with T = float or double, the parameter's dtype (checked by Optimizer).
template <class F>
void dispatch_param(DType dtype, F&& f) {
  if (dtype == kFloat64) {
    f(static_cast<double*>(nullptr));
  } else {
    STRATA_CHECK(dtype == kFloat32, "[optim] unsupported parameter dtype {}", dtype);
    f(static_cast<float*>(nullptr));
  }
}

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data());
}

// Note [Parameter layouts]
// The updates are fused passes over a parameter's memory, its grad's and its states', element
// i of each at the same offset. A parameter is contiguous, or channels-last when 4-d (conv
// weights after Module::to(MemoryFormat::ChannelsLast)); its grad and every state shaped like it
// are put in the same layout, so the offsets agree. State dicts hold logical values, so a
// checkpoint loads into either layout. Adam8bit's flat 8-bit codes are in C order, so a
// channels-last parameter keeps 32-bit moments there (its `quantized`); its state_from_dict
// decodes or encodes a dict saved for the other layout.

/// The layout `p` is updated in (Note [Parameter layouts]).
inline MemoryFormat param_format(const Tensor& p) { return strata::detail::suggested_format(p); }

/// t laid out in `format`: itself when it already is, else a copy.
inline Tensor in_format(const Tensor& t, MemoryFormat format) {
  if (t.is_contiguous(format)) return t;
  return format == MemoryFormat::Contiguous ? t.contiguous() : t.to(format);
}

/// A state tensor laid out as the update needs: like `p` when shaped like it, else contiguous.
inline Tensor state_layout(const Tensor& t, const Tensor& p) {
  return in_format(t, t.shape() == p.shape() ? param_format(p) : MemoryFormat::Contiguous);
}

/// The state tensor `name`, created when missing: shaped and laid out like `like`, of its
/// dtype, on its device, filled with `fill` (rounded once to the dtype).
inline Tensor& state_tensor(ParamState& st, const std::string& name, const Tensor& like, double fill = 0) {
  auto it = st.tensors.find(name);
  if (it == st.tensors.end()) {
    Tensor t = full(like.shape(), fill, TensorOptions(like.dtype(), like.device()));
    it = st.tensors.emplace(name, state_layout(t, like)).first;
  }
  return it->second;
}

/// The state tensor `name`, created zero-filled with the given shape and dtype on `device`
/// when missing.
inline Tensor& zeros_state(ParamState& st, const std::string& name, const Shape& shape, DType dtype, Device device) {
  auto it = st.tensors.find(name);
  if (it == st.tensors.end()) it = st.tensors.emplace(name, zeros(shape, TensorOptions(dtype, device))).first;
  return it->second;
}

/// Runs `update(param, grad, state)`, a CPU-only update, for each CUDA parameter of `batch` on
/// host copies laid out as the parameter, then writes the parameter and its state back.
template <class F>
void update_on_host(const std::vector<ParamUpdate>& batch, F&& update) {
  for (const ParamUpdate& u : batch) {
    const MemoryFormat format = param_format(u.param);
    Tensor p = in_format(u.param.to(kCPU), format);
    Tensor g = in_format(u.grad.to(kCPU), format);
    ParamState host{u.state->step, {}};
    for (const auto& [name, t] : u.state->tensors) host.tensors.emplace(name, state_layout(t.to(kCPU), p));
    update(p, g, host);
    u.param.copy_(p);
    for (auto& [name, t] : host.tensors) {
      auto it = u.state->tensors.find(name);
      if (it != u.state->tensors.end()) it->second.copy_(t);
      else u.state->tensors.emplace(name, state_layout(t.to(u.param.device()), u.param));
    }
    u.state->step = host.step;
  }
}

// f(i, p_i, g_i) over the parameter's elements in double, g_i already negated when maximize
// and with the L2 term added unless `decoupled`, which instead scales p by 1 - lr * wd first.
template <class T, class F>
void for_each_element(const Tensor& p, const Tensor& grad, bool maximize, double lr, double wd, bool decoupled,
                      F&& f) {
  T* pp = detail::ptr<T>(p);
  const T* gp = detail::ptr<T>(grad);
  const double sign = maximize ? -1.0 : 1.0;
  for (int64_t i = 0, n = p.numel(); i < n; ++i) {
    double pi = pp[i], gi = sign * static_cast<double>(gp[i]);
    if (decoupled) pi *= 1 - lr * wd;
    else gi += wd * pi;
    f(i, pi, gi);
    pp[i] = static_cast<T>(pi);
  }
}

inline void check_nonneg(const char* opt, const char* what, double v) {
  STRATA_CHECK(v >= 0 && v < std::numeric_limits<double>::infinity(), "[{}] invalid {}: {} (must be finite and >= 0)",
               opt, what, v);
}

inline void check_beta(const char* opt, const char* what, double v) {
  STRATA_CHECK(v >= 0 && v < 1, "[{}] invalid {}: {} (must be in [0, 1))", opt, what, v);
}

}  // namespace strata::optim::detail
