// Module bookkeeping: dotted names equal to PyTorch's for a known nested architecture (the
// expected keys are written out by PyTorch's rules: own parameters, then own buffers, then
// children in registration order, containers naming children "0", "1", ... or by key),
// traversal, train/eval, apply, to(), zero_grad, containers, and state_dict loading.
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;

namespace {

// A ResNet-style basic block and a small network around it; the PyTorch twin:
//
//   class Block(nn.Module):
//       def __init__(self, c):
//           super().__init__()
//           self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False); self.bn1 = nn.BatchNorm2d(c)
//           self.act = nn.ReLU()
//           self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False); self.bn2 = nn.BatchNorm2d(c)
//   class Net(nn.Module):
//       def __init__(self):
//           super().__init__()
//           self.stem = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
//           self.blocks = nn.ModuleList([Block(4), Block(4)])
//           self.pool = nn.AdaptiveAvgPool2d(1)
//           self.heads = nn.ModuleDict({"cls": nn.Linear(4, 10),
//                                       "aux": nn.Sequential(nn.Flatten(), nn.Linear(4, 2))})
struct Block : nn::Module {
  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d bn1, bn2;
  nn::ReLU act;
  explicit Block(int64_t c)
      : conv1(c, c, 3, {.padding = 1, .bias = false}), conv2(c, c, 3, {.padding = 1, .bias = false}), bn1(c),
        bn2(c) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("act", act);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
  }
  Tensor forward(const Tensor& x) override { return act(x + bn2(conv2(act(bn1(conv1(x)))))); }
  std::string name() const override { return "Block"; }
};

struct Net : nn::Module {
  nn::Sequential stem{nn::Conv2d(3, 4, 3, {.padding = 1}), nn::BatchNorm2d(4), nn::ReLU()};
  nn::ModuleList blocks{Block(4), Block(4)};
  nn::AdaptiveAvgPool2d pool{1};
  nn::ModuleDict heads;
  Net() {
    heads.insert("cls", nn::Linear(4, 10));
    heads.insert("aux", nn::Sequential(nn::Flatten(), nn::Linear(4, 2)));
    register_module("stem", stem);
    register_module("blocks", blocks);
    register_module("pool", pool);
    register_module("heads", heads);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = stem(x);
    for (nn::Module* b : blocks) h = (*b)(h);
    return heads["cls"](pool(h).flatten(1));
  }
  std::string name() const override { return "Net"; }
};

std::vector<std::string> bn_keys(const std::string& p) {
  return {p + ".weight", p + ".bias", p + ".running_mean", p + ".running_var", p + ".num_batches_tracked"};
}

// Net().state_dict().keys() in PyTorch, in its order.
std::vector<std::string> torch_state_dict_keys() {
  std::vector<std::string> k = {"stem.0.weight", "stem.0.bias"};
  for (auto& s : bn_keys("stem.1")) k.push_back(s);
  for (const char* b : {"blocks.0", "blocks.1"}) {
    k.push_back(std::string(b) + ".conv1.weight");
    for (auto& s : bn_keys(std::string(b) + ".bn1")) k.push_back(s);
    k.push_back(std::string(b) + ".conv2.weight");
    for (auto& s : bn_keys(std::string(b) + ".bn2")) k.push_back(s);
  }
  for (const char* s : {"heads.cls.weight", "heads.cls.bias", "heads.aux.1.weight", "heads.aux.1.bias"})
    k.push_back(s);
  return k;
}

bool is_buffer_key(const std::string& k) {
  for (const char* b : {"running_mean", "running_var", "num_batches_tracked"})
    if (k.size() > std::strlen(b) && k.compare(k.size() - std::strlen(b), std::string::npos, b) == 0) return true;
  return false;
}

template <class Pairs> std::vector<std::string> names_of(const Pairs& pairs) {
  std::vector<std::string> out;
  for (const auto& p : pairs) out.push_back(p.first);
  return out;
}

}  // namespace

TEST(ModuleNames, MatchPyTorchForANestedArchitecture) {
  Net net;
  std::vector<std::string> want = torch_state_dict_keys();
  // named_parameters and named_buffers keep PyTorch's order
  std::vector<std::string> want_params, want_buffers;
  for (auto& k : want) (is_buffer_key(k) ? want_buffers : want_params).push_back(k);
  EXPECT_EQ(names_of(net.named_parameters()), want_params);
  EXPECT_EQ(names_of(net.named_buffers()), want_buffers);
  // state_dict holds exactly PyTorch's keys (a sorted map)
  std::vector<std::string> sorted = want;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(names_of(net.state_dict()), sorted);
  EXPECT_EQ(net.state_dict().at("blocks.1.bn2.running_var").shape(), (Shape{4}));
  // named_modules is pre-order, as torch's
  EXPECT_EQ(names_of(net.named_modules()),
            (std::vector<std::string>{"", "stem", "stem.0", "stem.1", "stem.2", "blocks", "blocks.0", "blocks.0.conv1",
                                      "blocks.0.bn1", "blocks.0.act", "blocks.0.conv2", "blocks.0.bn2", "blocks.1",
                                      "blocks.1.conv1", "blocks.1.bn1", "blocks.1.act", "blocks.1.conv2",
                                      "blocks.1.bn2", "pool", "heads", "heads.cls", "heads.aux", "heads.aux.0",
                                      "heads.aux.1"}));
  EXPECT_EQ(names_of(net.named_children()), (std::vector<std::string>{"stem", "blocks", "pool", "heads"}));
  EXPECT_EQ(net.children().size(), 4u);
  EXPECT_EQ(net.named_parameters(false).size(), 0u);
  EXPECT_EQ(net.num_parameters(), 3 * 4 * 9 + 4 + 2 * 4 + 2 * (2 * 4 * 4 * 9 + 4 * 4) + 4 * 10 + 10 + 4 * 2 + 2);
  EXPECT_EQ(net(randn({2, 3, 5, 5})).shape(), (Shape{2, 10}));
}

TEST(ModuleTraversal, TrainEvalAndApplyOrder) {
  Net net;
  net.eval();
  for (auto& [n, m] : net.named_modules()) EXPECT_FALSE(m->is_training()) << n;
  net.blocks.train();
  EXPECT_TRUE(net.blocks.at<Block>(1).bn2.is_training());
  EXPECT_FALSE(net.stem.is_training());
  // apply visits every module once, children before their parent (torch's post-order)
  std::vector<nn::Module*> seen;
  net.apply([&](nn::Module& m) { seen.push_back(&m); });
  auto all = net.named_modules();
  ASSERT_EQ(seen.size(), all.size());
  EXPECT_EQ(seen.back(), &net);
  for (auto& [n, m] : all) {
    auto pos = std::find(seen.begin(), seen.end(), m) - seen.begin();
    for (nn::Module* c : m->children())
      EXPECT_LT(std::find(seen.begin(), seen.end(), c) - seen.begin(), pos) << n;
  }
  // the usual use: re-initialize every Linear
  net.apply([](nn::Module& m) {
    if (auto* fc = dynamic_cast<nn::Linear*>(&m)) nn::init::zeros_(fc->weight);
  });
  for (double v : values(net.heads["cls"].state_dict().at("weight"))) EXPECT_EQ(v, 0.0);
}

TEST(ModuleTo, RefusesNonFloatingDtypes) {
  Net net;
  for (DType t : {kInt64, kInt32, kBool, kUInt8}) {
    EXPECT_TRUE(throws_with([&] { net.to(t); }, {"floating"}));
    EXPECT_TRUE(throws_with([&] { net.to(kCPU, t); }, {"floating"}));
  }
  for (const Tensor& p : net.parameters()) EXPECT_EQ(p.dtype(), kFloat32);
}

TEST(ModuleTo, KeepsHandlesConvertsGradsAndIntegerBuffersStay) {
  Net net;
  std::vector<Tensor> held = net.parameters();
  net(randn({2, 3, 4, 4})).sum().backward();
  ASSERT_TRUE(held[0].grad().defined());
  net.to(kFloat64);
  for (const Tensor& p : held) {
    EXPECT_EQ(p.dtype(), kFloat64);
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
    if (p.grad().defined()) EXPECT_EQ(p.grad().dtype(), kFloat64);
  }
  nn::BatchNorm2d& bn = net.stem.at<nn::BatchNorm2d>(1);
  EXPECT_EQ(bn.running_mean.dtype(), kFloat64);
  EXPECT_EQ(bn.num_batches_tracked.dtype(), kInt64);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(net(randn({1, 3, 4, 4}, kFloat64)).dtype(), kFloat64);
  net.to(kCPU, kFloat32);
  EXPECT_EQ(held[0].dtype(), kFloat32);
  // zero_grad: to none, or to zeros in place
  net.zero_grad(false);
  for (const Tensor& p : held)
    if (p.grad().defined()) EXPECT_EQ(values(p.grad().abs().max())[0], 0.0);
  net.zero_grad();
  for (const Tensor& p : held) EXPECT_FALSE(p.grad().defined());
}

// to(ChannelsLast) lays out the conv weights (the 4-d tensors) channels-last in place, keeps
// every other tensor as it was, and trains as the contiguous twin does.
TEST(ModuleTo, ChannelsLastWeights) {
  Net plain, laid_out;
  laid_out.load_state_dict(plain.state_dict());
  std::vector<Tensor> held = laid_out.parameters();
  laid_out.to(MemoryFormat::ChannelsLast);
  int convs = 0;
  for (const auto& [name, p] : laid_out.named_parameters()) {
    if (p.dim() == 4) {
      ++convs;
      EXPECT_TRUE(p.is_contiguous(MemoryFormat::ChannelsLast)) << name;
      EXPECT_FALSE(p.is_contiguous()) << name;
    } else {
      EXPECT_TRUE(p.is_contiguous()) << name;
    }
  }
  EXPECT_EQ(convs, 5);  // the stem's and two per block
  EXPECT_TRUE(held[0].is_contiguous(MemoryFormat::ChannelsLast));  // the handles see it
  const Tensor x = randn({2, 3, 6, 6});
  Tensor a = plain(x), b = laid_out(x.to(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(all_close(b, values(a), 1e-5, 1e-6));
  a.sum().backward();
  b.sum().backward();
  std::vector<Tensor> pa = plain.parameters(), pb = laid_out.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pb[i].grad().defined(), pa[i].grad().defined()) << i;  // the aux head gets none
    if (pa[i].grad().defined()) EXPECT_TRUE(all_close(pb[i].grad(), values(pa[i].grad()), 1e-4, 1e-5)) << i;
  }
  const nn::StateDict want = plain.state_dict();
  // weights equal, running statistics to rounding (the convolutions sum in another order)
  for (const auto& [name, t] : laid_out.state_dict())
    EXPECT_TRUE(all_close(t, values(want.at(name)), 1e-5, 1e-6)) << name;
  // a later dtype conversion keeps the layout, weights and grads (PyTorch's preserve_format);
  // a conversion to a layout does not
  laid_out.to(kFloat64);
  for (const auto& [name, p] : laid_out.named_parameters())
    if (p.dim() == 4) {
      EXPECT_TRUE(p.is_contiguous(MemoryFormat::ChannelsLast) && !p.is_contiguous()) << name;
      if (p.grad().defined())
        EXPECT_TRUE(p.grad().is_contiguous(MemoryFormat::ChannelsLast) && !p.grad().is_contiguous()) << name;
    }
  EXPECT_TRUE(all_close(laid_out.state_dict().at("stem.0.weight"), values(want.at("stem.0.weight")), 1e-7, 0));
  laid_out.to(MemoryFormat::Contiguous);
  for (const auto& [name, p] : laid_out.named_parameters()) EXPECT_TRUE(p.is_contiguous()) << name;
}

// zero_grad(false) zeroes a gradient built with create_graph detached, as the optimizers do:
// its graph is freed and the next backward adds into a plain tensor
TEST(ModuleZeroGrad, DetachesAGradientWithHistory) {
  Net m;
  Tensor w = m.parameters()[0];
  (w * w).sum().backward(Tensor(), false, true);
  ASSERT_TRUE(w.grad().requires_grad());
  m.zero_grad(false);
  EXPECT_FALSE(w.grad().requires_grad());
  EXPECT_EQ(w.grad().grad_fn(), nullptr);
  EXPECT_EQ(values(w.grad().abs().max())[0], 0.0);
  m.zero_grad();
  EXPECT_FALSE(w.grad().defined());
}

namespace {
struct WithBuffers : nn::Module {
  Tensor w, stat, scratch, none;
  WithBuffers() {
    w = register_parameter("w", ones({2}));
    stat = register_buffer("stat", zeros({3}));
    scratch = register_buffer("scratch", zeros({5}), false);
    none = register_buffer("none", Tensor());  // PyTorch's None buffer
  }
  void add_again() { register_parameter("stat", ones({1})); }
  void add_dotted() { register_buffer("a.b", ones({1})); }
  void fill_none() { set_tensor("none", ones({2})); }
};
}  // namespace

TEST(ModuleRegistration, BuffersAndNames) {
  WithBuffers m;
  EXPECT_EQ(names_of(m.named_buffers()), (std::vector<std::string>{"stat", "scratch"}));
  EXPECT_EQ(names_of(m.state_dict()), (std::vector<std::string>{"stat", "w"}));  // non-persistent left out
  m.to(kFloat64);
  EXPECT_EQ(m.scratch.dtype(), kFloat64);  // but moved with the module
  EXPECT_TRUE(throws_with([&] { m.add_again(); }, {"\"stat\"", "already registered"}));
  EXPECT_TRUE(throws_with([&] { m.add_dotted(); }, {"\"a.b\""}));
  // an undefined buffer is not listed, and cannot take a value its member would not see
  EXPECT_EQ(m.buffers().size(), 2u);
  EXPECT_TRUE(throws_with([&] { m.fill_none(); }, {"\"none\"", "registered undefined"}));
  // state_dict values share memory with the module but are not graph leaves
  nn::StateDict sd = m.state_dict();
  EXPECT_FALSE(sd.at("w").requires_grad());
  sd.at("w").fill_(3.0);
  EXPECT_EQ(values(m.w), (std::vector<double>{3, 3}));
  EXPECT_TRUE(m.w.requires_grad());
}

TEST(Containers, IndexingKeysAndErrors) {
  nn::Sequential seq(nn::Linear(3, 4), nn::Tanh(), nn::Linear(4, 2));
  EXPECT_EQ(seq.size(), 3u);
  Tensor x = randn({5, 3});
  nn::Linear& a = seq.at<nn::Linear>(0);
  nn::Linear& b = seq.at<nn::Linear>(2);
  EXPECT_TRUE(all_close(seq(x), values(b(tanh(a(x)))), 0, 0));
  EXPECT_TRUE(throws_with([&] { seq[3]; }, {"Sequential", "3", "out of range"}));
  EXPECT_TRUE(throws_with([&] { seq.at<nn::ReLU>(1); }, {"item 1", "Tanh", "not the type"}));
  nn::ModuleList list;
  EXPECT_TRUE(list.empty());
  list.push_back(nn::Linear(2, 2));
  list.push_back(std::make_unique<nn::Dropout>(0.2));
  EXPECT_EQ(names_of(list.named_parameters()), (std::vector<std::string>{"0.weight", "0.bias"}));
  EXPECT_TRUE(throws_with([&] { list(x); }, {"ModuleList", "single tensor input"}));
  EXPECT_TRUE(throws_with([&] { list.push_back(std::unique_ptr<nn::Linear>()); }, {"null"}));
  EXPECT_EQ(list.size(), 2u);
  nn::ModuleDict dict;
  dict.insert("enc", nn::Linear(2, 3));
  dict.insert("dec", nn::Linear(3, 2));
  EXPECT_EQ(dict.keys(), (std::vector<std::string>{"enc", "dec"}));
  EXPECT_TRUE(dict.contains("dec"));
  EXPECT_FALSE(dict.contains("mid"));
  EXPECT_TRUE(throws_with([&] { dict["mid"]; }, {"ModuleDict", "mid"}));
  EXPECT_TRUE(throws_with([&] { dict.insert("enc", nn::ReLU()); }, {"\"enc\"", "already registered"}));
  EXPECT_EQ(names_of(dict.named_parameters()),
            (std::vector<std::string>{"enc.weight", "enc.bias", "dec.weight", "dec.bias"}));
}

namespace {
struct TwoLayer : nn::Module {
  nn::Linear a{2, 3}, b{3, 1};
  TwoLayer() {
    register_module("a", a);
    register_module("b", b);
  }
  Tensor forward(const Tensor& x) override { return b(relu(a(x))); }
};
}  // namespace

TEST(Containers, MovedMemberChildrenKeepTheirNamesAndTensors) {
  TwoLayer m;
  Tensor x = randn({4, 2});
  Tensor before = m(x);
  nn::StateDict saved = m.state_dict();
  nn::Sequential seq(std::move(m), nn::Sigmoid());
  EXPECT_EQ(names_of(seq.named_parameters()),
            (std::vector<std::string>{"0.a.weight", "0.a.bias", "0.b.weight", "0.b.bias"}));
  EXPECT_TRUE(all_close(seq(x), values(sigmoid(before)), 0, 0));
  EXPECT_TRUE(equal(seq.state_dict().at("0.a.weight"), saved.at("a.weight")));
}

namespace {
// Registers layers that are not its data members: elements of a vector.
struct NotMembers : nn::Module {
  std::vector<nn::Linear> layers;
  explicit NotMembers(int n) {
    for (int i = 0; i < n; ++i) {
      layers.emplace_back(2, 2);
      register_module("l" + std::to_string(i), layers.back());
    }
  }
};
}  // namespace

// Note [Member children]: a member child is found again by its offset, which means nothing for
// a module that lives elsewhere; registration refuses one it can tell is not a member (here a
// parent on the stack with children on the heap) instead of failing after a move.
TEST(ModuleRegistration, ChildrenThatAreNotMembersAreRefused) {
  EXPECT_TRUE(throws_with([] { NotMembers m(3); }, {"\"l0\"", "Linear", "not a data member", "unique_ptr"}));
  NotMembers none(0);
  EXPECT_TRUE(none.named_children().empty());
  TwoLayer members;  // data members register
  EXPECT_EQ(members.named_children().size(), 2u);
}

// Assigning through a base reference would replace only the Module part: the listings would
// show the new layer's weights while forward kept the old layer's. It does not compile.
static_assert(!std::is_assignable_v<nn::Module&, nn::Linear&&>);
static_assert(!std::is_assignable_v<nn::Module&, nn::Module&&>);
static_assert(std::is_move_assignable_v<nn::Linear>);  // a whole layer still moves
static_assert(std::is_move_assignable_v<TwoLayer>);

TEST(StateDict, RoundTripCarriesRunningStatistics) {
  Net a, b;
  for (int i = 0; i < 3; ++i) a(randn({4, 3, 5, 5}));  // training steps move the running stats
  a.eval();
  b.eval();
  Tensor x = randn({2, 3, 5, 5});
  EXPECT_FALSE(all_close(a(x), values(b(x)), 1e-3, 1e-3));
  nn::LoadResult r = b.load_state_dict(a.state_dict());
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  EXPECT_TRUE(equal(a(x), b(x)));
  EXPECT_EQ(b.stem.at<nn::BatchNorm2d>(1).num_batches_tracked.item<int64_t>(), 3);
  // loading copies values: the modules stay independent
  nn::init::ones_(a.heads["cls"].state_dict().at("bias"));
  EXPECT_FALSE(equal(a(x), b(x)));
  // a float64 state dict loads into a float32 module by conversion
  nn::StateDict d64;
  for (auto& [k, t] : a.state_dict()) d64.emplace(k, t.to(is_floating(t.dtype()) ? kFloat64 : t.dtype()));
  b.load_state_dict(d64);
  EXPECT_EQ(b.stem.at<nn::Conv2d>(0).weight.dtype(), kFloat32);
  EXPECT_TRUE(all_close(b(x), values(a(x)), 1e-6, 1e-6));
}

// Older checkpoints PyTorch still loads: batch norm without num_batches_tracked (the layer
// keeps its count, and a strict load does not call it missing), and a [1] tensor for a 0-d one.
TEST(StateDict, LoadsCheckpointsWithoutBatchCountsOrZeroDimTensors) {
  Net a, b;
  for (int i = 0; i < 2; ++i) a(randn({4, 3, 5, 5}));
  nn::StateDict d = a.state_dict();
  ASSERT_EQ(d.erase("stem.1.num_batches_tracked"), 1u);
  nn::LoadResult r = b.load_state_dict(d);
  EXPECT_TRUE(r.missing_keys.empty());
  auto& bn = b.stem.at<nn::BatchNorm2d>(1);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
  EXPECT_TRUE(equal(bn.running_mean, a.stem.at<nn::BatchNorm2d>(1).running_mean));
  d = a.state_dict();
  d["stem.1.num_batches_tracked"] = from_vector<int64_t>({7});
  b.load_state_dict(d);
  EXPECT_EQ(bn.num_batches_tracked.dim(), 0);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 7);
  d["stem.1.num_batches_tracked"] = from_vector<int64_t>({7, 8});  // not one element: refused
  EXPECT_TRUE(throws_with([&] { b.load_state_dict(d); }, {"stem.1.num_batches_tracked", "[2]"}));
  d.erase("stem.1.running_var");  // the other buffers stay required
  EXPECT_TRUE(throws_with([&] { b.load_state_dict(d); }, {"missing keys: stem.1.running_var"}));
}

TEST(StateDict, NonStrictStillRejectsShapeMismatchesAndWritesNothing) {
  Net a;
  nn::StateDict d = a.state_dict();
  d["blocks.0.conv1.weight"] = zeros({4, 4, 1, 1});
  d.erase("heads.aux.1.bias");
  d["heads.aux.2.weight"] = zeros({2, 4});
  Tensor before = a.state_dict().at("stem.0.weight").clone();
  d["stem.0.weight"] = zeros({4, 3, 3, 3});
  EXPECT_TRUE(throws_with([&] { a.load_state_dict(d, false); },
                          {"Net", "shape mismatches", "blocks.0.conv1.weight", "[4, 4, 3, 3]", "[4, 4, 1, 1]"}));
  try {  // missing and unexpected keys are no error when not strict: the message names neither
    a.load_state_dict(d, false);
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("keys"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(equal(a.state_dict().at("stem.0.weight"), before));  // checked before any write
  // strict lists the unexpected keys as well
  d["blocks.0.conv1.weight"] = zeros({4, 4, 3, 3});
  EXPECT_TRUE(throws_with([&] { a.load_state_dict(d); }, {"missing keys: heads.aux.1.bias",
                                                          "unexpected keys: heads.aux.2.weight"}));
  nn::LoadResult r = a.load_state_dict(d, false);
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"heads.aux.1.bias"}));
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"heads.aux.2.weight"}));
  EXPECT_EQ(values(a.state_dict().at("stem.0.weight").abs().max())[0], 0.0);
  d["stem.1.running_mean"] = Tensor();
  EXPECT_TRUE(throws_with([&] { a.load_state_dict(d, false); }, {"stem.1.running_mean", "undefined"}));
}

// A destination copy_ would refuse (a buffer that is an expanded view) is found with the other
// checks: nothing is written, where the keys before it had been.
TEST(StateDict, UnwritableDestinationWritesNothing) {
  struct WithExpanded : nn::Module {
    Tensor a, pe;
    WithExpanded() {
      a = register_parameter("a", zeros({2}));
      pe = register_buffer("pe", zeros({1, 4}).expand({3, 4}));
    }
  } m;
  EXPECT_TRUE(throws_with([&] { m.load_state_dict({{"a", full({2}, 5.0)}, {"pe", ones({3, 4})}}); },
                          {"cannot be written", "pe"}));
  EXPECT_EQ(values(m.a), (std::vector<double>{0, 0}));
}

// A child or a tensor registered under two names is one object: listed once (under its first
// name) by parameters(), named_modules(), children() and apply(), as PyTorch does, so an
// optimizer or a gradient norm sees it once; state_dict keeps both names.
TEST(ModuleRegistration, SharedChildIsListedOnce) {
  struct Shared : nn::Module {
    nn::Linear lin{3, 3};
    Tensor w;
    Shared() {
      register_module("a", lin);
      register_module("b", lin);
      w = register_parameter("w", ones({2}));
      register_parameter("w_again", w);
    }
  } m;
  EXPECT_EQ(m.parameters().size(), 3u);
  EXPECT_EQ(m.num_parameters(), 9 + 3 + 2);
  std::vector<std::string> names;
  for (auto& [n, t] : m.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"w", "a.weight", "a.bias"}));
  EXPECT_EQ(m.children().size(), 1u);
  EXPECT_EQ(m.named_modules().size(), 2u);
  int calls = 0;
  m.apply([&](nn::Module&) { ++calls; });
  EXPECT_EQ(calls, 2);
  nn::StateDict d = m.state_dict();
  for (const char* k : {"a.weight", "a.bias", "b.weight", "b.bias", "w", "w_again"}) EXPECT_EQ(d.count(k), 1u) << k;
  m.load_state_dict(d);
  optim::SGD opt(m.parameters(), {.lr = 0.1});  // refused a parameter listed twice before
  m.lin.weight.set_grad(ones({3, 3}));
  EXPECT_NEAR(optim::total_grad_norm(m.parameters()), 3.0, 1e-12);
}

// ---- state_dict --------------------------------------------------------------------------------

namespace {
struct SmallNet : nn::Module {
  nn::Embedding emb{10, 8};
  nn::LayerNorm norm{8};
  nn::Sequential head{nn::Linear(8, 16), nn::GELU(), nn::Dropout(0.1), nn::Linear(16, 4, {.bias = false})};
  SmallNet() {
    register_module("emb", emb);
    register_module("norm", norm);
    register_module("head", head);
  }
  Tensor forward(const Tensor& idx) override { return head(norm(emb(idx))); }
};
}  // namespace

TEST(StateDict, KeysMatchPyTorchAndRoundTrip) {
  SmallNet a, b;
  a.eval();
  b.eval();
  std::vector<std::string> keys;
  for (auto& [k, t] : a.state_dict()) keys.push_back(k);
  // what torch gives for the same architecture (sorted)
  const std::vector<std::string> want = {"emb.weight", "head.0.bias", "head.0.weight", "head.3.weight",
                                         "norm.bias", "norm.weight"};
  EXPECT_EQ(keys, want);
  Tensor idx = from_vector<int64_t>({1, 2, 3});
  EXPECT_FALSE(equal(a(idx), b(idx)));
  b.load_state_dict(a.state_dict());
  EXPECT_TRUE(equal(a(idx), b(idx)));
  EXPECT_EQ(a.state_dict().at("head.0.weight").shape(), (Shape{16, 8}));
}

TEST(StateDict, LoadReportsEveryMismatch) {
  SmallNet a;
  nn::StateDict d = a.state_dict();
  d.erase("norm.bias");
  d.erase("emb.weight");
  d["extra.weight"] = zeros({1});
  d["head.0.weight"] = zeros({8, 16});
  d["head.3.weight"] = zeros({3, 16});
  Tensor before = a.state_dict().at("norm.weight").clone();
  EXPECT_TRUE(throws_with([&] { a.load_state_dict(d); },
                          {"norm.bias", "emb.weight", "extra.weight", "head.0.weight", "head.3.weight", "[16, 8]"}));
  EXPECT_TRUE(equal(a.state_dict().at("norm.weight"), before));  // nothing written
  d["head.0.weight"] = zeros({16, 8});
  d["head.3.weight"] = zeros({4, 16});
  nn::LoadResult r = a.load_state_dict(d, false);
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"emb.weight", "norm.bias"}));
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"extra.weight"}));
  for (double v : values(a.head.at<nn::Linear>(0).weight)) EXPECT_EQ(v, 0.0);
}

TEST(Autograd, BackwardThroughAFreedGraphRaises) {
  Tensor x = randn({3, 4}).requires_grad_();
  Tensor loss = square(F::layer_norm(x, {4})).sum();
  loss.backward();
  EXPECT_TRUE(throws_with([&] { loss.backward(); }, {"second time"}));
  Tensor l2 = F::cross_entropy(x, from_vector<int64_t>({0, 1, 2}));
  l2.backward();
  EXPECT_THROW(l2.backward(), Error);
  // through a model: retain_graph keeps the graph for a second pass, which then accumulates
  nn::Sequential mlp(nn::Linear(4, 5), nn::GELU(), nn::LayerNorm(5), nn::Linear(5, 2));
  Tensor l3 = F::cross_entropy(mlp(x.detach()), from_vector<int64_t>({0, 1, 1}));
  l3.backward(Tensor(), true);
  Tensor once = mlp.at<nn::Linear>(0).weight.grad().clone();
  l3.backward();
  EXPECT_TRUE(all_close(mlp.at<nn::Linear>(0).weight.grad(), values(once * 2.0), 1e-6, 1e-7));
  EXPECT_TRUE(throws_with([&] { l3.backward(); }, {"second time"}));
}
