// What the optimizer implementations share: dtype dispatch over the two parameter dtypes,
// lazily created state tensors, and option checks with uniform messages.
#pragma once

#include <algorithm>
#include <cmath>
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

/// The state tensor `name`, created filled with `fill` (exactly, in the parameter's dtype)
/// and shaped like `like` when missing.
inline Tensor& state_tensor(ParamState& st, const std::string& name, const Tensor& like, double fill = 0) {
  auto it = st.tensors.find(name);
  if (it == st.tensors.end()) {
    Tensor t = empty(like.shape(), TensorOptions(like.dtype(), like.device()));
    dispatch_param(like.dtype(), [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      std::fill(ptr<T>(t), ptr<T>(t) + t.numel(), static_cast<T>(fill));
    });
    it = st.tensors.emplace(name, t).first;
  }
  return it->second;
}

inline void check_nonneg(const char* opt, const char* what, double v) {
  STRATA_CHECK(v >= 0, "[{}] invalid {}: {} (must be >= 0)", opt, what, v);
}

inline void check_beta(const char* opt, const char* what, double v) {
  STRATA_CHECK(v >= 0 && v < 1, "[{}] invalid {}: {} (must be in [0, 1))", opt, what, v);
}

}  // namespace strata::optim::detail
