// Independent encoders for the image tests: JPEG through TurboJPEG's compressor and PNG through
// libpng's writer, plus file helpers (and TempDir, from temp_dir.h).
#pragma once

#include <csetjmp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "temp_dir.h"

namespace strata::testing {

/// JPEG bytes of an RGB (H, W, 3) buffer, 4:4:4 subsampling, quality 1..100.
inline std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& rgb, int width, int height, int quality) {
  tjhandle h = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  int rc = tjCompress2(h, rgb.data(), width, 0, height, TJPF_RGB, &buf, &size, TJSAMP_444, quality, 0);
  std::vector<uint8_t> out;
  if (rc == 0) out.assign(buf, buf + size);
  tjFree(buf);
  tjDestroy(h);
  return out;
}

struct PngSpec {
  int width = 0, height = 0;
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  bool interlaced = false;
  std::vector<png_color> palette;  // PALETTE only
  std::vector<uint8_t> trns;       // PALETTE only: alpha per palette entry
};

namespace detail {
inline void png_write_cb(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}
inline void png_flush_cb(png_structp) {}
// `rows` holds height rows of packed samples (16-bit samples big-endian, as PNG stores them).
inline bool png_write(png_structp png, png_infop info, const PngSpec* s, std::vector<uint8_t>* out,
                      png_bytep* rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_write_fn(png, out, png_write_cb, png_flush_cb);
  png_set_IHDR(png, info, s->width, s->height, s->bit_depth, s->color_type,
               s->interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!s->palette.empty()) png_set_PLTE(png, info, s->palette.data(), static_cast<int>(s->palette.size()));
  if (!s->trns.empty()) png_set_tRNS(png, info, s->trns.data(), static_cast<int>(s->trns.size()), nullptr);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  return true;
}
}  // namespace detail

/// PNG bytes; `data` holds the rows as PNG stores them (row bytes = width * samples * depth / 8).
inline std::vector<uint8_t> encode_png(const PngSpec& spec, std::vector<uint8_t> data) {
  std::vector<uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  const size_t row_bytes = data.size() / spec.height;
  std::vector<png_bytep> rows(spec.height);
  for (int y = 0; y < spec.height; ++y) rows[y] = data.data() + y * row_bytes;
  bool ok = detail::png_write(png, info, &spec, &out, rows.data());
  png_destroy_write_struct(&png, &info);
  if (!ok) out.clear();
  return out;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace strata::testing
