// Factories: new tensors filled with constants, ranges or random numbers, and tensors made
// from user memory.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <type_traits>
#include <vector>

#include <strata/core/generator.hpp>
#include <strata/core/tensor.hpp>

namespace strata {

/// Parameters of the fill / random / range kernels.
struct FillParams {
  Scalar value;
};
struct RandomParams {
  uint64_t seed = 0;
  uint64_t offset = 0;  // first Philox counter of the draw
  double a = 0;         // uniform: low; normal: mean; randint: low
  double b = 1;         // uniform: high; normal: std; randint: high (exclusive)
  Generator* generator = nullptr;  // where the draw came from, and its length in Philox blocks:
  uint64_t blocks = 0;             // a CUDA graph redraws them on each replay
};
struct RangeParams {
  double start = 0;
  double step = 1;
  int64_t count = 0;
  double end = 0;          // linspace: the exact last value
  bool is_linspace = false;
};

/// Uninitialised memory.
STRATA_API Tensor empty(const Shape& shape, TensorOptions options = {});
STRATA_API Tensor zeros(const Shape& shape, TensorOptions options = {});
STRATA_API Tensor ones(const Shape& shape, TensorOptions options = {});
STRATA_API Tensor full(const Shape& shape, Scalar value, TensorOptions options = {});
/// A 0-d tensor holding `value`.
STRATA_API Tensor scalar_tensor(Scalar value, TensorOptions options = {});
/// [start, end) in steps of `step`; int64 when all three are integers, else float32, unless
/// options says otherwise. An integer dtype truncates the three toward zero first (a step
/// that truncates to 0 raises).
STRATA_API Tensor arange(Scalar end, std::optional<TensorOptions> options = std::nullopt);
STRATA_API Tensor arange(Scalar start, Scalar end, Scalar step = 1, std::optional<TensorOptions> options = std::nullopt);
/// `steps` evenly spaced values from start to end inclusive.
STRATA_API Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
STRATA_API Tensor eye(int64_t n, std::optional<int64_t> m = std::nullopt, TensorOptions options = {});

/// Uniform on [0, 1).
STRATA_API Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
/// Standard normal.
STRATA_API Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
/// Uniform integers on [low, high); int64 unless options says otherwise.
STRATA_API Tensor randint(int64_t low, int64_t high, const Shape& shape,
                          std::optional<TensorOptions> options = std::nullopt, Generator* gen = nullptr);
/// Fills `t` in place with uniform values on [low, high) / normals (mean, std).
STRATA_API Tensor& uniform_(Tensor& t, double low = 0, double high = 1, Generator* gen = nullptr);
STRATA_API Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);

STRATA_API Tensor empty_like(const Tensor& t, std::optional<TensorOptions> options = std::nullopt);
STRATA_API Tensor zeros_like(const Tensor& t, std::optional<TensorOptions> options = std::nullopt);
STRATA_API Tensor ones_like(const Tensor& t, std::optional<TensorOptions> options = std::nullopt);
STRATA_API Tensor full_like(const Tensor& t, Scalar value, std::optional<TensorOptions> options = std::nullopt);
STRATA_API Tensor rand_like(const Tensor& t, Generator* gen = nullptr);
STRATA_API Tensor randn_like(const Tensor& t, Generator* gen = nullptr);

/// A random permutation of [0, n), int64 unless options say otherwise.
STRATA_API Tensor randperm(int64_t n, TensorOptions options = TensorOptions(kInt64), Generator* gen = nullptr);
/// 1 with probability p (each element of p in [0, 1]) else 0, in p's dtype.
STRATA_API Tensor bernoulli(const Tensor& p, Generator* gen = nullptr);

/// Copies `values` into a new CPU tensor of the given shape (1-d when shape is omitted).
template <class T>
Tensor from_vector(const std::vector<T>& values, std::optional<Shape> shape = std::nullopt);
/// Wraps memory strata does not own, without copying. `deleter` (may be empty) runs when
/// the last view of the tensor is destroyed. Strides default to C order.
STRATA_API Tensor from_blob(void* data, const Shape& shape, DType dtype,
                            std::function<void(void*)> deleter = {}, std::optional<Strides> strides = std::nullopt,
                            Device device = kCPU);

namespace detail {
STRATA_API Tensor from_host_bytes(const void* data, size_t count, DType dtype, const Shape& shape);
}

template <class T>
Tensor from_vector(const std::vector<T>& values, std::optional<Shape> shape) {
  Shape s = shape ? *shape : Shape{static_cast<int64_t>(values.size())};
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return detail::from_host_bytes(bytes.data(), bytes.size(), kBool, s);
  } else {
    return detail::from_host_bytes(values.data(), values.size(), dtype_of_v<T>, s);
  }
}

namespace detail {
template <class T>
Tensor literal(const std::vector<T>& flat, const Shape& shape, std::optional<DType> dtype, Device device) {
  constexpr bool kBoolean = std::is_same_v<T, bool>, kInteger = std::is_integral_v<T> && !kBoolean;
  using Stored = std::conditional_t<kBoolean, bool, std::conditional_t<kInteger, int64_t, double>>;
  const DType natural = kBoolean ? kBool : kInteger ? kInt64 : kFloat32;
  const Tensor t = from_vector(std::vector<Stored>(flat.begin(), flat.end()), shape);
  return t.to(device, dtype.value_or(natural));
}
}  // namespace detail

/// A tensor written out, as torch::tensor: tensor({1.5, 2.0}) is float32, tensor({1, 2})
/// int64, tensor({true, false}) bool, unless `dtype` says otherwise; nested lists make 2-d
/// tensors, every row as long as the first.
template <class T>
Tensor tensor(std::initializer_list<T> values, std::optional<DType> dtype = std::nullopt, Device device = kCPU) {
  return detail::literal(std::vector<T>(values), {static_cast<int64_t>(values.size())}, dtype, device);
}
template <class T>
Tensor tensor(std::initializer_list<std::initializer_list<T>> rows, std::optional<DType> dtype = std::nullopt,
              Device device = kCPU) {
  std::vector<T> flat;
  const int64_t cols = rows.size() == 0 ? 0 : static_cast<int64_t>(rows.begin()->size());
  for (const auto& row : rows) {
    STRATA_CHECK(static_cast<int64_t>(row.size()) == cols, "[tensor] rows of {} and {} values; every row must be as "
                 "long as the first", cols, row.size());
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return detail::literal(flat, {static_cast<int64_t>(rows.size()), cols}, dtype, device);
}

}  // namespace strata
