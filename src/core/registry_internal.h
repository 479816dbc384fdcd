// How built-in kernels get into the registry: at first use, the registry hands itself to
// register_builtin_kernels(), which calls each op family's register function.
#pragma once

#include <initializer_list>

#include <strata/core/registry.hpp>

namespace strata::detail {

class KernelTable {
 public:
  virtual ~KernelTable() = default;
  virtual void set(OpId op, DeviceType device, DType dtype, KernelFn kernel) = 0;
  void set(OpId op, DeviceType device, std::initializer_list<DType> dtypes, const KernelFn& kernel) {
    for (DType t : dtypes) set(op, device, t, kernel);
  }
};

// Defined in src/ops/register.cpp.
void register_builtin_kernels(KernelTable& table);

inline constexpr std::initializer_list<DType> kAllDTypes = {kBool, kUInt8, kInt8, kInt32, kInt64,
                                                            kFloat16, kBFloat16, kFloat32, kFloat64};
inline constexpr std::initializer_list<DType> kNumericDTypes = {kUInt8, kInt8, kInt32, kInt64,
                                                                kFloat16, kBFloat16, kFloat32, kFloat64};
inline constexpr std::initializer_list<DType> kFloatDTypes = {kFloat16, kBFloat16, kFloat32, kFloat64};

}  // namespace strata::detail
