// 1-d pooling, instance norm, channel dropout, pixel shuffle, Unflatten and EmbeddingBag against
// float64 references written here with plain loops (windows by their definition, per-instance
// statistics, the pixel shuffle's index map, each bag's rows); finite differences; the layers'
// parameters, buffers and modes; bad input.
#include <algorithm>
#include <array>
#include <cmath>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

namespace {

struct Pool1dCase {
  int64_t n, c, l, k, stride, padding, dilation = 1;
  int64_t out_len() const { return (l + 2 * padding - dilation * (k - 1) - 1) / stride + 1; }
};

// max or average over each window's taps inside the input; the average divides by k when the
// padding counts, else by the taps inside
std::vector<double> pool1d_reference(const Pool1dCase& p, const std::vector<double>& x, bool max,
                                     bool count_include_pad) {
  std::vector<double> y;
  for (int64_t nc = 0; nc < p.n * p.c; ++nc)
    for (int64_t i = 0; i < p.out_len(); ++i) {
      double best = -INFINITY, sum = 0;
      int64_t inside = 0;
      for (int64_t t = 0; t < p.k; ++t) {
        const int64_t pos = i * p.stride - p.padding + t * p.dilation;
        if (pos < 0 || pos >= p.l) continue;
        const double v = x[static_cast<size_t>(nc * p.l + pos)];
        best = std::max(best, v);
        sum += v;
        ++inside;
      }
      y.push_back(max ? best : sum / static_cast<double>(count_include_pad ? p.k : inside));
    }
  return y;
}

}  // namespace

TEST(Pool1d, MaxAndAverageMatchReference) {
  Generator g(61);
  const Pool1dCase cases[] = {{2, 3, 11, 3, 2, 1}, {1, 4, 9, 2, 2, 0}, {2, 2, 13, 3, 1, 1, 2}, {3, 1, 7, 7, 1, 3}};
  for (const Pool1dCase& p : cases) {
    SCOPED_TRACE(fmt::format("l {} k {} stride {} padding {} dilation {}", p.l, p.k, p.stride, p.padding, p.dilation));
    const Tensor x = randn({p.n, p.c, p.l}, kFloat64, &g);
    const std::vector<double> xv = values(x);
    const F::MaxPool1dArgs max_args{p.stride, p.padding, p.dilation};
    const Tensor y = F::max_pool1d(x, p.k, max_args);
    EXPECT_EQ(y.shape(), (Shape{p.n, p.c, p.out_len()}));
    EXPECT_TRUE(all_close(y, pool1d_reference(p, xv, true, true), 0, 0));
    // the indices point at the maxima along L
    const F::MaxPoolResult r = F::max_pool1d_with_indices(x, p.k, max_args);
    const std::vector<double> idx = values(r.indices), got = values(r.output);
    for (size_t i = 0; i < idx.size(); ++i) {
      const size_t row = i / static_cast<size_t>(p.out_len());
      EXPECT_EQ(xv[row * static_cast<size_t>(p.l) + static_cast<size_t>(idx[i])], got[i]);
    }
    if (p.dilation != 1) continue;
    for (bool include : {true, false}) {
      const F::AvgPool1dArgs avg{p.stride, p.padding, false, include};
      EXPECT_TRUE(all_close(F::avg_pool1d(x, p.k, avg), pool1d_reference(p, xv, false, include), 1e-14, 1e-14));
    }
    // unbatched, and the layers
    EXPECT_TRUE(all_close(nn::MaxPool1d(p.k, max_args)(x[0]), values(y[0]), 0, 0));
  }
  // adaptive: windows [floor(i L / O), ceil((i + 1) L / O))
  const Tensor x = randn({2, 3, 10}, kFloat64, &g);
  const std::vector<double> xv = values(x);
  std::vector<double> want;
  for (int64_t nc = 0; nc < 6; ++nc)
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t lo = i * 10 / 4, hi = ((i + 1) * 10 + 3) / 4;
      double s = 0;
      for (int64_t j = lo; j < hi; ++j) s += xv[static_cast<size_t>(nc * 10 + j)];
      want.push_back(s / static_cast<double>(hi - lo));
    }
  EXPECT_TRUE(all_close(nn::AdaptiveAvgPool1d(4)(x), want, 1e-14, 1e-14));
}

TEST(Pool1d, GradientsAndBadInput) {
  Generator g(62);
  Tensor x = randn({2, 3, 9}, kFloat64, &g).requires_grad_();
  EXPECT_TRUE(gradcheck([](V in) { return F::avg_pool1d(in[0], 3, {2, 1}); }, {x}));
  EXPECT_TRUE(gradcheck([](V in) { return F::max_pool1d(in[0], 2, {2}); }, {x}));
  EXPECT_TRUE(gradcheck([](V in) { return F::adaptive_avg_pool1d(in[0], 4); }, {x}));
  EXPECT_TRUE(throws_with([] { F::max_pool1d(randn({1, 2, 3, 4}), 2); }, {"[max_pool1d]", "(N, C, L)"}));
  EXPECT_TRUE(throws_with([] { nn::AvgPool1d(0); }, {"[AvgPool1d]", "positive"}));
  EXPECT_TRUE(throws_with([] { nn::AdaptiveAvgPool1d(0); }, {"[AdaptiveAvgPool1d]", "positive"}));
}

// ---- instance norm -------------------------------------------------------------------------

namespace {

struct InstanceRef {
  std::vector<double> y, mean, var;  // var unbiased, per (n, c)
};

InstanceRef instance_reference(const Tensor& x, const std::vector<double>& w, const std::vector<double>& b,
                               double eps) {
  const std::vector<double> xv = values(x);
  const int64_t nc = x.size(0) * x.size(1), s = x.numel() / nc, c = x.size(1);
  InstanceRef r{std::vector<double>(xv.size()), {}, {}};
  for (int64_t i = 0; i < nc; ++i) {
    double mean = 0, sq = 0;
    for (int64_t j = 0; j < s; ++j) mean += xv[static_cast<size_t>(i * s + j)];
    mean /= static_cast<double>(s);
    for (int64_t j = 0; j < s; ++j) sq += std::pow(xv[static_cast<size_t>(i * s + j)] - mean, 2);
    const double inv = 1 / std::sqrt(sq / static_cast<double>(s) + eps);
    const size_t ch = static_cast<size_t>(i % c);
    for (int64_t j = 0; j < s; ++j) {
      const size_t e = static_cast<size_t>(i * s + j);
      r.y[e] = (xv[e] - mean) * inv * (w.empty() ? 1 : w[ch]) + (b.empty() ? 0 : b[ch]);
    }
    r.mean.push_back(mean);
    r.var.push_back(sq / static_cast<double>(s - 1));
  }
  return r;
}

}  // namespace

TEST(InstanceNorm, MatchesReferenceAndTracksStatistics) {
  Generator g(63);
  const Tensor x = randn({3, 4, 5, 6}, kFloat64, &g) * 2 + 1;
  nn::InstanceNorm2d plain(4);
  EXPECT_TRUE(plain.state_dict().empty());
  EXPECT_TRUE(all_close(plain(x), instance_reference(x, {}, {}, 1e-5).y, 1e-12, 1e-12));
  // affine and tracked: PyTorch's parameters and buffers
  nn::InstanceNorm2d tracked(4, {.momentum = 0.2, .affine = true, .track_running_stats = true});
  tracked.to(kFloat64);
  EXPECT_EQ(tracked.state_dict().size(), 5u);
  {
    NoGradGuard no_grad;
    tracked.weight.copy_(from_vector<double>({1, 2, 3, 4}));
    tracked.bias.copy_(from_vector<double>({0, -1, 1, 0.5}));
  }
  const std::vector<double> w = {1, 2, 3, 4}, b = {0, -1, 1, 0.5};
  const InstanceRef ref = instance_reference(x, w, b, 1e-5);
  EXPECT_TRUE(all_close(tracked(x), ref.y, 1e-12, 1e-12));
  // running = 0.8 running + 0.2 * (the instances' statistics averaged over the batch)
  std::vector<double> want_mean(4, 0.0), want_var(4, 1.0);
  for (size_t ch = 0; ch < 4; ++ch) {
    double m = 0, v = 0;
    for (size_t n = 0; n < 3; ++n) m += ref.mean[n * 4 + ch] / 3, v += ref.var[n * 4 + ch] / 3;
    want_mean[ch] = 0.2 * m;
    want_var[ch] = 0.8 + 0.2 * v;
  }
  EXPECT_TRUE(all_close(tracked.running_mean, want_mean, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(tracked.running_var, want_var, 1e-12, 1e-12));
  EXPECT_EQ(tracked.num_batches_tracked.item<int64_t>(), 1);
  // eval normalizes with the running statistics
  tracked.eval();
  std::vector<double> want_eval;
  const std::vector<double> xv = values(x);
  for (size_t e = 0; e < xv.size(); ++e) {
    const size_t ch = (e / 30) % 4;
    want_eval.push_back((xv[e] - want_mean[ch]) / std::sqrt(want_var[ch] + 1e-5) * w[ch] + b[ch]);
  }
  EXPECT_TRUE(all_close(tracked(x), want_eval, 1e-12, 1e-12));
  // 1d, unbatched
  nn::InstanceNorm1d one(3);
  const Tensor seq = randn({3, 7}, kFloat64, &g);
  EXPECT_TRUE(all_close(one(seq), instance_reference(seq.unsqueeze(0), {}, {}, 1e-5).y, 1e-12, 1e-12));
}

TEST(InstanceNorm, GradientsAndBadInput) {
  Generator g(64);
  std::vector<Tensor> in;
  for (const Shape& s : std::vector<Shape>{{2, 3, 5}, {3}, {3}}) in.push_back(randn(s, kFloat64, &g).requires_grad_());
  // first order only: batch norm's backward, which this runs, is not itself differentiable
  EXPECT_TRUE(gradcheck([](V v) { return F::instance_norm(v[0], Tensor(), Tensor(), v[1], v[2]); }, in));
  nn::InstanceNorm2d norm(4);
  EXPECT_TRUE(throws_with([&] { norm(randn({2, 3, 4, 4})); }, {"[InstanceNorm2d(4)]", "4 channels"}));
  EXPECT_TRUE(throws_with([&] { norm(randn({4, 4})); }, {"[InstanceNorm2d(4)]", "3-d or 4-d"}));
  EXPECT_TRUE(throws_with([&] { norm(randn({2, 4, 1, 1})); }, {"more than 1 spatial element"}));
  EXPECT_TRUE(throws_with([&] { nn::InstanceNorm1d(0); }, {"[InstanceNorm]", "positive"}));
  EXPECT_TRUE(throws_with([] { F::instance_norm(randn({2, 3})); }, {"[instance_norm]", "(N, C, *)"}));
  EXPECT_TRUE(throws_with([] { F::instance_norm(randn({2, 3, 4}), Tensor(), Tensor(), ones({4})); },
                          {"[instance_norm]", "shape (3)"}));
}

// ---- channel dropout, pixel shuffle, Unflatten ---------------------------------------------

TEST(ChannelDropout, DropsWholeChannelsAndScalesTheRest) {
  Generator g(65);
  const Tensor x = rand({8, 16, 5, 3}, kFloat64, &g) + 1;  // no zeros of its own
  Generator a(7), b(7);
  nn::Dropout2d drop(0.25, &a);
  const Tensor y = drop(x);
  const std::vector<double> xv = values(x), yv = values(y);
  int64_t dropped = 0;
  for (size_t ch = 0; ch < 8 * 16; ++ch) {
    const bool zero = yv[ch * 15] == 0;
    dropped += zero;
    for (size_t e = ch * 15; e < ch * 15 + 15; ++e)
      ASSERT_NEAR(yv[e], zero ? 0 : xv[e] / 0.75, 1e-12) << "channel " << ch;
  }
  EXPECT_GT(dropped, 10);  // about 32 of 128
  EXPECT_LT(dropped, 60);
  EXPECT_TRUE(all_close(F::dropout2d(x, 0.25, true, &b), yv, 0, 0));  // the same generator state, the same mask
  drop.eval();
  EXPECT_TRUE(all_close(drop(x), xv, 0, 0));
  // 1d: (N, C, L), and unbatched (C, L)
  const Tensor seq = rand({4, 6, 9}, kFloat64, &g) + 1;
  const std::vector<double> sv = values(F::dropout1d(seq, 0.5, true, &g));
  for (size_t ch = 0; ch < 24; ++ch)
    for (size_t e = ch * 9; e < ch * 9 + 9; ++e) ASSERT_EQ(sv[e] == 0, sv[ch * 9] == 0);
  EXPECT_EQ(F::dropout1d(seq[0], 0.5, true, &g).shape(), (Shape{6, 9}));
  Tensor leaf = x.clone().requires_grad_();
  EXPECT_TRUE(gradcheck([](V in) {
    Generator same(3);
    return F::dropout2d(in[0], 0.5, true, &same);
  }, {leaf}));
  EXPECT_TRUE(throws_with([&] { F::dropout2d(seq[0], 0.5); }, {"[dropout2d]", "3-d (unbatched) or 4-d"}));
  EXPECT_TRUE(throws_with([] { nn::Dropout1d(1.5); }, {"[Dropout1d]", "[0, 1]"}));
}

TEST(PixelShuffle, MatchesTheIndexMapAndInverts) {
  Generator g(66);
  const int64_t r = 3;
  const Tensor x = randn({2, 2 * r * r, 4, 5}, kFloat64, &g);
  const Tensor y = nn::PixelShuffle(r)(x);
  ASSERT_EQ(y.shape(), (Shape{2, 2, 12, 15}));
  const std::vector<double> xv = values(x), yv = values(y);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t h = 0; h < 12; ++h)
        for (int64_t w = 0; w < 15; ++w) {
          const int64_t src_c = c * r * r + (h % r) * r + (w % r);
          const double want = xv[static_cast<size_t>(((n * 2 * r * r + src_c) * 4 + h / r) * 5 + w / r)];
          ASSERT_EQ(yv[static_cast<size_t>(((n * 2 + c) * 12 + h) * 15 + w)], want);
        }
  EXPECT_TRUE(all_close(nn::PixelUnshuffle(r)(y), xv, 0, 0));
  EXPECT_EQ(F::pixel_shuffle(randn({5, 2, 8, 3, 3}), 2).shape(), (Shape{5, 2, 2, 6, 6}));  // any leading dims
  Tensor leaf = randn({1, 8, 2, 3}, kFloat64, &g).requires_grad_();
  EXPECT_TRUE(gradcheck([](V in) { return F::pixel_shuffle(in[0], 2); }, {leaf}));
  EXPECT_TRUE(throws_with([] { F::pixel_shuffle(randn({1, 7, 2, 2}), 2); }, {"[pixel_shuffle]", "7 channels"}));
  EXPECT_TRUE(throws_with([] { F::pixel_unshuffle(randn({1, 2, 5, 4}), 2); }, {"[pixel_unshuffle]", "divisible"}));
  EXPECT_TRUE(throws_with([] { F::pixel_shuffle(randn({4, 4}), 2); }, {"[pixel_shuffle]", "(*, C * r^2, H, W)"}));
}

TEST(Unflatten, SplitsOneDim) {
  const Tensor x = arange(0, 24, 1, kFloat32).view({2, 12});
  const Tensor y = nn::Unflatten(1, {3, -1})(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(all_close(y, values(x), 0, 0));
  EXPECT_THROW(nn::Unflatten(1, {5, -1})(x), Error);
}

// ---- EmbeddingBag --------------------------------------------------------------------------

TEST(EmbeddingBag, SumMeanAndMaxOfEachBag) {
  Generator g(67);
  nn::EmbeddingBag bag(10, 4, {.mode = nn::EmbeddingBagMode::Sum, .padding_idx = 2, .generator = &g});
  bag.to(kFloat64);
  EXPECT_TRUE(all_close(bag.weight[2], {0, 0, 0, 0}, 0, 0));  // the padding row starts at zero
  const std::vector<double> w = values(bag.weight);
  auto row = [&](int64_t i, int64_t d) { return w[static_cast<size_t>(i * 4 + d)]; };
  // bags {1, 2, 4}, {} and {9, 9, 0, 2}: offsets (0, 3, 3); index 2 is padding and is left out
  const Tensor idx = from_vector<int64_t>({1, 2, 4, 9, 9, 0, 2}), offsets = from_vector<int64_t>({0, 3, 3});
  const std::vector<std::vector<int64_t>> bags = {{1, 4}, {}, {9, 9, 0}};
  for (auto mode : {nn::EmbeddingBagMode::Sum, nn::EmbeddingBagMode::Mean, nn::EmbeddingBagMode::Max}) {
    SCOPED_TRACE(static_cast<int>(mode));
    bag.options.mode = mode;
    std::vector<double> want;
    for (const auto& b : bags)
      for (int64_t d = 0; d < 4; ++d) {
        double acc = mode == nn::EmbeddingBagMode::Max ? -INFINITY : 0;
        for (int64_t i : b) acc = mode == nn::EmbeddingBagMode::Max ? std::max(acc, row(i, d)) : acc + row(i, d);
        if (b.empty()) acc = 0;
        else if (mode == nn::EmbeddingBagMode::Mean) acc /= static_cast<double>(b.size());
        want.push_back(acc);
      }
    EXPECT_TRUE(all_close(bag.forward(idx, offsets), want, 1e-14, 1e-14));
    // the same bags with the last offset included
    EXPECT_TRUE(all_close(F::embedding_bag(idx, bag.weight, {from_vector<int64_t>({0, 3, 3, 7}), mode, {}, true, 2}),
                          want, 1e-14, 1e-14));
  }
  bag.options.mode = nn::EmbeddingBagMode::Mean;
  const Tensor rows = from_vector<int64_t>({3, 5, 3, 7, 8, 1}).view({2, 3});
  EXPECT_TRUE(all_close(bag(rows), values(F::embedding_bag(rows.reshape({-1}), bag.weight,
                                                             {from_vector<int64_t>({0, 3})})),
                        1e-14, 1e-14));
  // per-sample weights scale each row of a sum
  const Tensor psw = from_vector<double>({2, 1, -1, 0.5, 0.5, 3, 1});
  std::vector<double> want_weighted;
  for (int64_t d = 0; d < 4; ++d) want_weighted.push_back(2 * row(1, d) - row(4, d));
  for (int64_t d = 0; d < 4; ++d) want_weighted.push_back(0);
  for (int64_t d = 0; d < 4; ++d) want_weighted.push_back(0.5 * row(9, d) + 0.5 * row(9, d) + 3 * row(0, d));
  EXPECT_TRUE(all_close(F::embedding_bag(idx, bag.weight, {offsets, nn::EmbeddingBagMode::Sum, psw, false, 2}),
                        want_weighted, 1e-14, 1e-14));
}

TEST(EmbeddingBag, GradientsAndBadInput) {
  Generator g(68);
  Tensor w = randn({6, 3}, kFloat64, &g).requires_grad_();
  Tensor psw = randn({5}, kFloat64, &g).requires_grad_();
  const Tensor idx = from_vector<int64_t>({0, 5, 5, 2, 3}), off = from_vector<int64_t>({0, 2});
  for (auto mode : {nn::EmbeddingBagMode::Sum, nn::EmbeddingBagMode::Mean, nn::EmbeddingBagMode::Max})
    EXPECT_TRUE(gradcheck([&](V in) { return F::embedding_bag(idx, in[0], {off, mode}); }, {w}));
  EXPECT_TRUE(gradcheck([&](V in) { return F::embedding_bag(idx, in[0], {off, nn::EmbeddingBagMode::Sum, in[1]}); },
                        {w, psw}));
  const Tensor weight = randn({6, 3});
  EXPECT_TRUE(throws_with([&] { F::embedding_bag(idx, weight); }, {"[embedding_bag]", "offsets"}));
  EXPECT_TRUE(throws_with([&] { F::embedding_bag(idx, weight, {from_vector<int64_t>({1, 2})}); }, {"first offset"}));
  EXPECT_TRUE(throws_with([&] { F::embedding_bag(idx, weight, {from_vector<int64_t>({0, 4, 2})}); }, {"ascending"}));
  EXPECT_TRUE(throws_with([&] { F::embedding_bag(from_vector<int64_t>({0, 6}), weight, {from_vector<int64_t>({0})}); },
                          {"out of range"}));
  EXPECT_TRUE(throws_with([&] { F::embedding_bag(idx, weight, {off, nn::EmbeddingBagMode::Mean, ones({5})}); },
                          {"per_sample_weights", "Sum"}));
  EXPECT_TRUE(throws_with([&] { F::embedding_bag(idx, weight, {off, nn::EmbeddingBagMode::Sum, {}, true}); },
                          {"include_last_offset"}));
  EXPECT_TRUE(throws_with([&] { nn::EmbeddingBag(4, 2, {.padding_idx = 4}); }, {"[EmbeddingBag]", "padding_idx"}));
}

// ---- adaptive max pooling ------------------------------------------------------------------

TEST(AdaptiveMaxPool, MatchesTheWindowsDefinition) {
  Generator g(69);
  const std::vector<std::array<int64_t, 4>> sizes = {{7, 9, 3, 4}, {8, 6, 4, 3}, {5, 5, 5, 2}, {6, 7, 1, 1}};
  for (auto [h, w, oh, ow] : sizes) {
    SCOPED_TRACE(fmt::format("{}x{} -> {}x{}", h, w, oh, ow));
    const Tensor x = randn({2, 3, h, w}, kFloat64, &g);
    const std::vector<double> xv = values(x);
    std::vector<double> want;
    for (int64_t nc = 0; nc < 6; ++nc)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double best = -INFINITY;
          for (int64_t y = i * h / oh; y < ((i + 1) * h + oh - 1) / oh; ++y)
            for (int64_t z = j * w / ow; z < ((j + 1) * w + ow - 1) / ow; ++z)
              best = std::max(best, xv[static_cast<size_t>((nc * h + y) * w + z)]);
          want.push_back(best);
        }
    const Tensor y = nn::AdaptiveMaxPool2d({oh, ow})(x);
    EXPECT_EQ(y.shape(), (Shape{2, 3, oh, ow}));
    EXPECT_TRUE(all_close(y, want, 0, 0));
    EXPECT_TRUE(all_close(F::adaptive_max_pool2d(x[1], {oh, ow}), values(y[1]), 0, 0));  // unbatched
    Tensor leaf = x.clone().requires_grad_();
    EXPECT_TRUE(gradcheck([oh, ow](V in) { return F::adaptive_max_pool2d(in[0], {oh, ow}); }, {leaf}));
  }
  const Tensor seq = randn({2, 3, 10}, kFloat64, &g);
  EXPECT_TRUE(all_close(nn::AdaptiveMaxPool1d(4)(seq), values(F::adaptive_max_pool2d(seq.unsqueeze(2), {1, 4})), 0, 0));
  EXPECT_TRUE(throws_with([] { nn::AdaptiveMaxPool2d({0, 2}); }, {"[AdaptiveMaxPool2d]", "positive"}));
  EXPECT_TRUE(throws_with([] { F::adaptive_max_pool2d(randn({2, 3}), {1, 1}); }, {"(N, C, H, W)"}));
  EXPECT_TRUE(throws_with([] { F::adaptive_max_pool1d(randn({2, 3, 4, 5}), 2); }, {"(N, C, L)"}));
}
