// 8-bit Adam and its quantization: the dynamic maps, nearest-code quantization, each step's
// requantization error, the drift from fp32 AdamW over 200 steps (within the provable bound
// of the per-step errors), the fp32 path for small tensors, and the state memory.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include <strata/kernels/common/quant8.h>

#include "optim/optim_testing.h"

namespace strata {
namespace {

struct Maps {
  float s[256], u[256];
  Maps() {
    quant8::build_dynamic_map(s, true);
    quant8::build_dynamic_map(u, false);
  }
};

// Distance from x to the nearest map value, and the largest such distance over the range.
double nearest_distance(const float* map, double x) {
  double d = INFINITY;
  for (int k = 0; k < 256; ++k) d = std::min(d, std::fabs(map[k] - x));
  return d;
}
double max_error(const float* map, double lo) {
  double h = map[0] - lo;
  for (int k = 0; k + 1 < 256; ++k) h = std::max(h, (double(map[k + 1]) - map[k]) / 2);
  return h;
}

std::vector<double> normals(size_t n, std::mt19937& rng, double scale = 1) {
  std::normal_distribution<double> d(0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(static_cast<float>(d(rng)));
  return v;
}

TEST(Quant8, DynamicMaps) {
  Maps m;
  EXPECT_TRUE(std::is_sorted(m.s, m.s + 256));
  EXPECT_TRUE(std::is_sorted(m.u, m.u + 256));
  EXPECT_EQ(m.s[255], 1.0f);
  EXPECT_FLOAT_EQ(m.s[0], -0.99296875f);  // the largest of 64 midpoints in [0.1, 1]
  EXPECT_EQ(std::count(m.s, m.s + 256, 0.0f), 1);
  EXPECT_EQ(std::count_if(m.s, m.s + 256, [](float x) { return x < 0; }), 127);
  EXPECT_FLOAT_EQ(m.s[128], 0.55e-6f);  // the one value of the smallest decade
  EXPECT_EQ(m.u[0], 0.0f);
  EXPECT_EQ(m.u[255], 1.0f);
  EXPECT_FLOAT_EQ(m.u[1], 0.325e-6f);  // first of two midpoints of the smallest decade
  EXPECT_FLOAT_EQ(m.u[254], 1 - 0.9f / 256);
  // step sizes shrink toward zero: relative precision is what the map is for
  EXPECT_LT(m.u[2] - m.u[1], 1e-6f);
  EXPECT_NEAR(max_error(m.s, -1), 0.9 / 128, 1e-7);
}

TEST(Quant8, QuantizeIsNearestCode) {
  Maps m;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) {
    // spread over decades: the map is dense near zero
    float x = uni(rng) * std::pow(10.0f, -static_cast<float>(i % 7));
    for (const float* map : {m.s, m.u}) {
      float xi = map == m.u ? std::fabs(x) : x;
      uint8_t c = quant8::quantize_nearest(map, xi);
      ASSERT_NEAR(std::fabs(map[c] - xi), nearest_distance(map, xi), 0) << xi;
    }
  }
  EXPECT_EQ(m.s[quant8::quantize_nearest(m.s, 0.0f)], 0.0f);
  EXPECT_EQ(m.s[quant8::quantize_nearest(m.s, -2.0f)], m.s[0]);  // clamped to the ends
  EXPECT_EQ(m.u[quant8::quantize_nearest(m.u, 5.0f)], 1.0f);
  // a block round trip: every value within its nearest distance of the absmax-scaled map
  std::vector<float> v(300);
  for (float& x : v) x = uni(rng) * 3;
  float absmax = quant8::block_absmax(v.data(), 300);
  std::vector<uint8_t> codes(300);
  std::vector<float> back(300);
  quant8::quantize_block(m.s, v.data(), 300, absmax, codes.data());
  quant8::dequantize_block(m.s, codes.data(), 300, absmax, back.data());
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_LE(std::fabs(back[i] - v[i]), (nearest_distance(m.s, v[i] / absmax) + 1e-6) * absmax);  // + float32 rounding
  // a block of subnormal values, whose absmax has no finite reciprocal, keeps its proportions
  const std::vector<float> tiny = {2e-39f, 1e-39f, 5e-40f, -2e-39f};
  const float tiny_max = quant8::block_absmax(tiny.data(), 4);
  std::vector<uint8_t> tiny_codes(4);
  quant8::quantize_block(m.s, tiny.data(), 4, tiny_max, tiny_codes.data());
  for (size_t i = 0; i < tiny.size(); ++i)
    EXPECT_EQ(tiny_codes[i], quant8::quantize_nearest(m.s, static_cast<float>(double(tiny[i]) / tiny_max))) << i;
}

// After each step the stored moments are the exact fp32 Adam update of the previous stored
// moments, quantized to the nearest code of their block's scale; the parameter moves by the
// AdamW step computed with the unquantized new moments.
TEST(Adam8bit, EachStepRequantizesToTheNearestCode) {
  Maps maps;
  const int64_t n = 3 * 2048 + 100;  // a partial last block
  const optim::Adam8bitOptions o{.lr = 1e-2, .weight_decay = 0.01};
  std::mt19937 rng(3);
  Tensor p = from_vector(normals(n, rng), Shape{n}).to(kFloat32);
  p.requires_grad_();
  optim::Adam8bit opt({p}, o);
  for (int t = 1; t <= 30; ++t) {
    std::vector<double> g = normals(n, rng, 0.01 * t);  // the scale drifts, as real grads do
    auto prev = opt.moments(p);
    std::vector<double> m = prev.exp_avg.defined() ? testing::values(prev.exp_avg) : std::vector<double>(n, 0.0);
    std::vector<double> v = prev.exp_avg_sq.defined() ? testing::values(prev.exp_avg_sq) : std::vector<double>(n, 0.0);
    std::vector<double> want_p = testing::values(p);
    p.set_grad(from_vector(g, Shape{n}).to(kFloat32));
    opt.step();
    ASSERT_TRUE(opt.is_quantized(p));
    const double bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.999, t);
    for (int64_t i = 0; i < n; ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      want_p[i] = want_p[i] * (1 - o.lr * o.weight_decay) - o.lr / bc1 * m[i] / (std::sqrt(v[i] / bc2) + o.eps);
    }
    EXPECT_TRUE(testing::all_close(p, want_p, 1e-6, 1e-7)) << "step " << t;
    auto now = opt.moments(p);
    std::vector<double> m8 = testing::values(now.exp_avg), v8 = testing::values(now.exp_avg_sq);
    for (int64_t b = 0; b < n; b += 2048) {
      int64_t e = std::min(n, b + 2048);
      double am = 0, av = 0;
      for (int64_t i = b; i < e; ++i) am = std::max(am, std::fabs(m[i])), av = std::max(av, v[i]);
      for (int64_t i = b; i < e; ++i) {
        ASSERT_LE(std::fabs(m8[i] - m[i]), nearest_distance(maps.s, m[i] / am) * am + 1e-5 * am)
            << "step " << t << " element " << i;
        ASSERT_LE(std::fabs(v8[i] - v[i]), nearest_distance(maps.u, v[i] / av) * av + 1e-5 * av)
            << "step " << t << " element " << i;
      }
    }
  }
  const optim::ParamState* st = opt.state(p);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->tensors.at("exp_avg_codes").dtype(), kUInt8);
  EXPECT_EQ(st->tensors.at("exp_avg_absmax").shape(), (Shape{4}));
}

// Over 200 steps the 8-bit moments stay within the bound the per-step errors allow:
// |m8 - m32| <= sum_k beta1^k * h * absmax_k (h: the map's largest nearest-code distance),
// and the parameters follow fp32 AdamW closely.
TEST(Adam8bit, StaysCloseToAdamW) {
  Maps maps;
  const int64_t n = 8192, steps = 200, block = 2048;
  std::mt19937 rng(9);
  std::vector<double> init = normals(n, rng);
  std::vector<std::vector<double>> grads;
  for (int t = 0; t < steps; ++t) grads.push_back(normals(n, rng, 0.1));
  Tensor p8 = from_vector(init, Shape{n}).to(kFloat32), p32 = p8.clone();
  p8.requires_grad_();
  p32.requires_grad_();
  optim::Adam8bit opt8({p8}, {.lr = 1e-3, .weight_decay = 0.01});
  optim::AdamW opt32({p32}, {.lr = 1e-3, .weight_decay = 0.01});
  const double hs = max_error(maps.s, -1), hu = max_error(maps.u, 0);
  std::vector<double> bound_m(n / block, 0), bound_v(n / block, 0);
  for (int t = 0; t < steps; ++t) {
    Tensor g = from_vector(grads[t], Shape{n}).to(kFloat32);
    p8.set_grad(g);
    p32.set_grad(g.clone());
    opt8.step();
    opt32.step();
    std::vector<double> am = testing::values(opt8.state(p8)->tensors.at("exp_avg_absmax"));
    std::vector<double> av = testing::values(opt8.state(p8)->tensors.at("exp_avg_sq_absmax"));
    for (int64_t k = 0; k < n / block; ++k) {
      bound_m[k] = 0.9 * bound_m[k] + hs * am[k];
      bound_v[k] = 0.999 * bound_v[k] + hu * av[k];
    }
  }
  auto m8 = testing::values(opt8.moments(p8).exp_avg), v8 = testing::values(opt8.moments(p8).exp_avg_sq);
  auto m32 = testing::values(opt32.state(p32)->tensors.at("exp_avg"));
  auto v32 = testing::values(opt32.state(p32)->tensors.at("exp_avg_sq"));
  double em = 0, nm = 0, ev = 0, nv = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_LE(std::fabs(m8[i] - m32[i]), bound_m[i / block] * 1.001 + 1e-7) << i;
    ASSERT_LE(std::fabs(v8[i] - v32[i]), bound_v[i / block] * 1.001 + 1e-9) << i;
    em += (m8[i] - m32[i]) * (m8[i] - m32[i]), nm += m32[i] * m32[i];
    ev += (v8[i] - v32[i]) * (v8[i] - v32[i]), nv += v32[i] * v32[i];
  }
  auto a8 = testing::values(p8), a32 = testing::values(p32);
  double ed = 0, nd = 0;
  for (int64_t i = 0; i < n; ++i) {
    ed += (a8[i] - a32[i]) * (a8[i] - a32[i]);
    nd += (a32[i] - init[i]) * (a32[i] - init[i]);
  }
  double rel_m = std::sqrt(em / nm), rel_v = std::sqrt(ev / nv), rel_disp = std::sqrt(ed / nd);
  RecordProperty("moment1_rel_rms_error", std::to_string(rel_m));
  RecordProperty("moment2_rel_rms_error", std::to_string(rel_v));
  RecordProperty("displacement_rel_error", std::to_string(rel_disp));
  // The element bounds above are the strict check. With pure-noise gradients the moments sit
  // in the coarse middle of the dynamic map: the RMS errors measure 2.3-2.8% at this seed.
  EXPECT_LT(rel_m, 0.04);
  EXPECT_LT(rel_v, 0.04);
  EXPECT_LT(rel_disp, 0.04);  // of how far AdamW moved the parameters
}

TEST(Adam8bit, SmallTensorsFollowAdamWExactly) {
  std::mt19937 rng(1);
  std::vector<double> init = normals(1000, rng);
  Tensor a = from_vector(init, Shape{10, 100}).to(kFloat32), b = a.clone();
  a.requires_grad_();
  b.requires_grad_();
  optim::Adam8bit opt8({a}, {.lr = 1e-2, .weight_decay = 0.1});  // 1000 < min_8bit_size
  optim::AdamW opt32({b}, {.lr = 1e-2, .weight_decay = 0.1});
  for (int t = 0; t < 20; ++t) {
    Tensor g = from_vector(normals(1000, rng), Shape{10, 100}).to(kFloat32);
    a.set_grad(g);
    b.set_grad(g);
    opt8.step();
    opt32.step();
  }
  EXPECT_FALSE(opt8.is_quantized(a));
  EXPECT_EQ(testing::values(a), testing::values(b));
  EXPECT_EQ(testing::values(opt8.moments(a).exp_avg_sq), testing::values(opt32.state(b)->tensors.at("exp_avg_sq")));
}

Tensor param_of(const std::vector<double>& v) {
  Tensor p = from_vector(v).to(kFloat32);
  p.requires_grad_();
  return p;
}
Tensor copy_of(const Tensor& p) {
  Tensor c = p.detach().clone();
  c.requires_grad_();
  return c;
}

// Adds the state of parameter 0 (step count, and moments m and v stored as a step stores them:
// 8-bit in blocks of `block` when block > 0, else fp32) to a state dict of an optimizer
// without state.
void put_state(optim::StateDict& d, int64_t step, const Tensor& m, const Tensor& v, int64_t block) {
  d.scalars["state.0.step"] = static_cast<double>(step);
  if (block == 0) {
    d.tensors["state.0.exp_avg"] = m.clone();
    d.tensors["state.0.exp_avg_sq"] = v.clone();
    return;
  }
  Maps maps;
  auto put = [&](const char* name, const Tensor& x, const float* map) {
    std::vector<float> f;
    for (double e : testing::values(x)) f.push_back(static_cast<float>(e));
    const int64_t n = static_cast<int64_t>(f.size());
    std::vector<double> codes, scales;
    for (int64_t b = 0; b < n; b += block) {
      const int64_t len = std::min(n, b + block) - b;
      const float absmax = quant8::block_absmax(f.data() + b, len);
      std::vector<uint8_t> c(static_cast<size_t>(len));
      quant8::quantize_block(map, f.data() + b, len, absmax, c.data());
      codes.insert(codes.end(), c.begin(), c.end());
      scales.push_back(absmax);
    }
    d.tensors[fmt::format("state.0.{}_codes", name)] = from_vector(codes).to(kUInt8);
    d.tensors[fmt::format("state.0.{}_absmax", name)] = from_vector(scales).to(kFloat32);
  };
  put("exp_avg", m, maps.s);
  put("exp_avg_sq", v, maps.u);
}

// A parameter leaving 8-bit storage keeps its moments (dequantized) and its step count: the
// next step is AdamW's from those moments. The state dict then loads into an Adam8bit built
// with the new options.
TEST(Adam8bit, OptionChangeTo32BitKeepsMoments) {
  std::mt19937 rng(4);
  const int64_t n = 10;  // blocks of 4, 4 and 2
  Tensor p = param_of(normals(n, rng));
  optim::Adam8bit o({p}, {.lr = 1e-2, .min_8bit_size = 0, .block_size = 4});
  p.set_grad(from_vector(normals(n, rng)).to(kFloat32));
  o.step();
  const optim::Adam8bit::Moments m1 = o.moments(p);
  o.param_groups()[0].options.min_8bit_size = 100;
  EXPECT_EQ(testing::values(o.moments(p).exp_avg), testing::values(m1.exp_avg));  // unchanged until a step
  Tensor r = copy_of(p);
  optim::Adam8bit at_once({r}, {.min_8bit_size = 100});  // a dict taken now is already converted
  at_once.load_state_dict(o.state_dict());
  EXPECT_EQ(testing::values(at_once.moments(r).exp_avg_sq), testing::values(m1.exp_avg_sq));

  Tensor q = copy_of(p);
  optim::AdamW ref({q}, {.lr = 1e-2, .weight_decay = 0});
  optim::StateDict d = ref.state_dict();
  put_state(d, 1, m1.exp_avg, m1.exp_avg_sq, 0);
  ref.load_state_dict(d);
  Tensor g2 = from_vector(normals(n, rng)).to(kFloat32);
  p.set_grad(g2);
  q.set_grad(g2);
  o.step();
  ref.step();
  EXPECT_EQ(testing::values(p), testing::values(q));
  EXPECT_FALSE(o.is_quantized(p));
  EXPECT_EQ(o.state(p)->step, 2);
  EXPECT_EQ(o.state(p)->tensors.size(), 2u);
  EXPECT_EQ(testing::values(o.state(p)->tensors.at("exp_avg")), testing::values(ref.state(q)->tensors.at("exp_avg")));

  Tensor p2 = copy_of(p);
  optim::Adam8bit o2({p2}, {.min_8bit_size = 100});
  o2.load_state_dict(o.state_dict());
  Tensor g3 = from_vector(normals(n, rng)).to(kFloat32);
  p.set_grad(g3);
  p2.set_grad(g3);
  o.step();
  o2.step();
  EXPECT_EQ(testing::values(p), testing::values(p2));
}

// A parameter entering 8-bit storage, or changing block size, has its moments quantized as a
// step would quantize them, in the new blocks; the step count carries on.
TEST(Adam8bit, OptionChangeTo8BitOrNewBlockSizeRequantizes) {
  std::mt19937 rng(6);
  const int64_t n = 10;
  Tensor p = param_of(normals(n, rng));
  optim::Adam8bit o({p}, {.lr = 1e-2});  // 10 elements: fp32 moments
  for (int t = 0; t < 2; ++t) {
    p.set_grad(from_vector(normals(n, rng)).to(kFloat32));
    o.step();
  }
  for (int64_t block : {int64_t(4), int64_t(3)}) {  // to 8-bit with blocks of 4, then blocks of 3
    SCOPED_TRACE("block_size " + std::to_string(block));
    const optim::Adam8bit::Moments m = o.moments(p);
    const int64_t step = o.state(p)->step;
    o.param_groups()[0].options.min_8bit_size = 0;
    o.param_groups()[0].options.block_size = block;
    Tensor q = copy_of(p);
    optim::Adam8bit ref({q}, o.param_groups()[0].options);
    optim::StateDict d = ref.state_dict();
    put_state(d, step, m.exp_avg, m.exp_avg_sq, block);
    ref.load_state_dict(d);
    const optim::StateDict now = o.state_dict();  // converted before any step, as d
    for (const auto& [k, t] : d.tensors) EXPECT_EQ(testing::values(now.tensors.at(k)), testing::values(t)) << k;
    Tensor g = from_vector(normals(n, rng)).to(kFloat32);
    p.set_grad(g);
    q.set_grad(g);
    o.step();
    ref.step();
    EXPECT_TRUE(o.is_quantized(p));
    EXPECT_EQ(o.state(p)->step, step + 1);
    EXPECT_EQ(testing::values(p), testing::values(q));
    for (const auto& [k, t] : ref.state(q)->tensors)
      EXPECT_EQ(testing::values(o.state(p)->tensors.at(k)), testing::values(t)) << k;
  }
}

// A NaN or inf grad element makes its parameter element NaN, as in AdamW, and nothing else.
// The moments of a NaN parameter element stay NaN (g + 0 * p), are left out of the block's
// scale and stored as 0, so the rest of the block follows exactly the run whose grad was 0 at
// that element throughout.
TEST(Adam8bit, NonFiniteGradStaysInItsElement) {
  std::mt19937 rng(8);
  const int64_t n = 8;  // two blocks of 4
  const std::vector<double> init = normals(n, rng);
  std::vector<std::vector<double>> grads;
  for (int t = 0; t < 5; ++t) grads.push_back(normals(n, rng));
  // element 1's grad is `first` at the first step; 0 from then on when `zero_after`
  auto run = [&](double first, bool zero_after, bool adamw) {
    Tensor p = param_of(init);
    const std::vector<Tensor> ps{p};
    std::unique_ptr<optim::Optimizer> o;
    if (adamw) o = std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.weight_decay = 0});
    else o = std::make_unique<optim::Adam8bit>(ps, optim::Adam8bitOptions{.min_8bit_size = 0, .block_size = 4});
    for (int t = 0; t < 5; ++t) {
      std::vector<double> g = grads[t];
      if (t == 0 || zero_after) g[1] = t == 0 ? first : 0;
      p.set_grad(from_vector(g).to(kFloat32));
      o->step();
    }
    return testing::values(p);
  };
  const std::vector<double> zero = run(0, true, false), adamw = run(std::nan(""), false, true);
  EXPECT_TRUE(std::isnan(adamw[1]));
  for (double bad : {std::nan(""), double(INFINITY), -double(INFINITY)}) {
    SCOPED_TRACE(fmt::format("grad {}", bad));
    const std::vector<double> got = run(bad, false, false);
    EXPECT_TRUE(std::isnan(got[1]));
    for (int64_t i = 0; i < n; ++i)
      if (i != 1) EXPECT_EQ(got[i], zero[i]) << i;
  }
  // the scales leave non-finite values out; NaN is stored as the code of 0
  const float x[4] = {1.0f, NAN, -3.0f, INFINITY};
  EXPECT_EQ(quant8::block_absmax(x, 4), 3.0f);
  Maps maps;
  EXPECT_EQ(maps.s[quant8::quantize_nearest(maps.s, NAN)], 0.0f);
  EXPECT_EQ(maps.u[quant8::quantize_nearest(maps.u, NAN)], 0.0f);
}

// The state memory of the first step, from the allocator's bytes in use.
TEST(Adam8bit, StateTakesAboutTwoBytesPerParameter) {
  const int64_t n = int64_t(1) << 22;
  Tensor p = randn({n});
  p.requires_grad_();
  p.set_grad(randn({n}));
  auto in_use = [] { return cpu_memory_stats().bytes_in_use; };
  double bytes8 = 0, bytes32 = 0;
  {
    optim::Adam8bit opt({p});
    int64_t before = in_use();
    opt.step();
    bytes8 = static_cast<double>(in_use() - before) / static_cast<double>(n);
  }
  {
    optim::AdamW opt({p});
    int64_t before = in_use();
    opt.step();
    bytes32 = static_cast<double>(in_use() - before) / static_cast<double>(n);
  }
  RecordProperty("adam8bit_state_bytes_per_param", std::to_string(bytes8));
  RecordProperty("adamw_state_bytes_per_param", std::to_string(bytes32));
  EXPECT_LE(bytes8, 2.1);
  EXPECT_GE(bytes8, 2.0);  // two codes per parameter: nothing is missing
  EXPECT_DOUBLE_EQ(bytes32, 8.0);
}

}  // namespace
}  // namespace strata
