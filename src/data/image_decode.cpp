// JPEG (TurboJPEG API of libjpeg-turbo) and PNG (libpng) decoding into 8-bit RGB Images.
// Both decoders read the header first and check the declared size against kMaxImageSide and
// kMaxImagePixels before allocating pixel memory. Every error names the file.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <csetjmp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>

#include <png.h>
#include <turbojpeg.h>

#include <strata/data/image.hpp>

namespace strata::data {
namespace {

void check_size(int64_t height, int64_t width, const std::string& name, const char* kind) {
  STRATA_CHECK(height > 0 && width > 0, "[read_image] {}: {} declares an empty image ({}x{})", name, kind, width,
               height);
  STRATA_CHECK(height <= kMaxImageSide && width <= kMaxImageSide && height * width <= kMaxImagePixels,
               "[read_image] {}: {} declares {}x{} pixels, which exceeds the limit ({} per side, {} in all)", name,
               kind, width, height, kMaxImageSide, kMaxImagePixels);
}

// One TurboJPEG decompressor per thread: creating one costs an allocation and some setup,
// and a handle must not be used by two threads at once.
tjhandle jpeg_handle() {
  struct Handle {
    tjhandle h = tjInitDecompress();
    ~Handle() {
      if (h) tjDestroy(h);
    }
  };
  thread_local Handle handle;
  STRATA_CHECK(handle.h != nullptr, "[read_image] cannot create a JPEG decompressor: {}", tjGetErrorStr2(nullptr));
  return handle.h;
}

// ---- PNG --------------------------------------------------------------------------------
// libpng reports errors by longjmp. The functions holding a setjmp below keep no C++ objects
// with destructors in their frames; memory they fill is owned by the caller.

struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char error[200];
};

void png_read_cb(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "the file is truncated");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

void png_error_cb(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->error, sizeof src->error, "%s", message);
  png_longjmp(png, 1);
}

void png_warning_cb(png_structp, png_const_charp) {}  // e.g. unknown ancillary chunks: harmless

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReader() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

// Reads the header and sets up conversion to 8-bit RGB. Returns false on a libpng error.
bool png_read_header(PngReader* r, PngSource* src, uint32_t* width, uint32_t* height) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_set_read_fn(r->png, src, png_read_cb);
  png_read_info(r->png, r->info);
  *width = png_get_image_width(r->png, r->info);
  *height = png_get_image_height(r->png, r->info);
  const int color = png_get_color_type(r->png, r->info);
  const int depth = png_get_bit_depth(r->png, r->info);
  if (depth == 16) png_set_scale_16(r->png);  // rounds, unlike png_set_strip_16
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r->png);
  if ((color & PNG_COLOR_MASK_COLOR) == 0) {
    if (depth < 8) png_set_expand_gray_1_2_4_to_8(r->png);
    png_set_gray_to_rgb(r->png);
  }
  png_set_strip_alpha(r->png);  // alpha channels and tRNS transparency are dropped
  png_set_interlace_handling(r->png);
  png_read_update_info(r->png, r->info);
  return true;
}

bool png_read_pixels(PngReader* r, png_bytep* rows) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_read_image(r->png, rows);
  png_read_end(r->png, nullptr);
  return true;
}

}  // namespace

Image decode_jpeg(std::span<const uint8_t> bytes, const std::string& name) {
  STRATA_CHECK(!bytes.empty(), "[read_image] {}: the file is empty", name);
  tjhandle h = jpeg_handle();
  auto* src = const_cast<unsigned char*>(bytes.data());  // TurboJPEG 2.x takes non-const input
  const auto size = static_cast<unsigned long>(bytes.size());
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  STRATA_CHECK(tjDecompressHeader3(h, src, size, &width, &height, &subsamp, &colorspace) == 0,
               "[read_image] {}: not a valid JPEG header: {}", name, tjGetErrorStr2(h));
  check_size(height, width, name, "JPEG header");
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  Image image(height, width);
  std::vector<uint8_t> cmyk_pixels;
  if (cmyk) cmyk_pixels.resize(static_cast<size_t>(height) * width * 4);
  uint8_t* dst = cmyk ? cmyk_pixels.data() : image.pixels.data();
  // A warning (truncated data, a corrupt segment) still yields an image padded with grey;
  // stopping on it makes such files errors rather than silently damaged samples. A
  // progressive file of more than 500 scans is refused: each scan is a pass over every
  // coefficient, so a few kilobytes could cost minutes of decoding.
  const int rc = tjDecompress2(h, src, size, dst, width, 0, height, cmyk ? TJPF_CMYK : TJPF_RGB,
                               TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS);
  STRATA_CHECK(rc == 0, "[read_image] {}: cannot decode the JPEG (corrupt, truncated or too costly): {}", name,
               tjGetErrorStr2(h));
  if (cmyk) {
    // Photoshop writes inverted CMYK (Adobe APP14), which is what nearly every CMYK JPEG is:
    // the stored values are 255 - ink, so RGB = stored * K / 255.
    for (int64_t i = 0, n = int64_t{height} * width; i < n; ++i) {
      const uint8_t* p = &cmyk_pixels[static_cast<size_t>(i) * 4];
      for (int c = 0; c < 3; ++c) image.pixels[i * 3 + c] = static_cast<uint8_t>((p[c] * p[3] + 127) / 255);
    }
  }
  return image;
}

Image decode_png(std::span<const uint8_t> bytes, const std::string& name) {
  STRATA_CHECK(bytes.size() >= 8 && png_sig_cmp(bytes.data(), 0, 8) == 0, "[read_image] {}: not a PNG file", name);
  PngSource src{bytes.data(), bytes.size(), 0, {0}};
  PngReader r;
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_error_cb, png_warning_cb);
  STRATA_CHECK(r.png != nullptr, "[read_image] {}: cannot create a PNG decoder", name);
  r.info = png_create_info_struct(r.png);
  STRATA_CHECK(r.info != nullptr, "[read_image] {}: cannot create a PNG decoder", name);
  uint32_t width = 0, height = 0;
  STRATA_CHECK(png_read_header(&r, &src, &width, &height), "[read_image] {}: corrupt PNG: {}", name, src.error);
  check_size(height, width, name, "PNG header");
  STRATA_CHECK(png_get_rowbytes(r.png, r.info) == size_t{width} * 3,
               "[read_image] {}: unexpected PNG row size after conversion to RGB", name);
  Image image(height, width);
  std::vector<png_bytep> rows(height);
  for (uint32_t y = 0; y < height; ++y) rows[y] = image.at(y, 0);
  STRATA_CHECK(png_read_pixels(&r, rows.data()), "[read_image] {}: corrupt or truncated PNG: {}", name, src.error);
  return image;
}

Image decode_image(std::span<const uint8_t> bytes, const std::string& name) {
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return decode_jpeg(bytes, name);
  if (bytes.size() >= 8 && png_sig_cmp(bytes.data(), 0, 8) == 0) return decode_png(bytes, name);
  STRATA_CHECK(false, "[read_image] {}: not a JPEG or PNG file ({} bytes)", name, bytes.size());
  return {};
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  STRATA_CHECK(!ec && std::filesystem::exists(status), "[read_image] cannot open {}: {}", path,
               ec ? ec.message() : std::strerror(ENOENT));
  // a directory opens as a stream on some file systems, and reports a size of 2^63 - 1
  STRATA_CHECK(std::filesystem::is_regular_file(status), "[read_image] {} is not a regular file", path);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  STRATA_CHECK(in.good(), "[read_image] cannot open {}", path);
  const std::streamoff size = in.tellg();
  STRATA_CHECK(size >= 0, "[read_image] cannot read {}", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  STRATA_CHECK(in.gcount() == size, "[read_image] {}: read {} of {} bytes", path, in.gcount(), size);
  return bytes;
}

Image read_image(const std::string& path) { return decode_image(read_file_bytes(path), path); }

}  // namespace strata::data
