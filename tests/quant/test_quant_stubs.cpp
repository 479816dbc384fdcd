// QuantStub, DeQuantStub and QuantWrapper: prepared and converted stubs against PyTorch's
// quantize/dequantize formula and the observer's qparams formula written out in the test; a
// converted model with stubs equal to the same model without them; QAT stubs; state dicts; errors.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "quant/quant_reference.h"
#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace q = strata::quant;
using st::testing::all_close;
using st::testing::codes_of;
using st::testing::throws_with;
using st::testing::values;

namespace {

// A model marking its quantized region, layers as data members (they keep their places).
struct StubNet : nn::Module {
  q::QuantStub quant;
  nn::Linear fc1{6, 10};
  nn::ReLU relu;
  nn::Linear fc2{10, 3};
  q::DeQuantStub dequant;
  StubNet() {
    register_module("quant", quant);
    register_module("fc1", fc1);
    register_module("relu", relu);
    register_module("fc2", fc2);
    register_module("dequant", dequant);
  }
  st::Tensor forward(const st::Tensor& x) override { return dequant(fc2(relu(fc1(quant(x))))); }
};

// MinMaxObserver's uint8 affine qparams of values xs, in float32 as PyTorch's _calculate_qparams.
std::pair<double, int64_t> minmax_qparams(const std::vector<double>& xs) {
  const float lo = std::min(0.0f, float(*std::min_element(xs.begin(), xs.end())));
  const float hi = std::max(0.0f, float(*std::max_element(xs.begin(), xs.end())));
  const float scale = std::max((hi - lo) / 255.0f, 1.1920928955078125e-07f);
  const double zero = std::clamp(0.0 - std::nearbyint(double(lo / scale)), 0.0, 255.0);
  return {scale, int64_t(zero)};
}

}  // namespace

TEST(QuantStub, PreparedObservesConvertedQuantizesByTheFormula) {
  st::manual_seed(50);
  StubNet net, plain;
  plain.load_state_dict(net.state_dict());
  net.eval();
  plain.eval();
  const st::Tensor x = st::randn({32, 6}) * 2.0 + 0.5;
  EXPECT_TRUE(all_close(net(x), values(plain(x)), 0, 0));  // float: the stubs are identities
  EXPECT_EQ(q::prepare(net), 3);                            // two layers and the stub
  EXPECT_EQ(net.quant.stage(), q::QuantStub::Stage::Observing);
  EXPECT_EQ(net.state_dict().count("quant.activation_post_process.min_val"), 1u);
  // the same model, its stub left float by the filter: the layers quantize their inputs themselves
  EXPECT_EQ(q::prepare(plain, {.filter = [](const std::string& name, const nn::Module&) { return name != "quant"; }}),
            2);
  net(x);
  plain(x);
  EXPECT_EQ(q::convert(net), 3);
  q::convert(plain);
  const auto [scale, zero] = minmax_qparams(values(x));
  EXPECT_EQ(net.quant.scale(), scale);
  EXPECT_EQ(net.quant.zero_point(), zero);
  EXPECT_EQ(net.state_dict().count("quant.scale"), 1u);
  EXPECT_EQ(net.state_dict().count("quant.activation_post_process.min_val"), 0u);
  // dequantize(quantize(x)): (clamp(zero + round(x / scale), 0, 255) - zero) * scale
  const st::Tensor z = st::randn({50}) * 4.0;
  std::vector<double> want;
  for (double c : codes_of(z, scale, zero)) want.push_back(double(float((c - zero) * scale)));
  const st::Tensor got = net.quant(z);
  EXPECT_TRUE(all_close(got, want, 0, 0));
  EXPECT_FALSE(got.requires_grad());
  // the first layer quantizes with the same qparams: the model equals the one without stubs
  EXPECT_TRUE(all_close(net(x), values(plain(x)), 0, 0));
  const st::Tensor wide = st::randn({40, 6}) * 4.0;  // beyond the calibrated range: both clamp alike
  EXPECT_TRUE(all_close(net(wide), values(plain(wide)), 0, 0));
}

TEST(QuantStub, QatStubFakeQuantizesThenConvertsWithItsQparams) {
  st::manual_seed(51);
  StubNet net;
  EXPECT_EQ(q::prepare_qat(net), 3);
  EXPECT_EQ(net.quant.stage(), q::QuantStub::Stage::FakeQuantizing);
  const st::Tensor x = (st::randn({16, 6}) * 1.5).requires_grad_(true);
  net(x).sum().backward();  // gradients pass the stub's fake quant
  ASSERT_TRUE(x.grad().defined());
  auto& fq = dynamic_cast<q::FakeQuantize&>(net.quant.get_submodule("activation_post_process"));
  const double s = fq.scale.item<double>();
  const int64_t zp = fq.zero_point.item<int64_t>();
  net.eval();
  q::disable_observer(net);
  const st::Tensor fake = net(x).detach();
  q::convert(net);
  EXPECT_EQ(net.quant.scale(), s);
  EXPECT_EQ(net.quant.zero_point(), zp);
  EXPECT_TRUE(all_close(net.quant(x), values(q::fake_quantize_per_tensor_affine(x.detach(), s, zp, 0, 255)), 0, 0));
  EXPECT_TRUE(all_close(net(x), values(fake), 1e-4, 1e-4));
}

TEST(QuantWrapper, WrapsStateDictRoundTripsAndFilters) {
  st::manual_seed(52);
  const auto make = [] {
    return std::make_unique<q::QuantWrapper>(
        std::make_unique<nn::Sequential>(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2)));
  };
  auto a = make(), b = make();
  b->load_state_dict(a->state_dict());
  a->eval();
  b->eval();
  const st::Tensor x = st::randn({20, 4}), other = st::randn({20, 4}) * 5.0;
  q::prepare(*a);
  q::prepare(*b);
  (*a)(x);
  (*b)(other);  // other qparams
  q::convert(*a);
  q::convert(*b);
  const st::Tensor want = (*a)(x);
  ASSERT_FALSE(all_close((*b)(x), values(want), 1e-3, 1e-3));
  const auto sd = a->state_dict();
  EXPECT_EQ(sd.count("quant.scale") + sd.count("quant.zero_point") + sd.count("module.0.quantized.weight_int8"), 3u);
  b->load_state_dict(sd);
  EXPECT_EQ(b->quant().scale(), a->quant().scale());
  EXPECT_TRUE(all_close((*b)(x), values(want), 0, 0));
  // a filter that leaves the stub out keeps it float
  auto c = make();
  q::prepare(*c, {.filter = [](const std::string& name, const nn::Module&) { return name != "quant"; }});
  EXPECT_EQ(c->quant().stage(), q::QuantStub::Stage::Float);
}

TEST(QuantStub, BadInput) {
  StubNet net;
  EXPECT_TRUE(throws_with([&] { net.quant.scale(); }, {"QuantStub", "before convert"}));
  q::prepare(net);
  // uncalibrated: convert names the stub and changes nothing
  EXPECT_TRUE(throws_with([&] { q::convert(net); }, {"convert"}));
  EXPECT_EQ(net.quant.stage(), q::QuantStub::Stage::Observing);
  EXPECT_TRUE(throws_with([&] { net.quant.set_observer(std::make_unique<q::MinMaxObserver>(q::ObserverOptions{})); },
                          {"QuantStub", "already"}));
  EXPECT_TRUE(throws_with([&] { net.quant.convert(); }, {"QuantStub", "seen no data"}));
  EXPECT_TRUE(throws_with([&] {
    net.set_submodule("quant.activation_post_process", std::make_unique<q::MinMaxObserver>(q::ObserverOptions{}));
  }, {"QuantStub", "cannot be replaced"}));
  q::QuantStub lone;
  EXPECT_TRUE(throws_with([&] { lone.convert(); }, {"QuantStub", "not prepared"}));
  EXPECT_TRUE(throws_with([&] {
    lone.set_observer(std::make_unique<q::PerChannelMinMaxObserver>());
  }, {"QuantStub", "per-tensor"}));
  EXPECT_TRUE(throws_with([&] { lone(st::ones({2}, st::kInt32)); }, {"QuantStub", "floating"}));
  EXPECT_TRUE(throws_with([&] { net.dequant(st::ones({2}, st::kInt64)); }, {"DeQuantStub", "floating"}));
  EXPECT_TRUE(throws_with([] { q::QuantWrapper w(nullptr); }, {"QuantWrapper", "null"}));
  // a stub-only model prepares, and a second prepare finds nothing left
  nn::Sequential only;
  only.push_back(q::QuantStub());
  EXPECT_EQ(q::prepare(only), 1);
  EXPECT_TRUE(throws_with([&] { q::convert(only); }, {"convert", "QuantStub \"0\"", "seen no data"}));
  only(st::tensor({-1.0f, 3.0f}));
  EXPECT_EQ(q::convert(only), 1);
  EXPECT_EQ(dynamic_cast<q::QuantStub&>(only[0]).zero_point(), 64);  // -1 / (4 / 255) -> 63.75 -> 64
  EXPECT_TRUE(throws_with([&] { q::prepare(only); }, {"prepare", "QuantStub"}));
}

TEST(QuantStub, PrepareQatRefusingAStubsFakeQuantChangesNothing) {
  // the layers take a per-channel input fake quant (convert refuses it later); a stub refuses it
  // at once, before any layer is prepared
  StubNet net;
  const auto per_channel = [] {
    return std::make_unique<q::FakeQuantize>(
        std::make_unique<q::MovingAveragePerChannelMinMaxObserver>(q::per_channel_defaults(), 10));
  };
  EXPECT_TRUE(throws_with([&] { q::prepare_qat(net, {.input_fake_quant = per_channel}); },
                          {"QuantStub", "per-tensor"}));
  EXPECT_EQ(net.quant.stage(), q::QuantStub::Stage::Float);
  EXPECT_EQ(net.named_modules().size(), 6u);  // the net and its five children: no form was added
  EXPECT_EQ(q::prepare_qat(net), 3);
}
