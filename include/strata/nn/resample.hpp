// Padding and upsampling layers over nn::functional::pad and interpolate, with torch.nn's
// names and arguments. They hold no parameters. Inputs are batched or not: (N, C, L) or
// (C, L) for the 1d paddings, (N, C, H, W) or (C, H, W) for the 2d ones.
//
//   nn::ReflectionPad2d pad(1);               // 1 on every side
//   nn::ZeroPad2d crop({0, -1, 0, -1});       // (left, right, top, bottom); negative crops
//   nn::Upsample up({.scale_factor = {2}, .mode = nn::functional::InterpolateMode::Bilinear});
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <strata/nn/functional_resample.hpp>
#include <strata/nn/module.hpp>

namespace strata::nn {

/// Padding of the last dim: one value for both sides, or {left, right}.
struct Padding1d {
  int64_t left = 0, right = 0;
  Padding1d(int64_t p) : left(p), right(p) {}  // NOLINT: implicit by design
  Padding1d(int64_t l, int64_t r) : left(l), right(r) {}
};

/// Padding of the last two dims: one value for every side, or {left, right, top, bottom}.
struct Padding2d {
  int64_t left = 0, right = 0, top = 0, bottom = 0;
  Padding2d(int64_t p) : left(p), right(p), top(p), bottom(p) {}  // NOLINT: implicit by design
  Padding2d(int64_t l, int64_t r, int64_t t, int64_t b) : left(l), right(r), top(t), bottom(b) {}
};

/// The padding layers below: functional::pad of inputs with `spatial_dims` dims after the
/// channels, batched or not.
class STRATA_API Pad : public Module {
 public:
  Pad(std::string name, int64_t spatial_dims, std::vector<int64_t> padding, functional::PadMode mode,
      double value = 0);
  Pad(std::string name, Padding1d p, functional::PadMode mode, double value = 0)
      : Pad(std::move(name), 1, {p.left, p.right}, mode, value) {}
  Pad(std::string name, Padding2d p, functional::PadMode mode, double value = 0)
      : Pad(std::move(name), 2, {p.left, p.right, p.top, p.bottom}, mode, value) {}
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return name_; }

  std::vector<int64_t> padding;  // functional::pad's order: last dim's (left, right) first
  functional::PadMode mode;
  double value;

 private:
  std::string name_;
  int64_t spatial_dims_;
};

class ZeroPad1d : public Pad {
 public:
  explicit ZeroPad1d(Padding1d p) : Pad("ZeroPad1d", p, functional::PadMode::Constant) {}
};

class ZeroPad2d : public Pad {
 public:
  explicit ZeroPad2d(Padding2d p) : Pad("ZeroPad2d", p, functional::PadMode::Constant) {}
};

class ConstantPad1d : public Pad {
 public:
  ConstantPad1d(Padding1d p, double value) : Pad("ConstantPad1d", p, functional::PadMode::Constant, value) {}
};

class ConstantPad2d : public Pad {
 public:
  ConstantPad2d(Padding2d p, double value) : Pad("ConstantPad2d", p, functional::PadMode::Constant, value) {}
};

class ReflectionPad1d : public Pad {
 public:
  explicit ReflectionPad1d(Padding1d p) : Pad("ReflectionPad1d", p, functional::PadMode::Reflect) {}
};

class ReflectionPad2d : public Pad {
 public:
  explicit ReflectionPad2d(Padding2d p) : Pad("ReflectionPad2d", p, functional::PadMode::Reflect) {}
};

class ReplicationPad1d : public Pad {
 public:
  explicit ReplicationPad1d(Padding1d p) : Pad("ReplicationPad1d", p, functional::PadMode::Replicate) {}
};

class ReplicationPad2d : public Pad {
 public:
  explicit ReplicationPad2d(Padding2d p) : Pad("ReplicationPad2d", p, functional::PadMode::Replicate) {}
};

class CircularPad1d : public Pad {
 public:
  explicit CircularPad1d(Padding1d p) : Pad("CircularPad1d", p, functional::PadMode::Circular) {}
};

class CircularPad2d : public Pad {
 public:
  explicit CircularPad2d(Padding2d p) : Pad("CircularPad2d", p, functional::PadMode::Circular) {}
};

/// torch.nn.Upsample: functional::interpolate with fixed arguments (size or scale_factor).
class STRATA_API Upsample : public Module {
 public:
  explicit Upsample(functional::InterpolateArgs args);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Upsample"; }

  functional::InterpolateArgs args;
};

class STRATA_API PixelShuffle : public Module {
 public:
  explicit PixelShuffle(int64_t upscale_factor) : upscale_factor(upscale_factor) {}
  Tensor forward(const Tensor& input) override { return functional::pixel_shuffle(input, upscale_factor); }
  std::string name() const override { return "PixelShuffle"; }

  int64_t upscale_factor;
};

class STRATA_API PixelUnshuffle : public Module {
 public:
  explicit PixelUnshuffle(int64_t downscale_factor) : downscale_factor(downscale_factor) {}
  Tensor forward(const Tensor& input) override { return functional::pixel_unshuffle(input, downscale_factor); }
  std::string name() const override { return "PixelUnshuffle"; }

  int64_t downscale_factor;
};

}  // namespace strata::nn
