// What the optimizer implementations share: dtype dispatch over the two parameter dtypes,
// lazily created state tensors (on the parameter's device), and option checks with uniform
// messages.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include <strata/ops/creation.hpp>
#include <strata/optim/optimizer.hpp>

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

/// The state tensor `name`, created when missing: shaped like `like`, of its dtype, on its
/// device, filled with `fill` (rounded once to the dtype).
inline Tensor& state_tensor(ParamState& st, const std::string& name, const Tensor& like, double fill = 0) {
  auto it = st.tensors.find(name);
  if (it == st.tensors.end())
    it = st.tensors.emplace(name, full(like.shape(), fill, TensorOptions(like.dtype(), like.device()))).first;
  return it->second;
}

/// The state tensor `name`, created zero-filled with the given shape and dtype on `device`
/// when missing.
inline Tensor& zeros_state(ParamState& st, const std::string& name, const Shape& shape, DType dtype, Device device) {
  auto it = st.tensors.find(name);
  if (it == st.tensors.end()) it = st.tensors.emplace(name, zeros(shape, TensorOptions(dtype, device))).first;
  return it->second;
}

inline void check_nonneg(const char* opt, const char* what, double v) {
  STRATA_CHECK(v >= 0 && v < std::numeric_limits<double>::infinity(), "[{}] invalid {}: {} (must be finite and >= 0)",
               opt, what, v);
}

inline void check_beta(const char* opt, const char* what, double v) {
  STRATA_CHECK(v >= 0 && v < 1, "[{}] invalid {}: {} (must be in [0, 1))", opt, what, v);
}

}  // namespace strata::optim::detail
