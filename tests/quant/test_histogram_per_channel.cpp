// PerChannelHistogramObserver: per channel it is the per-tensor HistogramObserver (itself checked
// against the exact objective and a brute-force search in test_histogram_observer.cpp) fed that
// channel's values: equal histograms, ranges and qparams, bit for bit, through a growing range, a
// constant channel and a channel first without finite values; its state dict; as the weight
// observer of QAT; the errors.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::throws_with;
using st::testing::values;

namespace {

// (2, 4, 60) with channel c (dim 1) drawn at scale 1 + c, channel 2 constant and channel 3 NaN in the first batch.
std::vector<st::Tensor> batches() {
  st::manual_seed(61);
  std::vector<st::Tensor> out;
  for (int b = 0; b < 3; ++b) {
    st::Tensor x = st::randn({2, 4, 60}) * st::from_vector(std::vector<double>{1, 2, 3, 4}, st::Shape{1, 4, 1})
                                               .to(st::kFloat32) * (1.0 + b);  // the range grows batch by batch
    st::NoGradGuard no_grad;
    x.select(1, 2).fill_(0.75);
    if (b == 0) x.select(1, 3).fill_(std::numeric_limits<double>::quiet_NaN());
    out.push_back(x);
  }
  return out;
}

void expect_per_channel_equals_per_tensor(q::QScheme per_channel, q::QScheme per_tensor, st::DType dtype) {
  q::ObserverOptions pc{.dtype = dtype, .qscheme = per_channel, .ch_axis = 1};
  q::PerChannelHistogramObserver obs(pc, 0, 256);
  const std::vector<st::Tensor> xs = batches();
  for (const st::Tensor& x : xs) obs(x);
  EXPECT_EQ(obs.histogram.shape(), (st::Shape{4, 256}));
  const auto [scale, zero] = obs.calculate_qparams();
  const auto ranges = obs.search_ranges();
  for (int64_t c = 0; c < 4; ++c) {
    q::HistogramObserver one({.dtype = dtype, .qscheme = per_tensor}, 256);
    for (const st::Tensor& x : xs) one(x.select(1, c));
    EXPECT_TRUE(all_close(obs.histogram.select(0, c), values(one.histogram), 0, 0)) << c;
    EXPECT_EQ(values(obs.min_val)[size_t(c)], one.min_val.item<double>()) << c;
    EXPECT_EQ(values(obs.max_val)[size_t(c)], one.max_val.item<double>()) << c;
    EXPECT_EQ(ranges[size_t(c)], one.search_range()) << c;
    const auto [s1, z1] = one.calculate_qparams();
    EXPECT_EQ(values(scale)[size_t(c)], s1.item<double>()) << c;
    EXPECT_EQ(values(zero)[size_t(c)], z1.item<double>()) << c;
  }
  // the wide channel's range is searched (inside its min and max), the constant one kept
  EXPECT_LE(values(obs.max_val)[3] - values(obs.min_val)[3], 3 * 2 * 4 * 6.0);
  EXPECT_EQ(ranges[2].first, 0.75);
}

}  // namespace

TEST(PerChannelHistogramObserver, EachChannelIsAPerTensorHistogramObserver) {
  expect_per_channel_equals_per_tensor(q::QScheme::PerChannelAffine, q::QScheme::PerTensorAffine, st::kUInt8);
  expect_per_channel_equals_per_tensor(q::QScheme::PerChannelSymmetric, q::QScheme::PerTensorSymmetric, st::kInt8);
}

TEST(PerChannelHistogramObserver, StateDictAndErrors) {
  q::ObserverOptions pc{.dtype = st::kUInt8, .qscheme = q::QScheme::PerChannelAffine};
  q::PerChannelHistogramObserver obs(pc, 0, 64);
  const st::Tensor x = st::randn({5, 30});
  obs(x);
  q::PerChannelHistogramObserver fresh(pc, 5, 64);
  fresh.load_state_dict(obs.state_dict());
  EXPECT_TRUE(all_close(fresh.calculate_qparams().first, values(obs.calculate_qparams().first), 0, 0));
  EXPECT_TRUE(throws_with([&] { obs(st::randn({4, 30})); }, {"observed 5 channels", "4 along ch_axis 0"}));
  EXPECT_TRUE(throws_with([&] { q::PerChannelHistogramObserver bad(q::ObserverOptions{}); }, {"per-channel"}));
  EXPECT_TRUE(throws_with([&] { q::PerChannelHistogramObserver bad(pc, 0, 0); }, {"bins"}));
  EXPECT_TRUE(throws_with([&] { obs(st::randn({})); }, {"ch_axis"}));
  // never observed: the min/max observers' qparams of an empty range
  q::PerChannelHistogramObserver empty(pc, 3, 64);
  EXPECT_EQ(empty.calculate_qparams().first.shape(), st::Shape{3});
}

// The weight observer of QAT: the weight fake quant's scales are the observer's per-channel qparams,
// and convert gives the fake-quantized model's outputs.
TEST(PerChannelHistogramObserver, ObservesWeightsInQat) {
  st::manual_seed(62);
  nn::Sequential model(nn::Linear(16, 6), nn::ReLU(), nn::Linear(6, 3));
  q::prepare_qat(model, {.weight_fake_quant = [](int64_t n) {
                           return std::make_unique<q::FakeQuantize>(
                               std::make_unique<q::PerChannelHistogramObserver>(q::per_channel_defaults(), n, 512));
                         }});
  const st::Tensor x = st::randn({32, 16});
  model(x);
  auto& fq = dynamic_cast<q::FakeQuantize&>(model.get_submodule("0.qat.weight_fake_quant"));
  EXPECT_EQ(fq.observer().name(), "PerChannelHistogramObserver");
  EXPECT_TRUE(all_close(fq.scale, values(fq.calculate_qparams().first), 0, 0));
  model.eval();
  q::disable_observer(model);
  const st::Tensor fake = model(x).detach();
  EXPECT_EQ(q::convert(model), 2);
  EXPECT_TRUE(all_close(model(x), values(fake), 1e-4, 1e-4));
}
