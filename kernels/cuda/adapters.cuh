// Device functors that wrap the shared per-element math of kernels/common for the launcher:
// storage type T in and out, computing in compute_t<T> (float for float16/bfloat16), as the
// CPU kernels do. Plain structs, so no extended lambdas are needed.
#pragma once

#include <type_traits>

#include "../common/compare_math.h"
#include "../common/convert.h"
#include "../common/half.h"

namespace strata::cuda_kernels {

template <class F, class T>
struct UnaryFn {
  F f;
  __device__ __forceinline__ T operator()(T v) const { return static_cast<T>(f(static_cast<compute_t<T>>(v))); }
};

template <class F, class T, class Out>
struct BinaryFn {
  F f;
  __device__ __forceinline__ Out operator()(T x, T y) const {
    using C = compute_t<T>;
    return static_cast<Out>(f(static_cast<C>(x), static_cast<C>(y)));
  }
};

template <class T>
struct LogicalNotFn {
  __device__ __forceinline__ bool operator()(T v) const { return !convert<bool>(v); }
};

template <class T>
struct WhereFn {
  __device__ __forceinline__ T operator()(bool c, T x, T y) const { return c ? x : y; }
};

template <class T>
struct IsCloseFn {
  math::IsClose f;
  __device__ __forceinline__ bool operator()(T x, T y) const {
    if constexpr (std::is_integral_v<T>) return f.integers(x, y);
    else return f(convert<double>(x), convert<double>(y));
  }
};

template <class In, class Out>
struct ConvertFn {
  __device__ __forceinline__ Out operator()(In v) const { return convert<Out>(v); }
};

template <class T>
struct FillFn {
  T value;
  __device__ __forceinline__ T operator()() const { return value; }
};

}  // namespace strata::cuda_kernels
