// Helpers for the image-op tests (convolution, pooling, batch norm): 4-d layouts an input can
// take, and a float64 (N, C, H, W) array for the plain-loop references.
#pragma once

#include <string>
#include <vector>

#include "nn/nn_testing.h"

namespace strata::testing {

/// How a 4-d test input is stored; the values are the same in all.
enum class Image { NCHW, NHWC, Sliced, SwappedHW, SlicedNHWC };

inline const char* image_name(Image l) {
  switch (l) {
    case Image::NCHW: return "NCHW";
    case Image::NHWC: return "NHWC";
    case Image::Sliced: return "sliced";
    case Image::SwappedHW: return "H/W swapped";
    case Image::SlicedNHWC: return "sliced channels-last";
  }
  return "?";
}

inline const std::vector<Image>& all_images() {
  static const std::vector<Image> all = {Image::NCHW, Image::NHWC, Image::Sliced, Image::SwappedHW, Image::SlicedNHWC};
  return all;
}

/// The layout ops must give their result for `input`, stored as l (Note [Channels-last
/// results] in src/nn/memory_format.h).
inline MemoryFormat expected_format(const Tensor& input, Image l) {
  if (input.is_contiguous()) return MemoryFormat::Contiguous;  // e.g. NHWC with C == 1
  return l == Image::NHWC || l == Image::SlicedNHWC ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

/// t's values stored as l, as a new tensor outside any graph (so a test may mark it a leaf).
inline Tensor as_image(const Tensor& input, Image l) {
  const Tensor t = input.detach();
  switch (l) {
    case Image::NCHW: return t.contiguous();
    case Image::NHWC: return t.to(MemoryFormat::ChannelsLast);
    case Image::Sliced: return with_layout(t, Layout::Sliced);
    case Image::SwappedHW: return with_layout(t, Layout::Transposed);
    case Image::SlicedNHWC: {
      // every other channel of a channels-last buffer twice as wide: C stride 2
      Shape s = t.shape();
      Tensor buf = zeros({s[0], s[2], s[3], 2 * s[1]}, TensorOptions(t.dtype())).permute({0, 3, 1, 2});
      Tensor view = buf.slice(1, 0, 2 * s[1], 2);
      view.copy_(t);
      return view;
    }
  }
  return t;
}

/// True when y is laid out as an op's result for format f should be.
inline ::testing::AssertionResult has_format(const Tensor& y, MemoryFormat f) {
  if (y.is_contiguous(f)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "result of shape " << fmt::format("{}", y.shape()) << " has strides "
                                       << fmt::format("{}", y.strides()) << ", not "
                                       << (f == MemoryFormat::ChannelsLast ? "channels-last" : "contiguous");
}

/// A float64 (N, C, H, W) array in C order.
struct Arr4 {
  int64_t n = 0, c = 0, h = 0, w = 0;
  std::vector<double> v;
  Arr4() = default;
  Arr4(int64_t n_, int64_t c_, int64_t h_, int64_t w_)
      : n(n_), c(c_), h(h_), w(w_), v(static_cast<size_t>(n_ * c_ * h_ * w_), 0.0) {}
  explicit Arr4(const Tensor& t) : n(t.size(0)), c(t.size(1)), h(t.size(2)), w(t.size(3)), v(values(t)) {}
  double& operator()(int64_t a, int64_t b, int64_t y, int64_t x) { return v[static_cast<size_t>(((a * c + b) * h + y) * w + x)]; }
  double operator()(int64_t a, int64_t b, int64_t y, int64_t x) const {
    return v[static_cast<size_t>(((a * c + b) * h + y) * w + x)];
  }
  Shape shape() const { return {n, c, h, w}; }
};

}  // namespace strata::testing
