// Transforms against hand-computed references: flips and crops exactly, bilinear resize
// against a float64 reference, ToTensor / Normalize exactly (in both layouts), and
// RandomResizedCrop's size, bounds and per-sample determinism.
#include <cmath>
#include <limits>
#include <random>

#include "testing.h"

namespace st = strata;
namespace sd = strata::data;
using namespace strata::testing;

namespace {

sd::Image random_image(int64_t h, int64_t w, unsigned seed) {
  std::mt19937 rng(seed);
  sd::Image img(h, w);
  for (auto& p : img.pixels) p = static_cast<uint8_t>(rng());
  return img;
}

// float64 bilinear with half-pixel centres over box (top, left, bh, bw), rounded to nearest.
sd::Image reference_resize(const sd::Image& in, int64_t oh, int64_t ow, int64_t top, int64_t left, int64_t bh,
                           int64_t bw) {
  sd::Image out(oh, ow);
  auto coord = [](int64_t o, int64_t n_in, int64_t n_out, int64_t& i0, int64_t& i1, double& w) {
    double s = std::max((o + 0.5) * double(n_in) / double(n_out) - 0.5, 0.0);
    i0 = std::min<int64_t>(int64_t(std::floor(s)), n_in - 1);
    i1 = std::min<int64_t>(i0 + 1, n_in - 1);
    w = s - double(i0);
  };
  for (int64_t y = 0; y < oh; ++y)
    for (int64_t x = 0; x < ow; ++x) {
      int64_t y0, y1, x0, x1;
      double wy, wx;
      coord(y, bh, oh, y0, y1, wy);
      coord(x, bw, ow, x0, x1, wx);
      for (int c = 0; c < 3; ++c) {
        auto v = [&](int64_t yy, int64_t xx) { return double(in.at(top + yy, left + xx)[c]); };
        double r = (1 - wy) * ((1 - wx) * v(y0, x0) + wx * v(y0, x1)) + wy * ((1 - wx) * v(y1, x0) + wx * v(y1, x1));
        out.at(y, x)[c] = static_cast<uint8_t>(std::clamp(std::floor(r + 0.5), 0.0, 255.0));
      }
    }
  return out;
}

// Max absolute difference; `exact` counts equal bytes.
int max_diff(const sd::Image& a, const sd::Image& b, size_t* exact = nullptr) {
  EXPECT_EQ(a.height, b.height);
  EXPECT_EQ(a.width, b.width);
  int m = 0;
  size_t eq = 0;
  for (size_t i = 0; i < std::min(a.pixels.size(), b.pixels.size()); ++i) {
    m = std::max(m, std::abs(int(a.pixels[i]) - int(b.pixels[i])));
    eq += a.pixels[i] == b.pixels[i];
  }
  if (exact) *exact = eq;
  return m;
}

sd::Image as_image(const sd::ImageOrTensor& v) { return std::get<sd::Image>(v); }
st::Tensor as_tensor(const sd::ImageOrTensor& v) { return std::get<st::Tensor>(v); }

}  // namespace

TEST(Transforms, HorizontalFlipExact) {
  sd::Image img = random_image(5, 7, 1);
  st::Generator g(1);
  sd::Image f = as_image(sd::RandomHorizontalFlip(1.0)(img, g));
  for (int64_t y = 0; y < 5; ++y)
    for (int64_t x = 0; x < 7; ++x)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(f.at(y, x)[c], img.at(y, 6 - x)[c]);
  EXPECT_EQ(as_image(sd::RandomHorizontalFlip(0.0)(img, g)).pixels, img.pixels);
  int flipped = 0;
  for (int i = 0; i < 1000; ++i) {
    st::Generator gi = sd::sample_generator(3, i);
    flipped += as_image(sd::RandomHorizontalFlip()(img, gi)).pixels != img.pixels;
  }
  EXPECT_GT(flipped, 430);
  EXPECT_LT(flipped, 570);
}

TEST(Transforms, CenterCropExact) {
  sd::Image img = random_image(9, 10, 2);
  st::Generator g;
  // torchvision's offsets, int(round(border / 2)) with Python's halves to even: borders 5 and 3
  // give 2 and 2, borders 7 and 1 give 4 and 0
  struct Case { int64_t h, w, top, left; };
  for (Case c : {Case{4, 7, 2, 2}, Case{2, 9, 4, 0}}) {
    sd::Image out = as_image(sd::CenterCrop(c.h, c.w)(img, g));
    ASSERT_EQ(out.height, c.h);
    ASSERT_EQ(out.width, c.w);
    for (int64_t y = 0; y < c.h; ++y)
      for (int64_t x = 0; x < c.w; ++x)
        for (int k = 0; k < 3; ++k) ASSERT_EQ(out.at(y, x)[k], img.at(y + c.top, x + c.left)[k]);
  }
  EXPECT_THROW(sd::CenterCrop(10)(img, g), st::Error);
}

TEST(Transforms, ResizeMatchesFloat64Bilinear) {
  st::Generator g;
  struct Case { int64_t h, w, size, want_h, want_w; };
  for (Case c : {Case{10, 20, 5, 5, 10}, Case{20, 10, 5, 10, 5}, Case{10, 15, 7, 7, 10}, Case{6, 9, 17, 17, 25},
                 Case{31, 17, 16, 29, 16}}) {
    sd::Image img = random_image(c.h, c.w, unsigned(c.h * 100 + c.w));
    sd::Image r = as_image(sd::Resize(c.size)(img, g));
    ASSERT_EQ(r.height, c.want_h);
    ASSERT_EQ(r.width, c.want_w);
    size_t exact = 0;
    EXPECT_LE(max_diff(r, reference_resize(img, c.want_h, c.want_w, 0, 0, c.h, c.w), &exact), 1);
    EXPECT_GE(exact, r.pixels.size() * 98 / 100);  // only float32 rounding ties may differ
  }
  sd::Image img = random_image(8, 8, 9);
  sd::Image same = as_image(sd::Resize(8, 8)(img, g));
  EXPECT_EQ(same.pixels, img.pixels);  // identity scale samples pixel centres exactly
  // an image with no pixels has no shorter side to scale by
  EXPECT_TRUE(st::testing::throws_with([&] { sd::Resize(8)(sd::Image{}, g); }, {"[Resize] a 0x0 image"}));
}

TEST(Transforms, ToTensorAndNormalizeExactInBothLayouts) {
  sd::Image img = random_image(4, 5, 3);
  st::Generator g;
  st::Tensor chw = as_tensor(sd::ToTensor()(img, g));
  st::Tensor cl = as_tensor(sd::ToTensor(true)(img, g));
  ASSERT_EQ(chw.shape(), (st::Shape{3, 4, 5}));
  ASSERT_EQ(cl.shape(), (st::Shape{3, 4, 5}));
  EXPECT_TRUE(chw.is_contiguous());
  EXPECT_EQ(cl.strides(), (st::Strides{1, 15, 3}));
  EXPECT_TRUE(cl.unsqueeze(0).is_contiguous(st::MemoryFormat::ChannelsLast));
  std::vector<double> want(60);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 5; ++x) want[(c * 4 + y) * 5 + x] = double(float(img.at(y, x)[c]) / 255.0f);
  EXPECT_EQ(values(chw), want);
  EXPECT_EQ(values(cl), want);
  sd::Normalize norm(sd::kImageNetMean, sd::kImageNetStd);
  for (const st::Tensor& t : {chw, cl}) {
    st::Tensor n = as_tensor(norm(t, g));
    EXPECT_EQ(n.strides(), t.strides());  // layout kept
    std::vector<double> got = values(n), ref(60);
    for (int i = 0; i < 60; ++i) ref[i] = double(float((want[i] - sd::kImageNetMean[i / 20]) / sd::kImageNetStd[i / 20]));
    EXPECT_EQ(got, ref);
  }
  EXPECT_THROW(norm(img, g), st::Error);                                  // not a tensor yet
  EXPECT_THROW(sd::Normalize({0.5}, {0.5})(chw, g), st::Error);           // 1 channel vs 3
  EXPECT_THROW(sd::Normalize({0.5, 0.5}, {0.5}), st::Error);               // length mismatch
  EXPECT_THROW(sd::RandomHorizontalFlip()(chw, g), st::Error);            // after ToTensor
}

TEST(Transforms, RandomResizedCropBoundsAndCrop) {
  sd::RandomResizedCrop rrc(16);
  const int64_t H = 900, W = 1200;
  double lo = 1, hi = 0;
  for (int i = 0; i < 2000; ++i) {
    st::Generator g = sd::sample_generator(11, i);
    sd::CropBox b = rrc.get_params(H, W, g);
    ASSERT_TRUE(b.top >= 0 && b.left >= 0 && b.height > 0 && b.width > 0 && b.top + b.height <= H &&
                b.left + b.width <= W);
    double frac = double(b.height * b.width) / double(H * W), ratio = double(b.width) / double(b.height);
    ASSERT_GE(frac, 0.08 - 0.003);
    ASSERT_LE(frac, 1.0);
    ASSERT_GE(ratio, 0.75 - 0.01);
    ASSERT_LE(ratio, 4.0 / 3.0 + 0.01);
    lo = std::min(lo, frac), hi = std::max(hi, frac);
  }
  EXPECT_LT(lo, 0.1);  // the draws cover the scale range
  EXPECT_GT(hi, 0.8);
  // the output is the chosen box, resized: compare with crop-then-resize
  sd::Image img = random_image(40, 50, 4);
  st::Generator g1 = sd::sample_generator(5, 17), g2 = sd::sample_generator(5, 17);
  sd::CropBox box = rrc.get_params(40, 50, g1);
  sd::Image out = as_image(rrc(img, g2));
  ASSERT_EQ(out.height, 16);
  ASSERT_EQ(out.width, 16);
  sd::Image ref = reference_resize(img, 16, 16, box.top, box.left, box.height, box.width);
  EXPECT_LE(max_diff(out, ref), 1);
  EXPECT_EQ(out.pixels, sd::resize_bilinear(sd::crop(img, box), 16, 16).pixels);
}

TEST(Transforms, RandomResizedCropDeterministicPerSeedAndIndex) {
  sd::Image img = random_image(30, 40, 6);
  sd::Compose tf({sd::RandomResizedCrop(12, {0.2, 0.6}), sd::RandomHorizontalFlip(), sd::ToTensor()});
  auto run = [&](uint64_t seed, int64_t index) {
    st::Generator g = sd::sample_generator(seed, index);
    return values(as_tensor(tf(img, g)));
  };
  EXPECT_EQ(run(1, 3), run(1, 3));
  EXPECT_NE(run(1, 3), run(1, 4));
  EXPECT_NE(run(1, 3), run(2, 3));
  // fallback: a 1x100 strip has no crop with ratio <= 4/3 and area >= 90%: central 1x1
  sd::RandomResizedCrop strict(4, {0.9, 1.0});
  st::Generator g = sd::sample_generator(0, 0);
  sd::CropBox b = strict.get_params(1, 100, g);
  EXPECT_EQ(b.height, 1);
  EXPECT_EQ(b.width, 1);
  EXPECT_EQ(b.left, 49);
  EXPECT_THROW(sd::RandomResizedCrop(8, {0.5, 0.2}), st::Error);
  EXPECT_THROW(sd::RandomResizedCrop(0), st::Error);
}

TEST(Transforms, SampleGeneratorUniform) {
  // uniform() draws from [0, 1) with mean 1/2 and is a pure function of the generator state
  st::Generator a = sd::sample_generator(9, 1), b = sd::sample_generator(9, 1);
  double sum = 0;
  for (int i = 0; i < 20000; ++i) {
    double u = sd::uniform(a);
    ASSERT_EQ(u, sd::uniform(b));
    ASSERT_TRUE(u >= 0 && u < 1);
    sum += u;
  }
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
  EXPECT_NE(sd::sample_generator(9, 1).seed(), sd::sample_generator(9, 2).seed());
  EXPECT_NE(sd::sample_generator(9, 1, 0).seed(), sd::sample_generator(9, 1, 1).seed());
}

TEST(ImageOps, BoxesThatOverflowAndInconsistentImagesRaise) {
  const sd::Image img = random_image(4, 4, 2);
  const int64_t big = std::numeric_limits<int64_t>::max();
  // each of these sums past int64's range, and once passed the bounds check
  EXPECT_TRUE(throws_with([&] { sd::crop(img, {big, 0, 2, 2}); }, {"does not lie inside"}));
  EXPECT_TRUE(throws_with([&] { sd::crop(img, {1, 0, big, 2}); }, {"does not lie inside"}));
  EXPECT_TRUE(throws_with([&] { sd::crop(img, {0, 2, 2, big - 1}); }, {"does not lie inside"}));
  EXPECT_TRUE(throws_with([&] { sd::resize_bilinear(img, 2, 2, {2, 0, big - 1, 2}); }, {"does not lie inside"}));
  EXPECT_EQ(sd::crop(img, {1, 1, 3, 3}).height, 3);  // the last box that fits
  // an Image's public fields that disagree with its pixels
  sd::Image hollow;
  hollow.height = 10;
  hollow.width = 10;
  st::Generator g(1);
  EXPECT_TRUE(throws_with([&] { sd::hflip(hollow); }, {"holds 0 bytes, not 10x10x3"}));
  EXPECT_TRUE(throws_with([&] { sd::crop(hollow, {0, 0, 5, 5}); }, {"holds 0 bytes"}));
  EXPECT_TRUE(throws_with([&] { sd::resize_bilinear(hollow, 4, 4); }, {"holds 0 bytes"}));
  EXPECT_TRUE(throws_with([&] { sd::ToTensor()(hollow, g); }, {"holds 0 bytes"}));
  EXPECT_TRUE(throws_with([&] { sd::image_to_tensor(hollow); }, {"holds 0 bytes"}));
  EXPECT_TRUE(throws_with([&] { sd::Image(int64_t(1) << 31, int64_t(1) << 31); }, {"pixels"}));
}
