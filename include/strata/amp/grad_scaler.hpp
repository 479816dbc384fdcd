// Loss scaling for float16 training, with torch.amp.GradScaler's semantics and defaults: the loss
// is multiplied by a scale before backward so small float16 gradients do not flush to zero; the
// gradients are divided by it before the optimizer's step, which is skipped when any of them is
// inf or NaN; the scale then backs off, or grows after `growth_interval` clean steps.
//
//   amp::GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.unscale_(opt);           // optional: to clip the true gradients first
//   scaler.step(opt);               // skipped on an inf/NaN gradient
//   scaler.update();
//
// Its state_dict() fits a checkpoint's scaler slot: io::TrainingState{.scaler = io::stateful(scaler)}.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>
#include <strata/optim/optimizer.hpp>

namespace strata::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;  ///< 2^16
  double growth_factor = 2.0;   ///< > 1
  double backoff_factor = 0.5;  ///< in (0, 1)
  int64_t growth_interval = 2000;
  /// A disabled scaler passes everything through: scale() returns the loss, step() steps.
  bool enabled = true;
};

class STRATA_API GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  virtual ~GradScaler() = default;
  GradScaler(const GradScaler&) = default;
  GradScaler& operator=(const GradScaler&) = default;

  /// loss * scale. The scale is a float32 tensor made on the device of the first loss scaled.
  Tensor scale(const Tensor& loss);
  /// Divides the gradient of every parameter of `optimizer` in place by the scale and records
  /// whether any is inf or NaN, on the gradients' devices. At most once per optimizer between
  /// updates, and not after step().
  void unscale_(optim::Optimizer& optimizer);
  /// unscale_ (unless done), then optimizer.step() unless an inf or NaN gradient was found.
  /// Returns whether the optimizer stepped. Once per optimizer between updates.
  bool step(optim::Optimizer& optimizer);
  /// Backs the scale off after a step that found an inf or NaN, or grows it after
  /// growth_interval clean steps in a row; call once per iteration after the steps.
  void update();
  /// Sets the scale to `new_scale` (finite, > 0) instead of the rule above.
  void update(double new_scale);

  /// The current scale (init_scale before the first scale()); 1 when disabled.
  double get_scale() const;
  /// Consecutive clean steps since the scale last changed.
  int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  /// PyTorch's keys as scalars: scale, growth_factor, backoff_factor, growth_interval,
  /// _growth_tracker (none when disabled). Type "GradScaler".
  optim::StateDict state_dict() const;
  /// Restores a state_dict(); raises Error (changing nothing) on a missing key, a bad value or
  /// a dict saved from a disabled scaler. A disabled scaler ignores it.
  void load_state_dict(const optim::StateDict& dict);

 protected:
  /// The verdict step() and update() act on, given this process's own: whether any gradient was
  /// inf or NaN. `device` is the scale's (the CPU before the first scale()). ShardedGradScaler
  /// combines the verdicts of every rank of its process group here.
  virtual bool agree_on_found_inf(bool local_found_inf, Device device) {
    (void)device;
    return local_found_inf;
  }

 private:
  enum class Stage : uint8_t { Ready, Unscaled, Stepped };
  struct OptimizerState {
    Stage stage = Stage::Ready;
    std::vector<Tensor> found_inf;  // a bool 0-d tensor on each device holding gradients
    int found_inf_host = -1;          // -1: not read yet
  };
  static bool local_found_inf(const OptimizerState& st);  // reads the device flags
  bool found_inf(OptimizerState& st);                      // the agreed verdict, read once
  Device verdict_device() const { return scale_.defined() ? scale_.device() : Device::cpu(); }

  GradScalerOptions options_;
  float scale_value_;  // what scale_ holds; the host copy drives the update rule
  int64_t growth_tracker_ = 0;
  Tensor scale_;  // float32 0-d, on the loss's device
  std::unordered_map<const optim::Optimizer*, OptimizerState> per_optimizer_;
};

}  // namespace strata::amp
