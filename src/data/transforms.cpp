// The torchvision-style transforms of include/strata/data/transforms.hpp, and the per-sample
// generator that makes random augmentation independent of worker threads.
#include <algorithm>
#include <cmath>

#include <strata/data/transforms.hpp>
#include <strata/ops/creation.hpp>

#include <fmt/ranges.h>

#include "kernels/common/philox.h"

namespace strata::data {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

const Image& need_image(const ImageOrTensor& value, const char* op) {
  STRATA_CHECK(std::holds_alternative<Image>(value), "[{}] expects an Image; place it before ToTensor", op);
  check_image(std::get<Image>(value), op);
  return std::get<Image>(value);
}

// An integer uniform on [0, n).
int64_t uniform_int(Generator& gen, int64_t n) {
  return std::min(static_cast<int64_t>(uniform(gen) * static_cast<double>(n)), n - 1);
}

}  // namespace

Generator sample_generator(uint64_t seed, int64_t index, uint64_t epoch) {
  uint64_t s = splitmix64(seed);
  s = splitmix64(s ^ epoch);
  s = splitmix64(s ^ static_cast<uint64_t>(index));
  return Generator(s);
}

double uniform(Generator& gen) {
  const RandomDraw draw = gen.reserve_draw(1);
  const philox::Block b = philox::philox4x32_10(draw.offset, draw.seed);
  return philox::to_unit_double(b.v[0], b.v[1]);
}

ImageOrTensor Compose::operator()(ImageOrTensor value, Generator& gen) const {
  for (const Transform& t : transforms) {
    STRATA_CHECK(static_cast<bool>(t), "[Compose] holds an empty transform");
    value = t(std::move(value), gen);
  }
  return value;
}

// ---- RandomResizedCrop --------------------------------------------------------------------

RandomResizedCrop::RandomResizedCrop(int64_t size, std::pair<double, double> scale, std::pair<double, double> ratio)
    : RandomResizedCrop(size, size, scale, ratio) {}

RandomResizedCrop::RandomResizedCrop(int64_t height, int64_t width, std::pair<double, double> scale,
                                     std::pair<double, double> ratio)
    : height(height), width(width), scale(scale), ratio(ratio) {
  STRATA_CHECK(height > 0 && width > 0, "[RandomResizedCrop] size {}x{} must be positive", height, width);
  STRATA_CHECK(0 < scale.first && scale.first <= scale.second && scale.second <= 1,
               "[RandomResizedCrop] scale ({}, {}) must satisfy 0 < low <= high <= 1", scale.first, scale.second);
  STRATA_CHECK(0 < ratio.first && ratio.first <= ratio.second,
               "[RandomResizedCrop] ratio ({}, {}) must satisfy 0 < low <= high", ratio.first, ratio.second);
}

CropBox RandomResizedCrop::get_params(int64_t image_height, int64_t image_width, Generator& gen) const {
  STRATA_CHECK(image_height > 0 && image_width > 0, "[RandomResizedCrop] empty {}x{} image", image_height,
               image_width);
  const double area = static_cast<double>(image_height) * static_cast<double>(image_width);
  const double log_lo = std::log(ratio.first), log_hi = std::log(ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (scale.first + (scale.second - scale.first) * uniform(gen));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * uniform(gen));
    const auto w = static_cast<int64_t>(std::round(std::sqrt(target * aspect)));
    const auto h = static_cast<int64_t>(std::round(std::sqrt(target / aspect)));
    if (w > 0 && w <= image_width && h > 0 && h <= image_height) {
      const int64_t top = uniform_int(gen, image_height - h + 1);
      const int64_t left = uniform_int(gen, image_width - w + 1);
      return {top, left, h, w};
    }
  }
  // Fallback: the largest central crop whose aspect ratio is clamped into `ratio`.
  const double in_ratio = static_cast<double>(image_width) / static_cast<double>(image_height);
  int64_t w = image_width, h = image_height;
  if (in_ratio < ratio.first) {
    h = std::clamp<int64_t>(static_cast<int64_t>(std::round(w / ratio.first)), 1, image_height);
  } else if (in_ratio > ratio.second) {
    w = std::clamp<int64_t>(static_cast<int64_t>(std::round(h * ratio.second)), 1, image_width);
  }
  return {(image_height - h) / 2, (image_width - w) / 2, h, w};
}

ImageOrTensor RandomResizedCrop::operator()(ImageOrTensor value, Generator& gen) const {
  const Image& image = need_image(value, "RandomResizedCrop");
  const CropBox box = get_params(image.height, image.width, gen);
  return resize_bilinear(image, height, width, box);
}

// ---- flips, resize, crop --------------------------------------------------------------------

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p(p) {
  STRATA_CHECK(p >= 0 && p <= 1, "[RandomHorizontalFlip] p = {} is not a probability", p);
}

ImageOrTensor RandomHorizontalFlip::operator()(ImageOrTensor value, Generator& gen) const {
  const Image& image = need_image(value, "RandomHorizontalFlip");
  if (uniform(gen) < p) return hflip(image);  // always draws, so later transforms see one stream
  return value;
}

Resize::Resize(int64_t size) : height(size), width(0) {
  STRATA_CHECK(size > 0, "[Resize] size {} must be positive", size);
}

Resize::Resize(int64_t height, int64_t width) : height(height), width(width) {
  STRATA_CHECK(height > 0 && width > 0, "[Resize] size {}x{} must be positive", height, width);
}

ImageOrTensor Resize::operator()(ImageOrTensor value, Generator&) const {
  const Image& image = need_image(value, "Resize");
  if (width > 0) return resize_bilinear(image, height, width);
  const int64_t size = height;
  STRATA_CHECK(image.height > 0 && image.width > 0, "[Resize] a {}x{} image has no shorter side to resize to {}",
               image.height, image.width, size);
  const bool wide = image.height <= image.width;
  const double longer = static_cast<double>(size) * static_cast<double>(wide ? image.width : image.height) /
                        static_cast<double>(wide ? image.height : image.width);
  STRATA_CHECK(longer < 9.2e18, "[Resize] resizing a {}x{} image's shorter side to {} makes its longer side {:g}",
               image.height, image.width, size, longer);
  const auto other = static_cast<int64_t>(longer);
  return wide ? resize_bilinear(image, size, other) : resize_bilinear(image, other, size);
}

CenterCrop::CenterCrop(int64_t height, int64_t width) : height(height), width(width) {
  STRATA_CHECK(height > 0 && width > 0, "[CenterCrop] size {}x{} must be positive", height, width);
}

ImageOrTensor CenterCrop::operator()(ImageOrTensor value, Generator&) const {
  const Image& image = need_image(value, "CenterCrop");
  STRATA_CHECK(image.height >= height && image.width >= width, "[CenterCrop] a {}x{} crop of a {}x{} image", height,
               width, image.height, image.width);
  // torchvision's int(round(border / 2)): Python rounds a half to the even neighbour
  auto offset = [](int64_t border) { return border / 2 + (border % 2 == 1 && (border / 2) % 2 == 1 ? 1 : 0); };
  return crop(image, {offset(image.height - height), offset(image.width - width), height, width});
}

// ---- to tensor, normalize ------------------------------------------------------------------

ImageOrTensor ToTensor::operator()(ImageOrTensor value, Generator&) const {
  const Image& image = need_image(value, "ToTensor");
  const int64_t H = image.height, W = image.width, C = Image::channels;
  if (channels_last) {
    Tensor hwc = empty({H, W, C}, kFloat32);
    float* dst = hwc.data_ptr<float>();
    for (int64_t k = 0; k < H * W * C; ++k) dst[k] = image.pixels[k] / 255.0f;
    return hwc.permute({2, 0, 1});  // (C, H, W) over HWC memory
  }
  Tensor chw = empty({C, H, W}, kFloat32);
  float* dst = chw.data_ptr<float>();
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < H * W; ++k) dst[c * H * W + k] = image.pixels[k * C + c] / 255.0f;
  return chw;
}

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean(std::move(mean)), std(std::move(std)) {
  STRATA_CHECK(!this->mean.empty() && this->mean.size() == this->std.size(),
               "[Normalize] mean has {} values and std {}; they must match and be non-empty", this->mean.size(),
               this->std.size());
  for (double s : this->std) STRATA_CHECK(s > 0, "[Normalize] std {} must be positive", s);
}

ImageOrTensor Normalize::operator()(ImageOrTensor value, Generator&) const {
  STRATA_CHECK(std::holds_alternative<Tensor>(value), "[Normalize] expects a tensor; place it after ToTensor");
  const Tensor& in = std::get<Tensor>(value);
  STRATA_CHECK(in.dtype() == kFloat32 && !in.is_cuda() && in.dim() == 3 &&
                   in.size(0) == static_cast<int64_t>(mean.size()),
               "[Normalize] expects a float32 CPU (C, H, W) tensor with C = {}, got {} {} of shape {}", mean.size(),
               in.dtype(), in.device(), in.shape());
  const int64_t C = in.size(0), H = in.size(1), W = in.size(2);
  // Keep a channels-last input channels-last; anything else becomes contiguous CHW.
  const bool hwc = in.stride(0) == 1 && in.stride(2) == C && in.stride(1) == W * C;
  Tensor out = hwc ? empty({H, W, C}, kFloat32).permute({2, 0, 1}) : empty({C, H, W}, kFloat32);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const Strides si = in.strides(), so = out.strides();
  for (int64_t c = 0; c < C; ++c) {
    const double m = mean[c], sd = std[c];
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const float v = src[c * si[0] + y * si[1] + x * si[2]];
        dst[c * so[0] + y * so[1] + x * so[2]] = static_cast<float>((static_cast<double>(v) - m) / sd);
      }
  }
  return out;
}

}  // namespace strata::data
