// Pixel operations on decoded Images: crop, bilinear resize, horizontal flip and conversion
// to a uint8 tensor. They run in data-loader worker threads, one sample per call, so they are
// plain single-threaded loops.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <strata/data/image.hpp>
#include <strata/ops/creation.hpp>

namespace strata::data {
namespace {

void check_box(const Image& image, const CropBox& box, const char* op) {
  check_image(image, op);
  // written so that no sum can overflow
  STRATA_CHECK(box.height > 0 && box.width > 0 && box.top >= 0 && box.left >= 0 && box.top < image.height &&
                   box.left < image.width && box.height <= image.height - box.top &&
                   box.width <= image.width - box.left,
               "[{}] box (top {}, left {}, {}x{}) does not lie inside the {}x{} image", op, box.top, box.left,
               box.height, box.width, image.height, image.width);
}

// Source taps of one output coordinate: two indices and the weight of the second.
struct Tap {
  int64_t i0, i1;
  float w1;
};

// Half-pixel centres: output o samples input (o + 0.5) * in / out - 0.5, clamped to the box.
std::vector<Tap> taps(int64_t start, int64_t in, int64_t out) {
  std::vector<Tap> t(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    double s = std::max((o + 0.5) * scale - 0.5, 0.0);
    int64_t i0 = std::min(static_cast<int64_t>(s), in - 1);
    int64_t i1 = std::min(i0 + 1, in - 1);
    t[o] = {start + i0, start + i1, static_cast<float>(s - static_cast<double>(i0))};
  }
  return t;
}

}  // namespace

Image crop(const Image& image, const CropBox& box) {
  check_box(image, box, "crop");
  Image out(box.height, box.width);
  for (int64_t y = 0; y < box.height; ++y)
    std::memcpy(out.at(y, 0), image.at(box.top + y, box.left), static_cast<size_t>(box.width * Image::channels));
  return out;
}

Image resize_bilinear(const Image& image, int64_t out_height, int64_t out_width) {
  return resize_bilinear(image, out_height, out_width, CropBox{0, 0, image.height, image.width});
}

Image resize_bilinear(const Image& image, int64_t out_height, int64_t out_width, const CropBox& box) {
  check_box(image, box, "resize");
  STRATA_CHECK(out_height > 0 && out_width > 0 && out_height <= kMaxImageSide && out_width <= kMaxImageSide,
               "[resize] output size {}x{} must be positive and at most {} per side", out_height, out_width,
               kMaxImageSide);
  const std::vector<Tap> ty = taps(box.top, box.height, out_height);
  const std::vector<Tap> tx = taps(box.left, box.width, out_width);
  Image out(out_height, out_width);
  constexpr int64_t C = Image::channels;
  std::vector<float> row(static_cast<size_t>(out_width * C));  // one output row, interpolated along x
  std::vector<float> row1(row.size());
  auto horizontal = [&](int64_t y, std::vector<float>& dst) {
    const uint8_t* src = image.at(y, 0);
    for (int64_t x = 0; x < out_width; ++x) {
      const Tap& t = tx[x];
      for (int64_t c = 0; c < C; ++c) {
        float a = src[t.i0 * C + c], b = src[t.i1 * C + c];
        dst[x * C + c] = a + (b - a) * t.w1;
      }
    }
  };
  for (int64_t y = 0; y < out_height; ++y) {
    const Tap& t = ty[y];
    horizontal(t.i0, row);
    horizontal(t.i1, row1);
    uint8_t* dst = out.at(y, 0);
    for (int64_t k = 0; k < out_width * C; ++k) {
      float v = row[k] + (row1[k] - row[k]) * t.w1;
      dst[k] = static_cast<uint8_t>(std::clamp(std::floor(v + 0.5f), 0.0f, 255.0f));
    }
  }
  return out;
}

Image hflip(const Image& image) {
  check_image(image, "hflip");
  Image out(image.height, image.width);
  for (int64_t y = 0; y < image.height; ++y)
    for (int64_t x = 0; x < image.width; ++x)
      std::memcpy(out.at(y, x), image.at(y, image.width - 1 - x), Image::channels);
  return out;
}

void check_image(const Image& image, std::string_view op) {
  const int64_t h = image.height, w = image.width;
  STRATA_CHECK(h >= 0 && w >= 0 && (h == 0 || w <= kMaxImagePixels / h) &&
                   image.pixels.size() == static_cast<size_t>(h * w * Image::channels),
               "[{}] the image holds {} bytes, not {}x{}x3", op, image.pixels.size(), h, w);
}

Tensor image_to_tensor(const Image& image) {
  check_image(image, "image_to_tensor");
  Tensor t = empty({image.height, image.width, Image::channels}, kUInt8);
  if (!image.pixels.empty()) std::memcpy(t.data(), image.pixels.data(), image.pixels.size());
  return t;
}

}  // namespace strata::data
