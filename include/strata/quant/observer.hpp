// Observers: modules that watch the tensors passing through them and keep their range, from
// which calculate_qparams() gives a scale and zero point (torch.ao.quantization.observer).
//
//   quant::MinMaxObserver obs({.dtype = kUInt8});
//   obs(x1); obs(x2);                          // forward returns its input unchanged
//   auto [scale, zero_point] = obs.calculate_qparams();
//
// Ranges are taken over finite values only (Note [Non-finite values in quantization]).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <strata/nn/module.hpp>
#include <strata/quant/qtensor.hpp>

namespace strata::quant {

struct ObserverOptions {
  DType dtype = kUInt8;  // kInt8 or kUInt8: the code type the qparams are for
  QScheme qscheme = QScheme::PerTensorAffine;
  bool reduce_range = false;
  std::optional<int32_t> quant_min, quant_max;  // a custom range inside the dtype's
  double eps = 1.1920928955078125e-07;           // the scale's floor (float32 epsilon)
  double averaging_constant = 0.01;              // moving-average observers only
  int64_t ch_axis = 0;                           // per-channel observers only
};

/// PyTorch's defaults for weight observers: int8, per-channel symmetric along dim 0.
inline ObserverOptions per_channel_defaults() {
  ObserverOptions o;
  o.dtype = kInt8;
  o.qscheme = QScheme::PerChannelSymmetric;
  return o;
}

/// The base of the observers: buffers min_val and max_val (0-d per tensor, (channels) per
/// channel; per-channel ones start empty and take their size at the first observation, or at
/// construction when num_channels is given, which a state dict needs to load into them).
class STRATA_API Observer : public nn::Module {
 public:
  /// Records x's range (without gradient) and returns x.
  Tensor forward(const Tensor& x) override;
  /// (scale float32, zero_point int32), shaped as min_val.
  virtual std::pair<Tensor, Tensor> calculate_qparams() const;
  QRange range() const { return range_; }
  const ObserverOptions& options() const { return options_; }
  bool per_channel() const { return is_per_channel(options_.qscheme); }
  Tensor min_val, max_val;

 protected:
  Observer(ObserverOptions options, bool per_channel, int64_t num_channels);
  /// Folds one batch's range (shaped as min_val) into min_val and max_val.
  virtual void update(const Tensor& batch_min, const Tensor& batch_max) = 0;
  bool observed() const;
  /// x's finite minimum and maximum (per channel along ch_axis for a per-channel observer), x checked.
  std::pair<Tensor, Tensor> batch_range(const Tensor& x) const;
  /// x checked as an input of this observer; the axis of its channels (-1: per tensor).
  int64_t checked_axis(const Tensor& x) const;

 private:
  ObserverOptions options_;
  QRange range_;
};

/// Running minimum and maximum over everything observed (per tensor).
class STRATA_API MinMaxObserver : public Observer {
 public:
  explicit MinMaxObserver(ObserverOptions options = {});
  std::string name() const override { return "MinMaxObserver"; }

 protected:
  MinMaxObserver(ObserverOptions options, bool per_channel, int64_t num_channels)
      : Observer(std::move(options), per_channel, num_channels) {}
  void update(const Tensor& batch_min, const Tensor& batch_max) override;
};

/// min_val += c * (batch_min - min_val), the first batch taken as is (c = averaging_constant).
class STRATA_API MovingAverageMinMaxObserver : public Observer {
 public:
  explicit MovingAverageMinMaxObserver(ObserverOptions options = {});
  std::string name() const override { return "MovingAverageMinMaxObserver"; }

 protected:
  MovingAverageMinMaxObserver(ObserverOptions options, bool per_channel, int64_t num_channels)
      : Observer(std::move(options), per_channel, num_channels) {}
  void update(const Tensor& batch_min, const Tensor& batch_max) override;
};

/// MinMaxObserver per index of ch_axis; qscheme must be per channel.
class STRATA_API PerChannelMinMaxObserver : public MinMaxObserver {
 public:
  explicit PerChannelMinMaxObserver(ObserverOptions options = per_channel_defaults(), int64_t num_channels = 0);
  std::string name() const override { return "PerChannelMinMaxObserver"; }
};

class STRATA_API MovingAveragePerChannelMinMaxObserver : public MovingAverageMinMaxObserver {
 public:
  explicit MovingAveragePerChannelMinMaxObserver(ObserverOptions options = per_channel_defaults(),
                                                 int64_t num_channels = 0);
  std::string name() const override { return "MovingAveragePerChannelMinMaxObserver"; }
};

/// PyTorch's HistogramObserver: a histogram of `bins` equal bins over the running [min, max]
/// (re-binned when the range grows: each old bin is split into 16 and its parts moved to the new
/// bins holding their centres), and qparams for the range [min', max'] of whole bins that
/// minimizes the L2 error of quantizing that histogram, found by PyTorch's search (the bounds move
/// inwards by quantiles of 1e-5 until the error grows). Per tensor; the work runs on the host.
class STRATA_API HistogramObserver : public Observer {
 public:
  explicit HistogramObserver(ObserverOptions options = {}, int64_t bins = 2048);
  Tensor forward(const Tensor& x) override;
  std::pair<Tensor, Tensor> calculate_qparams() const override;
  std::string name() const override { return "HistogramObserver"; }
  int64_t bins() const { return bins_; }
  /// The range calculate_qparams quantizes: (min', max'), as PyTorch's _non_linear_param_search.
  std::pair<double, double> search_range() const;
  /// The L2 error of quantizing the histogram to quant_max - quant_min + 1 levels spread over bins
  /// [start_bin, end_bin] (values outside clamped), each bin's count spread uniformly over its width,
  /// as PyTorch's _compute_quantization_error.
  double quantization_error(int64_t start_bin, int64_t end_bin) const;

  Tensor histogram;  // (bins) float32 counts

 protected:
  void update(const Tensor& batch_min, const Tensor& batch_max) override;

 private:
  int64_t bins_;
};

/// A HistogramObserver per index of ch_axis (PyTorch has none): each channel keeps its own running
/// [min, max] and histogram of `bins` bins, re-binned as its own range grows, and gets the scale and
/// zero point of the range HistogramObserver's search finds on that histogram. qscheme must be per
/// channel; buffers histogram (channels, bins), min_val and max_val (channels), sized at the first
/// observation or by num_channels (to load a state dict). The work runs on the host.
class STRATA_API PerChannelHistogramObserver : public Observer {
 public:
  explicit PerChannelHistogramObserver(ObserverOptions options = per_channel_defaults(), int64_t num_channels = 0,
                                       int64_t bins = 2048);
  Tensor forward(const Tensor& x) override;
  std::pair<Tensor, Tensor> calculate_qparams() const override;
  std::string name() const override { return "PerChannelHistogramObserver"; }
  int64_t bins() const { return bins_; }
  /// Each channel's searched range, as HistogramObserver::search_range (never observed: min_val, max_val).
  std::vector<std::pair<double, double>> search_ranges() const;

  Tensor histogram;  // (channels, bins) float32 counts

 protected:
  void update(const Tensor& batch_min, const Tensor& batch_max) override;

 private:
  int64_t bins_;
};

}  // namespace strata::quant
