// HistogramObserver: its L2 objective against the exact integral written out in the test (each
// bin's count spread uniformly, cut at the quantization levels' edges), its range search against a
// brute-force search of that objective over every range of bins, its histogram through a growing
// range, outliers clipped with a lower error than MinMax's, and its use in static quantization.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace q = strata::quant;
using st::testing::throws_with;
using st::testing::values;

namespace {

// N(0, 1) samples and `outliers` at +-spike.
st::Tensor spiky(int64_t n, int outliers, double spike) {
  st::Tensor x = st::randn({n + outliers});
  st::NoGradGuard no_grad;
  for (int i = 0; i < outliers; ++i) x.select(0, n + i).fill_(i % 2 ? -spike : spike);
  return x;
}

// The L2 error of quantizing histogram `h` (bins of `width`) to `levels` levels over bins [start, end]:
// each piece of a bin between level edges integrated exactly against its (clamped) level's centre.
double exact_error(const std::vector<double>& h, double width, int64_t start, int64_t end, int levels) {
  const double dst = width * static_cast<double>(end - start + 1) / levels;
  double total = 0;
  for (size_t b = 0; b < h.size(); ++b) {
    const double density = h[b] / width;
    double a = (static_cast<double>(b) - static_cast<double>(start)) * width;
    const double e = a + width;
    while (a < e) {
      const double k = std::floor(a / dst);
      const double cut = k >= 0 && k < levels - 1 ? std::min(e, (k + 1) * dst) : (k < 0 ? std::min(e, 0.0) : e);
      const double level = std::clamp(k, 0.0, levels - 1.0), c = (level + 0.5) * dst;
      total += density * (std::pow(cut - c, 3) - std::pow(a - c, 3)) / 3;
      a = cut;
    }
  }
  return total;
}

// The mean squared error of quantizing `x` with (scale, zero_point) to [0, 255], in float64.
double mse(const std::vector<double>& x, double scale, double zero_point) {
  double sum = 0;
  for (double v : x) {
    const double code = std::clamp(std::nearbyint(v / scale) + zero_point, 0.0, 255.0);
    sum += std::pow((code - zero_point) * scale - v, 2);
  }
  return sum / static_cast<double>(x.size());
}

}  // namespace

TEST(HistogramObserver, ObjectiveAndSearchAgainstBruteForce) {
  st::manual_seed(51);
  q::HistogramObserver obs({}, 64);
  obs(spiky(1000000, 4, 12.0));  // enough samples that clipping the spikes pays
  const std::vector<double> h = values(obs.histogram);
  const double lo = values(obs.min_val)[0], hi = values(obs.max_val)[0], width = (hi - lo) / 64;
  double count = 0;
  for (double c : h) count += c;
  EXPECT_EQ(count, 1000004.0);
  EXPECT_EQ(lo, -12.0);
  EXPECT_EQ(hi, 12.0);
  // the objective, for ranges inside, at and across the data's
  for (auto [s, e] : {std::pair{0, 63}, std::pair{20, 43}, std::pair{31, 31}, std::pair{5, 60}, std::pair{0, 10}})
    EXPECT_NEAR(obs.quantization_error(s, e), exact_error(h, width, s, e, 256),
                1e-9 * exact_error(h, width, s, e, 256)) << s << ".." << e;
  // brute force over every range of bins
  double best = std::numeric_limits<double>::infinity();
  for (int64_t s = 0; s < 64; ++s)
    for (int64_t e = s; e < 64; ++e) best = std::min(best, exact_error(h, width, s, e, 256));
  const auto [new_lo, new_hi] = obs.search_range();
  const auto start = std::lround((new_lo - lo) / width), end = std::lround((new_hi - lo) / width) - 1;
  const double found = exact_error(h, width, start, end, 256);
  // PyTorch's search is greedy (the bounds move inwards until the error grows): near the minimum, not at it
  const double full_range = exact_error(h, width, 0, 63, 256);
  EXPECT_LE(found, 1.05 * best) << "bins " << start << ".." << end << ": " << found << " vs " << best;
  EXPECT_LT(found, 0.5 * full_range) << found << " vs " << full_range;
  EXPECT_GT(new_lo, -12.0);  // the outliers' bins are clipped
  EXPECT_LT(new_hi, 12.0);
  // calculate_qparams quantizes that range (affine uint8, widened to hold 0)
  const auto [scale, zero] = obs.calculate_qparams();
  EXPECT_NEAR(values(scale)[0], (new_hi - new_lo) / 255, 1e-6 * values(scale)[0]);
  EXPECT_EQ(values(zero)[0], std::clamp(std::nearbyint(-new_lo / values(scale)[0]), 0.0, 255.0));
  EXPECT_TRUE(throws_with([&] { obs.quantization_error(10, 64); }, {"are not a range"}));
}

TEST(HistogramObserver, ClipsOutliersWithALowerErrorThanMinMax) {
  st::manual_seed(52);
  const st::Tensor x = spiky(1000000, 2, 40.0);
  q::HistogramObserver hist;
  q::MinMaxObserver minmax;
  hist(x);
  minmax(x);
  EXPECT_EQ(hist.bins(), 2048);
  const auto [hs, hz] = hist.calculate_qparams();
  const auto [ms, mz] = minmax.calculate_qparams();
  const std::vector<double> xv = values(x);
  const double hist_error = mse(xv, values(hs)[0], values(hz)[0]), minmax_error = mse(xv, values(ms)[0], values(mz)[0]);
  EXPECT_LT(values(hs)[0], values(ms)[0] / 4);  // a much narrower range: the spikes are clipped
  EXPECT_LT(hist_error, minmax_error / 2) << hist_error << " vs " << minmax_error;
}

TEST(HistogramObserver, HistogramFollowsAGrowingRange) {
  st::manual_seed(53);
  q::HistogramObserver obs({}, 256);
  const st::Tensor a = st::randn({4000}), b = st::randn({6000}) * 3.0 + 1.0;
  obs(a);
  obs(b);
  obs(st::full({5}, std::numeric_limits<float>::quiet_NaN()));  // no finite value: nothing changes
  const std::vector<double> av = values(a), bv = values(b), h = values(obs.histogram);
  double lo = 1e30, hi = -1e30, mean = 0;
  for (const auto* v : {&av, &bv})
    for (double x : *v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      mean += x / 10000;
    }
  EXPECT_EQ(values(obs.min_val)[0], lo);
  EXPECT_EQ(values(obs.max_val)[0], hi);
  double count = 0, centre_mean = 0;
  const double width = (hi - lo) / 256;
  for (size_t i = 0; i < h.size(); ++i) {
    count += h[i];
    centre_mean += h[i] * (lo + (static_cast<double>(i) + 0.5) * width) / 10000;
  }
  EXPECT_NEAR(count, 10000.0, 1e-3);
  EXPECT_NEAR(centre_mean, mean, width);  // every value within a bin or so of its place
}

TEST(HistogramObserver, CalibratesStaticQuantization) {
  st::manual_seed(54);
  nn::Sequential model(nn::Linear(8, 6), nn::Linear(6, 4));
  model.eval();
  q::prepare(model, {.activation_observer = [] { return std::make_unique<q::HistogramObserver>(); }});
  for (int i = 0; i < 3; ++i) model(spiky(198, 2, 30.0).reshape({-1, 8}));
  auto& observer = dynamic_cast<q::HistogramObserver&>(model.get_submodule("0.observed.input_observer"));
  const auto [scale, zero] = observer.calculate_qparams();
  EXPECT_EQ(q::convert(model), 2);
  const auto sd = model.state_dict();
  EXPECT_EQ(values(sd.at("0.quantized.input_scale")), values(scale.reshape({1})));
  EXPECT_EQ(values(sd.at("0.quantized.input_zero_point")), values(zero.reshape({1})));
  EXPECT_TRUE(throws_with([] { q::HistogramObserver({}, 0); }, {"bins must be positive"}));
  EXPECT_TRUE(throws_with([] { q::HistogramObserver(q::per_channel_defaults()); }, {"per-tensor"}));
}

// Edge cases: a range spanning float32's (max - min overflows: the qparams stay finite and quantize it
// within half a step), all-equal inputs (the qparams of that single value, as MinMax's; then the mass
// moves with a growing range), infinities and empty batches left out, and a state dict reloaded.
TEST(HistogramObserver, EdgeCases) {
  {
    const std::vector<double> x = {-3e38, 3e38, 0, 1};
    q::HistogramObserver hist;
    q::MinMaxObserver minmax;
    hist(st::from_vector(x).to(st::kFloat32));
    minmax(st::from_vector(x).to(st::kFloat32));
    for (const q::Observer* obs : {static_cast<const q::Observer*>(&hist), static_cast<const q::Observer*>(&minmax)}) {
      const auto [scale, zero] = obs->calculate_qparams();
      const double s = values(scale)[0], z = values(zero)[0];
      ASSERT_TRUE(std::isfinite(s) && s > 0) << obs->name() << " scale " << s;
      EXPECT_GE(z, 0);
      EXPECT_LE(z, 255);
      if (obs == &minmax) {
        EXPECT_NEAR(s, 6e38 / 255, 1e-6 * s);
        EXPECT_LE(mse(x, s, z), s * s / 4 * (1 + 1e-5));  // every value within half a step
      }
    }
  }
  {
    q::HistogramObserver obs({}, 64);
    obs(st::full({10}, 2.5));
    obs(st::full({10}, 2.5));
    q::MinMaxObserver minmax;
    minmax(st::full({10}, 2.5));
    EXPECT_EQ(values(obs.calculate_qparams().first), values(minmax.calculate_qparams().first));
    EXPECT_EQ(values(obs.calculate_qparams().second), values(minmax.calculate_qparams().second));
    obs(st::full({10}, -1.5));
    const std::vector<double> h = values(obs.histogram);
    EXPECT_EQ(h.front(), 10);
    EXPECT_EQ(h.back(), 20);
  }
  {
    q::HistogramObserver obs({}, 64);
    const double inf = std::numeric_limits<double>::infinity();
    obs(st::from_vector(std::vector<double>{1, 2, inf, -inf, 3}).to(st::kFloat32));
    EXPECT_EQ(values(obs.min_val)[0], 1);
    EXPECT_EQ(values(obs.max_val)[0], 3);
    double count = 0;
    for (double c : values(obs.histogram)) count += c;
    EXPECT_EQ(count, 3);
  }
  {  // an empty batch or one without finite values observes nothing (the range stayed widened to 0)
    q::HistogramObserver obs({}, 64);
    obs(st::empty({0, 3}));
    obs(st::full({4}, std::numeric_limits<float>::quiet_NaN()));
    EXPECT_FALSE(values(obs.min_val)[0] <= values(obs.max_val)[0]);  // never observed: [+inf, -inf]
    obs(st::from_vector(std::vector<double>{1, 2}).to(st::kFloat32));
    EXPECT_EQ(values(obs.min_val)[0], 1);
    EXPECT_EQ(values(obs.max_val)[0], 2);
  }
  {
    st::manual_seed(55);
    q::HistogramObserver a, b;
    a(spiky(1000, 2, 20.0));
    b.load_state_dict(a.state_dict());
    EXPECT_EQ(values(b.calculate_qparams().first), values(a.calculate_qparams().first));
    EXPECT_EQ(values(b.calculate_qparams().second), values(a.calculate_qparams().second));
  }
}
