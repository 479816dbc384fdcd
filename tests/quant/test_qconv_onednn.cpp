// The int8 convolution through oneDNN against its im2col + int8 GEMM reference (set_onednn_int8_conv
// switches between them): every output bit equal over groups, strides, padding, dilation, odd
// sizes, zero points, per-tensor and per-channel weight scales, channels-last inputs and converted
// models with fused ReLU and requantized outputs; sums that saturate int16 pairs against float64
// integer math; and, on CPUs with VNNI in a build with oneDNN, that oneDNN ran. The int8 Linear
// through oneDNN's integer GEMM against the exact sums.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <strata/profiler/profiler.hpp>

#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace F = strata::nn::functional;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::values;

namespace {

// Whether oneDNN must take the int8 convolutions here: a build with it on a CPU with AVX-512 VNNI.
bool expect_onednn() {
#if defined(STRATA_TEST_ONEDNN) && defined(__x86_64__)
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// f() with the oneDNN int8 convolution switched on or off, the setting restored after.
template <class Fn>
auto with_onednn(bool enabled, const Fn& f) {
  const bool before = q::onednn_int8_conv_enabled();
  q::set_onednn_int8_conv(enabled);
  auto y = f();
  q::set_onednn_int8_conv(before);
  return y;
}

// The names of the ops f() runs.
template <class Fn>
std::vector<std::string> ops_of(const Fn& f) {
  st::profiler::Profiler p;
  {
    st::profiler::ProfileScope scope(p);
    f();
  }
  std::vector<std::string> names;
  for (const auto& e : p.events()) names.push_back(e.name);
  return names;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// f() gives the same bits through oneDNN and through the reference, and oneDNN ran where expected.
template <class Fn>
::testing::AssertionResult same_both_ways(const Fn& f) {
  const st::Tensor ref = with_onednn(false, f), got = with_onednn(true, f);
  if (got.shape() != ref.shape()) return ::testing::AssertionFailure() << "shapes differ";
  if (got.is_contiguous() != ref.is_contiguous()) return ::testing::AssertionFailure() << "layouts differ";
  const std::vector<double> a = values(got), b = values(ref);
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  const std::vector<std::string> on = ops_of([&] { with_onednn(true, f); });
  if (!contains(on, "quant_conv2d_int8_onednn") && !contains(on, "quant_im2col_u8"))
    return ::testing::AssertionFailure() << "no int8 convolution ran";
  if (expect_onednn() && contains(on, "quant_im2col_u8"))
    return ::testing::AssertionFailure() << "oneDNN did not take the convolution";
  if (contains(with_onednn(false, [&] { return ops_of(f); }), "quant_conv2d_int8_onednn"))
    return ::testing::AssertionFailure() << "oneDNN ran while switched off";
  return ::testing::AssertionSuccess();
}

struct Case {
  int64_t n, c, h, w, out, kh, kw;
  F::Conv2dArgs args;
  int64_t zero_point;
};

}  // namespace

TEST(Conv2dInt8OneDnn, SameBitsAsTheReference) {
  const std::vector<Case> cases = {
      {2, 3, 7, 5, 5, 3, 3, {.padding = 1}, 128},                                           // odd sizes
      {2, 4, 9, 8, 6, 3, 2, {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}, .groups = 2}, 0},
      {1, 16, 6, 6, 16, 3, 3, {.padding = 1, .groups = 16}, 255},                           // depthwise
      {3, 64, 10, 11, 32, 1, 1, {}, 37},                                                     // 1x1
      {1, 8, 13, 13, 24, 5, 5, {.stride = {3, 2}, .padding = {2, 3}, .dilation = {2, 1}, .groups = 4}, 200},
      {2, 32, 12, 12, 64, 3, 3, {.stride = 2, .padding = 1}, 90},
      {1, 5, 4, 4, 7, 1, 1, {.padding = 2}, 17},        // rows and columns of padding only
      {1, 6, 8, 9, 6, 3, 3, {.stride = 2, .groups = 3}, 64},  // the last window stops short
      {1, 3, 3, 3, 2, 3, 3, {}, 5},                     // one output pixel
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const Case& c = cases[i];
    st::manual_seed(20 + int64_t(i));
    const int64_t cg = c.c / c.args.groups;
    const st::Tensor x = st::randn({c.n, c.c, c.h, c.w});
    const st::Tensor weight = st::randn({c.out, cg, c.kh, c.kw}), bias = st::randn({c.out});
    const q::Int8Weight per_channel = q::quantize_weight_int8(weight.reshape({c.out, -1}));
    const q::Int8Weight per_tensor{per_channel.codes, st::full({c.out}, 0.013)};
    for (const q::Int8Weight& w : {per_channel, per_tensor}) {
      const auto conv = [&](const st::Tensor& in, const st::Tensor& b) {
        return [&, in, b] { return q::conv2d_int8(in, 0.021, c.zero_point, w, {c.kh, c.kw}, c.args, b); };
      };
      EXPECT_TRUE(same_both_ways(conv(x, {})));
      EXPECT_TRUE(same_both_ways(conv(x, bias)));
      EXPECT_TRUE(same_both_ways(conv(x.to(st::MemoryFormat::ChannelsLast), bias)));
    }
  }
}

// Codes 255 times weight codes 127 and -128 in adjacent pairs: sums a pairwise int16 product
// (oneDNN's int8 kernels without VNNI) would saturate; both ways equal the float64 integer math.
TEST(Conv2dInt8OneDnn, ExtremeCodesAreExact) {
  const int64_t C = 64, out = 8;
  std::vector<double> codes;
  for (int64_t i = 0; i < out * C * 9; ++i) codes.push_back((i / 2) % 3 == 0 ? -128 : 127);
  const q::Int8Weight w{st::from_vector(codes, st::Shape{out, C * 9}).to(st::kInt8), st::full({out}, 1.0)};
  const st::Tensor x = st::full({2, C, 5, 6}, 10.0);  // code 255 at scale 0.01, zero point 0
  const F::Conv2dArgs args{.padding = 1};
  const auto conv = [&] { return q::conv2d_int8(x, 0.01, 0, w, {3, 3}, args); };
  EXPECT_TRUE(same_both_ways(conv));
  const st::Tensor acc = F::conv2d(st::full({2, C, 5, 6}, 255.0, st::kFloat64),
                                   w.codes.to(st::kFloat64).reshape({out, C, 3, 3}), {}, args);
  std::vector<double> want;
  for (double a : values(acc)) want.push_back(static_cast<float>(a) * 0.01f);
  EXPECT_TRUE(all_close(conv(), want, 0, 0));
}

// Converted models: fused ReLU and requantized outputs, grouped and strided, channels last or not.
TEST(Conv2dInt8OneDnn, ConvertedModelsSameBits) {
  st::manual_seed(31);
  nn::Sequential model(nn::Conv2d(8, 16, 3, {.stride = 2, .padding = 1, .groups = 2}), nn::ReLU(),
                       nn::Conv2d(16, 12, 3, {.padding = 2, .dilation = 2}));
  model.eval();
  q::fuse_modules(model, {{"0", "1"}});
  EXPECT_EQ(q::prepare(model), 2);
  for (int i = 0; i < 3; ++i) model(st::randn({4, 8, 11, 9}));
  EXPECT_EQ(q::convert(model), 2);
  const st::Tensor x = st::randn({3, 8, 11, 9});
  EXPECT_TRUE(same_both_ways([&] { return model(x); }));
  EXPECT_TRUE(same_both_ways([&] { return model(x.to(st::MemoryFormat::ChannelsLast)); }));
}

// The im2col path keeps the weight laid out as its columns with the layer; a load_state_dict of
// other weights must reach the next forward.
TEST(Conv2dInt8OneDnn, Im2colLayoutFollowsLoadedWeights) {
  const auto converted = [](uint64_t seed) {
    st::manual_seed(seed);
    auto model = std::make_unique<nn::Sequential>(nn::Conv2d(6, 8, 3, {.padding = 1, .groups = 2}));
    model->eval();
    q::prepare(*model);
    model->forward(st::randn({2, 6, 7, 7}));
    q::convert(*model);
    return model;
  };
  const auto a = converted(41), b = converted(42);
  const st::Tensor x = st::randn({2, 6, 7, 7});
  const std::vector<double> first = values(with_onednn(false, [&] { return (*a)(x); }));
  EXPECT_EQ(values(with_onednn(false, [&] { return (*a)(x); })), first);
  a->load_state_dict(b->state_dict());
  const std::vector<double> loaded = values(with_onednn(false, [&] { return (*a)(x); }));
  EXPECT_EQ(loaded, values(with_onednn(false, [&] { return (*b)(x); })));
  EXPECT_NE(loaded, first);
}

// From 32 rows the int8 Linear takes oneDNN's integer GEMM (on CPUs with VNNI): its outputs equal
// the float32 epilogue of the exact sums, written out here in float64, with extreme codes too.
TEST(LinearInt8OneDnn, ManyRowsAreExact) {
  st::manual_seed(41);
  const int64_t M = 97, K = 300, N = 45;
  const st::Tensor weight = st::randn({N, K}), bias = st::randn({N});
  const q::Int8Weight w = q::quantize_weight_int8(weight);
  for (const auto& [x, scale, zero] : {std::tuple{st::randn({M, K}), 0.02, int64_t{130}},
                                       std::tuple{st::full({M, K}, 10.0), 0.01, int64_t{0}}}) {
    const st::Tensor y = q::linear_int8_static(x, scale, zero, w, bias);
    std::vector<double> codes = values(x);
    for (double& v : codes)  // PyTorch's quantize in float32, then centred: exact integers
      v = std::clamp(std::nearbyint(static_cast<double>(static_cast<float>(v) * (1.0f / static_cast<float>(scale)))) +
                         double(zero), 0.0, 255.0) - double(zero);
    const st::Tensor acc = F::linear(st::from_vector(codes, st::Shape{M, K}), w.codes.to(st::kFloat64));
    const std::vector<double> a = values(acc), got = values(y), ws = values(w.scale), b = values(bias);
    for (size_t i = 0; i < a.size(); ++i) {
      const float product = static_cast<float>(a[i]) * (static_cast<float>(scale) * static_cast<float>(ws[i % N]));
      ASSERT_EQ(got[i], static_cast<double>(product + static_cast<float>(b[i % N]))) << i;
    }
  }
}

// Dynamic activations are quantized per row, so 64 rows at once (oneDNN's GEMM) give the bits of
// the same rows in blocks of 16 (below 32 rows: the own GEMM).
TEST(LinearInt8OneDnn, DynamicRowsSameBitsInSmallBlocks) {
  st::manual_seed(42);
  const st::Tensor x = st::randn({64, 200}) + 0.3, bias = st::randn({33});
  const q::Int8Weight w = q::quantize_weight_int8(st::randn({33, 200}));
  const st::Tensor all = q::linear_int8_dynamic(x, w, bias);
  for (int64_t r = 0; r < 64; r += 16)
    EXPECT_TRUE(all_close(all.narrow(0, r, 16), values(q::linear_int8_dynamic(x.narrow(0, r, 16), w, bias)), 0, 0))
        << r;
}
