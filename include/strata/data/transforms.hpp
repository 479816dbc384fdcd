// Per-sample transforms, as in torchvision: RandomResizedCrop, RandomHorizontalFlip, Resize,
// CenterCrop work on decoded Images; ToTensor turns an Image into a float tensor; Normalize
// works on that tensor. Compose chains them. A transform draws its random numbers from the
// Generator it is handed, which the dataset seeds per sample (sample_generator), so a sample's
// augmentation depends on (seed, epoch, index) and never on which worker thread ran it.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <variant>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/core/generator.hpp>
#include <strata/core/tensor.hpp>
#include <strata/data/image.hpp>

namespace strata::data {

/// What flows through a pipeline: an Image before ToTensor, a Tensor after it.
using ImageOrTensor = std::variant<Image, Tensor>;
/// A transform: any callable taking the value and the sample's generator.
using Transform = std::function<ImageOrTensor(ImageOrTensor, Generator&)>;

/// The generator for sample `index` of epoch `epoch` under base seed `seed`: a Philox
/// generator whose seed is a hash of the three, so neighbouring samples get unrelated streams.
STRATA_API Generator sample_generator(uint64_t seed, int64_t index, uint64_t epoch = 0);
/// A uniform double in [0, 1) from `gen` (one Philox block).
STRATA_API double uniform(Generator& gen);

/// Applies its transforms in order.
struct STRATA_API Compose {
  std::vector<Transform> transforms;
  Compose() = default;
  Compose(std::vector<Transform> list) : transforms(std::move(list)) {}
  ImageOrTensor operator()(ImageOrTensor value, Generator& gen) const;
};

/// A random crop of random area (fraction `scale` of the image) and aspect ratio (`ratio`,
/// drawn log-uniformly), resized to size x size: torchvision's RandomResizedCrop, with
/// bilinear resizing. After 10 failed draws it falls back to a central crop.
struct STRATA_API RandomResizedCrop {
  int64_t height, width;
  std::pair<double, double> scale;
  std::pair<double, double> ratio;
  explicit RandomResizedCrop(int64_t size, std::pair<double, double> scale = {0.08, 1.0},
                             std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0});
  RandomResizedCrop(int64_t height, int64_t width, std::pair<double, double> scale, std::pair<double, double> ratio);
  /// The crop box chosen for an image of the given size.
  CropBox get_params(int64_t image_height, int64_t image_width, Generator& gen) const;
  ImageOrTensor operator()(ImageOrTensor value, Generator& gen) const;
};

/// Mirrors the image left to right with probability p.
struct STRATA_API RandomHorizontalFlip {
  double p = 0.5;
  explicit RandomHorizontalFlip(double p = 0.5);
  ImageOrTensor operator()(ImageOrTensor value, Generator& gen) const;
};

/// Bilinear resize. With one size, the shorter side becomes `size` and the longer keeps the
/// aspect ratio (truncated, as torchvision does); with two, the output is height x width.
struct STRATA_API Resize {
  int64_t height = 0, width = 0;  // width == 0: shorter side mode, height holds the size
  explicit Resize(int64_t size);
  Resize(int64_t height, int64_t width);
  ImageOrTensor operator()(ImageOrTensor value, Generator& gen) const;
};

/// The central height x width region (the image must be at least that large), at
/// torchvision's offsets: round(border / 2) with halves rounded to even, so an odd border puts
/// its extra row / column at the bottom / right when half of it rounds down (borders 1, 5, 9,
/// ...) and at the top / left otherwise (3, 7, ...).
struct STRATA_API CenterCrop {
  int64_t height, width;
  explicit CenterCrop(int64_t size) : CenterCrop(size, size) {}
  CenterCrop(int64_t height, int64_t width);
  ImageOrTensor operator()(ImageOrTensor value, Generator& gen) const;
};

/// Image (H, W, 3) uint8 -> float32 tensor of shape (3, H, W) with values in [0, 1].
/// With channels_last the shape is the same but the memory is HWC (strides (1, 3W, 3)):
/// unsqueezed, it is a channels-last (1, 3, H, W) tensor (MemoryFormat::ChannelsLast).
struct STRATA_API ToTensor {
  bool channels_last = false;
  explicit ToTensor(bool channels_last = false) : channels_last(channels_last) {}
  ImageOrTensor operator()(ImageOrTensor value, Generator& gen) const;
};

/// (x - mean[c]) / std[c] on a float32 (C, H, W) tensor, keeping its memory layout.
struct STRATA_API Normalize {
  std::vector<double> mean, std;
  Normalize(std::vector<double> mean, std::vector<double> std);
  ImageOrTensor operator()(ImageOrTensor value, Generator& gen) const;
};

/// The ImageNet channel statistics used with Normalize.
inline const std::vector<double> kImageNetMean = {0.485, 0.456, 0.406};
inline const std::vector<double> kImageNetStd = {0.229, 0.224, 0.225};

}  // namespace strata::data
