// Philox: known-answer vectors of the published generator, stream layout, determinism by
// seed, and the statistics of each distribution.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/common/philox.h"
#include "kernels/cpu/fast_remainder.h"
#include "testing.h"

using namespace strata;
using strata::testing::values;

TEST(Philox, KnownAnswers) {
  // Known-answer tests of Philox4x32-10 from the Random123 distribution (kat_vectors).
  philox::Block z = philox::philox4x32_10(philox::Block{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(z.v[0], 0x6627e8d5u);
  EXPECT_EQ(z.v[1], 0xe169c58du);
  EXPECT_EQ(z.v[2], 0xbc57ac4cu);
  EXPECT_EQ(z.v[3], 0x9b00dbd8u);
  philox::Block f = philox::philox4x32_10(philox::Block{{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  EXPECT_EQ(f.v[0], 0x408f276du);
  EXPECT_EQ(f.v[1], 0x41c83b0eu);
  EXPECT_EQ(f.v[2], 0xa20bc7c6u);
  EXPECT_EQ(f.v[3], 0x6d5451fdu);
  philox::Block p = philox::philox4x32_10(philox::Block{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                          0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(p.v[0], 0xd16cfe09u);
  EXPECT_EQ(p.v[1], 0x94fdccebu);
  EXPECT_EQ(p.v[2], 0x5001e420u);
  EXPECT_EQ(p.v[3], 0x24126ea1u);
}

TEST(Philox, StreamLayout) {
  Generator g(1234);
  Tensor a = rand({10}, {}, &g);
  EXPECT_EQ(g.offset(), 3u);  // ceil(10 / 4) blocks
  std::vector<double> v = values(a);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(v[i], static_cast<double>(philox::uniform_at(1234, 0, i)));
  // the next draw continues from the reserved offset
  Tensor b = rand({3}, {}, &g);
  EXPECT_EQ(values(b)[0], static_cast<double>(philox::uniform_at(1234, 3, 0)));
  // the CPU kernels draw a block at a time; every element is still the per-element function's
  // (the CUDA kernels' form), partial last blocks included: exactly, and for the normals to the
  // last bits, as the vectorized loop and this file may contract multiplies and adds differently
  // into fused ones (a wrong lane, pair or block is a different value altogether)
  // randint on ranges from 1 to 2^54, the widest its +-2^53 bounds allow
  constexpr int64_t k53 = int64_t{1} << 53;
  for (auto [low, high] : {std::pair<int64_t, int64_t>{5, 6}, {0, 2}, {-(int64_t{1} << 32), 1}, {-k53 + 3, k53 / 2 + 5},
                           {-k53, k53}}) {
    Generator gr(21);
    const uint64_t offset = gr.offset();
    const Tensor k = randint(low, high, {1001}, kInt64, &gr);
    const int64_t* kv = static_cast<const int64_t*>(k.data());
    const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
    for (uint64_t i = 0; i < 1001; ++i)
      ASSERT_EQ(static_cast<uint64_t>(kv[i]), static_cast<uint64_t>(low) + philox::bits64_at(21, offset, i) % range)
          << low << " " << high << " " << i;
  }
  for (int64_t n : {1, 3, 5, 4099}) {
    Generator gu(9), gn(9), gi(9);
    const uint64_t offset = gu.offset();
    std::vector<double> u = values(rand({n}, {}, &gu)), z = values(randn({n}, kFloat64, &gn));
    std::vector<double> k = values(randint(-7, 1000003, {n}, kInt64, &gi));
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t e = static_cast<uint64_t>(i);
      ASSERT_EQ(u[i], static_cast<double>(philox::uniform_at(9, offset, e))) << n << " " << i;
      const double want = philox::normal_at(9, offset, e);
      ASSERT_NEAR(z[i], want, 5e-7 * std::max(1.0, std::fabs(want))) << n << " " << i;
      ASSERT_EQ(k[i], static_cast<double>(-7 + static_cast<int64_t>(philox::bits64_at(9, offset, e) % 1000010u)))
          << n << " " << i;
    }
  }
}

TEST(Philox, DeterministicBySeed) {
  manual_seed(7);
  std::vector<double> a = values(randn({257}));
  manual_seed(7);
  std::vector<double> b = values(randn({257}));
  EXPECT_EQ(a, b);
  manual_seed(8);
  EXPECT_NE(values(randn({257})), a);
  // restoring a saved state replays the stream
  Generator g(99);
  rand({5}, {}, &g);
  Generator saved = g;
  std::vector<double> next = values(rand({6}, {}, &g));
  EXPECT_EQ(values(rand({6}, {}, &saved)), next);
  // same values whatever the number of threads (counter-based)
  Generator g1(5), g2(5);
  set_num_threads(1);
  std::vector<double> one = values(randn({100000}, {}, &g1));
  set_num_threads(2);
  EXPECT_EQ(values(randn({100000}, {}, &g2)), one);
}

// A draw reads the seed and reserves its counters in one step (another thread's manual_seed
// cannot fall between them), and the state is read whole.
TEST(Philox, DrawsReadSeedAndCounterTogether) {
  Generator g(41);
  g.set_state(41, 10);
  const RandomDraw first = g.reserve_draw(3);
  EXPECT_EQ(first.seed, 41u);
  EXPECT_EQ(first.offset, 10u);
  EXPECT_EQ(g.reserve(2), 13u);
  const RandomDraw now = g.state();
  EXPECT_EQ(now.seed, g.seed());
  EXPECT_EQ(now.offset, 15u);
  g.manual_seed(7);
  EXPECT_EQ(g.reserve_draw(1).seed, 7u);
  EXPECT_EQ(g.state().offset, 1u);
}

TEST(Philox, Distributions) {
  Generator g(42);
  const int64_t n = 200000;
  auto moments = [](const std::vector<double>& v) {
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= v.size();
    for (double x : v) s += (x - m) * (x - m);
    return std::pair<double, double>(m, std::sqrt(s / (v.size() - 1)));
  };
  std::vector<double> u = values(rand({n}, kFloat64, &g));
  for (double x : u) ASSERT_TRUE(x >= 0 && x < 1);
  auto [um, us] = moments(u);
  EXPECT_NEAR(um, 0.5, 0.005);
  EXPECT_NEAR(us, std::sqrt(1.0 / 12), 0.005);
  auto [nm, ns] = moments(values(randn({n}, {}, &g)));
  EXPECT_NEAR(nm, 0, 0.01);
  EXPECT_NEAR(ns, 1, 0.01);
  Tensor scaled = empty({n}, kFloat32);
  normal_(scaled, 3, 2, &g);
  auto [sm, ss] = moments(values(scaled));
  EXPECT_NEAR(sm, 3, 0.02);
  EXPECT_NEAR(ss, 2, 0.02);
  std::vector<double> r = values(randint(-3, 4, {n}, std::nullopt, &g));
  std::vector<int64_t> counts(7, 0);
  for (double x : r) {
    ASSERT_TRUE(x >= -3 && x < 4);
    ++counts[static_cast<size_t>(x + 3)];
  }
  for (int64_t c : counts) EXPECT_NEAR(static_cast<double>(c) / n, 1.0 / 7, 0.01);
  EXPECT_EQ(randint(0, 10, {4}, kInt32, &g).dtype(), kInt32);
  // strided destinations are filled in C order of the view
  Tensor base = zeros({4, 6});
  Tensor view = base.slice(1, 0, 6, 2);
  uniform_(view, -1, 1, &g);
  for (double x : values(view)) EXPECT_TRUE(x >= -1 && x < 1);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(base[i][1].item<float>(), 0.0f);
  EXPECT_THROW(uniform_(view, 1, 0), Error);
  EXPECT_THROW(normal_(view, 0, -1), Error);
  Tensor ints = zeros({3}, kInt32);
  EXPECT_THROW(uniform_(ints), Error);
  // a leaf that requires grad takes draws only under NoGradGuard, contiguous or not, naming the op
  Tensor w = zeros({2, 3}).requires_grad_();
  EXPECT_TRUE(strata::testing::throws_with([&] { uniform_(w); }, {"[uniform_]", "leaf tensor that requires grad"}));
  Tensor wt = w.t();
  EXPECT_TRUE(strata::testing::throws_with([&] { normal_(wt); }, {"[normal_]"}));
  EXPECT_TRUE(strata::testing::all_close(w, {0, 0, 0, 0, 0, 0}, 0, 0));
  {
    NoGradGuard no_grad;
    normal_(wt, 5, 0.1, &g);
  }
  for (double x : values(w)) EXPECT_NEAR(x, 5, 1);
  // a non-leaf takes fresh values that carry no gradient back (Note [In-place under autograd])
  Tensor h = w * 1.0;
  uniform_(h, 2, 3, &g);
  for (double x : values(h)) EXPECT_TRUE(x >= 2 && x < 3);
  (h.sum() + (w * 2.0).sum()).backward();
  EXPECT_TRUE(strata::testing::all_close(w.grad(), {2, 2, 2, 2, 2, 2}, 0, 0));
  Tensor expanded = zeros({1}).expand({4});
  EXPECT_TRUE(strata::testing::throws_with([&] { uniform_(expanded); }, {"[uniform_]", "share memory"}));
}

// randint's division-free remainder (kernels/cpu/fast_remainder.h) against %, at the ends of
// both ranges and on pseudo-random pairs of every divisor width.
TEST(Random, FastRemainderMatchesDivision) {
  const uint64_t top = ~uint64_t{0};
  const std::vector<uint64_t> divisors = {1, 2, 3, 7, 10, 4096, 1000003, (uint64_t{1} << 32) - 1, uint64_t{1} << 32,
                                          (uint64_t{1} << 32) + 1, uint64_t{1} << 54, (uint64_t{1} << 63) + 5, top - 1,
                                          top};
  const std::vector<uint64_t> xs = {0, 1, 2, 4095, 4096, 4097, uint64_t{1} << 63, top - 1, top};
  for (uint64_t d : divisors) {
    const strata::cpu::FastRemainder r(d);
    for (uint64_t x : xs) ASSERT_EQ(r(x), x % d) << x << " % " << d;
    for (uint64_t k = 1; k < 64; ++k) ASSERT_EQ(r(d * k), (d * k) % d) << d << " * " << k;
  }
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&] {  // xorshift64
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int i = 0; i < 200000; ++i) {
    const uint64_t d = std::max<uint64_t>(1, next() >> (i % 64)), x = next();
    ASSERT_EQ(strata::cpu::FastRemainder(d)(x), x % d) << x << " % " << d;
  }
}
