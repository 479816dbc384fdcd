// Automatic mixed precision: inside an autocast region the GEMM and convolution family runs in
// a 16-bit dtype and the precision-sensitive ops (softmax, norms, losses, exp/log, sums) in
// float32, each op casting its own inputs (docs/amp.md lists the ops). The casts are recorded
// by autograd, so gradients reach float32 parameters in float32.
//
//   {
//     amp::AutocastGuard autocast(DeviceType::CPU, kBFloat16);
//     loss = nn::functional::cross_entropy(model(x), y);  // linear/conv in bf16, the loss in f32
//   }
//   scaler.scale(loss).backward();  // backward outside the region, as in PyTorch
//
// The state is per thread and per device type; a tensor's device type picks the state its ops see.
#pragma once

#include <cstdint>
#include <concepts>
#include <iterator>
#include <string_view>
#include <vector>

#include <strata/core/device.hpp>
#include <strata/core/dtype.hpp>
#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::amp {

/// Whether ops on tensors of `device` autocast on this thread.
STRATA_API bool is_autocast_enabled(DeviceType device);
/// The dtype the low-precision ops run in on `device` (float16 or bfloat16); bfloat16 on the CPU
/// and float16 on CUDA until a region says otherwise.
STRATA_API DType autocast_dtype(DeviceType device);

/// An autocast region for one device type, for its lifetime on this thread; regions nest and
/// each restores the state it found. `enabled = false` opens a region with autocast off (to run
/// a part of a model in full precision). `dtype` must be float16 or bfloat16. A parameter cast
/// inside the outermost region is cast once and reused until that region ends.
class STRATA_API AutocastGuard {
 public:
  AutocastGuard(DeviceType device, DType dtype, bool enabled = true);
  /// The device's current dtype (bfloat16 on the CPU, float16 on CUDA by default).
  explicit AutocastGuard(DeviceType device, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType device_;
  bool prev_enabled_;
  DType prev_dtype_;
};

/// An autocast region on every device type at once, for code that does not name its device:
///
///   { amp::Autocast ac(kBFloat16); loss = loss_fn(model(x), y); }
class STRATA_API Autocast {
 public:
  explicit Autocast(DType dtype, bool enabled = true)
      : cpu_(DeviceType::CPU, dtype, enabled), cuda_(DeviceType::CUDA, dtype, enabled) {}

 private:
  AutocastGuard cpu_, cuda_;
};

namespace detail {

/// How an op in the policy table treats floating inputs in a region.
enum class CastPolicy : uint8_t {
  LowerPrecision,  ///< float32 (and the other 16-bit type) -> the autocast dtype
  Float32,         ///< float16 / bfloat16 -> float32
};

/// The policy of op `op`, or false when autocast leaves it alone (src/amp/autocast_policy.cpp).
STRATA_API bool policy_of(std::string_view op, CastPolicy& policy);

/// What an op's public function opens at its top:
///
///   amp::detail::AutocastScope amp_scope("matmul", a, b);
///   if (amp_scope.cast()) return matmul(amp_scope[0], amp_scope[1]);
///
/// In a region for the inputs' device, it casts the inputs the op's policy names and keeps
/// autocast off for every op called until it ends, so ops the op is built of (linear over
/// matmul, attention over softmax) neither cast again nor flip dtypes back; outside a region it
/// does nothing. Undefined inputs and inputs on another device type stay as they are. The
/// inputs are copied only in a region: every op call passes through here.
class STRATA_API AutocastScope {
 public:
  template <class... Ts>
    requires(std::same_as<Ts, Tensor> && ...)
  AutocastScope(std::string_view op, const Ts&... inputs) {
    if (!may_cast()) return;
    const Tensor all[] = {inputs...};
    open(op, std::begin(all), std::end(all));
  }
  AutocastScope(std::string_view op, const std::vector<Tensor>& inputs);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

  /// True when some input was cast: the op then runs again on the cast inputs.
  bool cast() const { return cast_; }
  const Tensor& operator[](size_t i) const { return inputs_[i]; }
  const std::vector<Tensor>& inputs() const { return inputs_; }

 private:
  /// Some device type has autocast on and no listed op is running on this thread.
  static bool may_cast();
  void open(std::string_view op, const Tensor* begin, const Tensor* end);

  std::vector<Tensor> inputs_;
  bool active_ = false;
  bool cast_ = false;
};

/// Casts made by autocast on this thread since the counter was last reset (each miss of the
/// parameter cache counts once); for tests of the cache.
STRATA_API int64_t cast_count();
STRATA_API void reset_cast_count();
/// Parameters held in this thread's cast cache (emptied when the outermost region ends).
STRATA_API size_t cast_cache_size();

}  // namespace detail
}  // namespace strata::amp
