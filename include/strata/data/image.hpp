// Decoded images: an 8-bit RGB pixel buffer in HWC order, the JPEG (libjpeg-turbo) and PNG
// (libpng) decoders that produce it, and the pixel operations the transforms are built from
// (crop, bilinear resize, horizontal flip, conversion to a tensor).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::data {

/// Largest width or height a decoder accepts. Checked from the file header, before any
/// pixel memory is allocated, so a corrupt or hostile header cannot exhaust memory.
inline constexpr int64_t kMaxImageSide = 16384;
/// Largest width * height a decoder accepts (2^28 pixels, 768 MiB as RGB).
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

/// An 8-bit RGB image, row-major HWC: pixel (y, x) channel c is pixels[(y * width + x) * 3 + c].
struct Image {
  static constexpr int64_t channels = 3;
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> pixels;

  Image() = default;
  /// A black image of the given size.
  Image(int64_t h, int64_t w) : height(h), width(w) {
    STRATA_CHECK(h >= 0 && w >= 0, "[Image] negative size {}x{}", h, w);
    STRATA_CHECK(h == 0 || w <= kMaxImagePixels / h, "[Image] size {}x{} is more than {} pixels", h, w,
                 kMaxImagePixels);
    pixels.assign(static_cast<size_t>(h * w * channels), 0);
  }
  uint8_t* at(int64_t y, int64_t x) { return pixels.data() + (y * width + x) * channels; }
  const uint8_t* at(int64_t y, int64_t x) const { return pixels.data() + (y * width + x) * channels; }
};

/// A rectangle inside an image: rows [top, top + height), columns [left, left + width).
struct CropBox {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
};

/// Decodes a JPEG. `name` (a file path, usually) is put in error messages. Any decoder
/// warning (a truncated or corrupt stream) is an error: a half-grey image is never returned;
/// so is a progressive JPEG of more than 500 scans (a decoding cost out of all proportion).
STRATA_API Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name = "<memory>");
/// Decodes a PNG of any colour type and bit depth to 8-bit RGB: grey is replicated, palettes
/// expanded, alpha dropped (not composited), 16-bit samples scaled to 8 bits with rounding.
STRATA_API Image decode_png(std::span<const uint8_t> bytes, const std::string& name = "<memory>");
/// Decodes a JPEG or PNG, recognised by its signature (not its file name).
STRATA_API Image decode_image(std::span<const uint8_t> bytes, const std::string& name = "<memory>");
/// Reads and decodes the JPEG or PNG file at `path`.
STRATA_API Image read_image(const std::string& path);
/// The whole file as bytes; raises strata::Error naming the file when it cannot be read.
STRATA_API std::vector<uint8_t> read_file_bytes(const std::string& path);

/// A copy of the pixels inside `box`, which must lie within the image.
STRATA_API Image crop(const Image& image, const CropBox& box);
/// Bilinear resampling of the pixels inside `box` (the whole image by default) to
/// out_height x out_width, with half-pixel centres (PyTorch's align_corners=False, no
/// antialiasing), rounding to the nearest integer.
STRATA_API Image resize_bilinear(const Image& image, int64_t out_height, int64_t out_width);
STRATA_API Image resize_bilinear(const Image& image, int64_t out_height, int64_t out_width, const CropBox& box);
/// The image mirrored left to right.
STRATA_API Image hflip(const Image& image);
/// The pixels as a uint8 CPU tensor of shape (H, W, 3) (a copy).
STRATA_API Tensor image_to_tensor(const Image& image);
/// Raises unless the image's fields agree (a non-negative size whose pixels are all there);
/// `op` names the caller. Every function above checks its input with it.
STRATA_API void check_image(const Image& image, std::string_view op);

}  // namespace strata::data
