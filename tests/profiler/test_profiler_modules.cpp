// Module ranges: record_modules names each module call by its dotted name and with_modules by
// its class; each range encloses its module's ops and the ranges of its children; the hooks go
// when the session stops; a forward that raises leaves no range open past its parent.
#include "profiler/profiler_testing.h"
#include "testing.h"

namespace st = strata;
namespace nn = strata::nn;
namespace prof = strata::profiler;
using strata::Tensor;
using namespace profiler_testing;

namespace {

struct Net : nn::Module {
  nn::Linear fc1{3, 4};
  nn::Sequential body{nn::ReLU(), nn::Linear(4, 2)};
  Net() {
    register_module("fc1", fc1);
    register_module("body", body);
  }
  Tensor forward(const Tensor& x) override { return body(fc1(x)); }
  std::string name() const override { return "Net"; }
};

std::vector<std::string> names_of(const std::vector<const prof::ProfilerEvent*>& events) {
  std::vector<std::string> out;
  for (const auto* e : events) out.push_back(e->name);
  return out;
}

}  // namespace

TEST(ProfilerModules, RecordModulesNestsEachModulesOpsInItsDottedName) {
  Net net;
  Tensor x = st::randn({2, 3});
  prof::Profiler p;
  p.record_modules(net);
  {
    prof::ProfileScope scope(p);
    net(x);
  }
  const auto& root = only(p, "nn.Module: Net");
  EXPECT_EQ(root.parent_id, -1);
  EXPECT_EQ(names_of(children(p, root)), (std::vector<std::string>{"nn.Module: fc1", "nn.Module: body"}));
  EXPECT_EQ(names_of(children(p, only(p, "nn.Module: fc1"))), std::vector<std::string>{"linear"});
  const auto& body = only(p, "nn.Module: body");
  EXPECT_EQ(names_of(children(p, body)), (std::vector<std::string>{"nn.Module: body.0", "nn.Module: body.1"}));
  EXPECT_EQ(names_of(children(p, only(p, "nn.Module: body.0"))), std::vector<std::string>{"relu"});
  EXPECT_EQ(names_of(children(p, only(p, "nn.Module: body.1"))), std::vector<std::string>{"linear"});
  for (const auto& e : p.events())  // every op lies inside some module's range
    if (e.kind == prof::EventKind::Op) EXPECT_NE(e.parent_id, -1) << e.name;
  // the session's hooks are gone with it
  EXPECT_FALSE(nn::has_global_forward_hooks());
  EXPECT_FALSE(net.has_hooks());
}

TEST(ProfilerModules, WithModulesNamesEveryModuleByItsClass) {
  Net net;
  Tensor x = st::randn({2, 3});
  nn::Linear outside(2, 2);
  prof::Profiler p({.with_modules = true});
  {
    prof::ProfileScope scope(p);
    outside(net(x));
  }
  EXPECT_EQ(named(p, "nn.Module: Linear").size(), 3u);
  EXPECT_EQ(only(p, "nn.Module: Net").parent_id, -1);
  EXPECT_EQ(only(p, "nn.Module: Sequential").parent_id, only(p, "nn.Module: Net").id);
  // a named tree without with_modules records only that tree
  prof::Profiler q;
  q.record_modules(net);
  {
    prof::ProfileScope scope(q);
    outside(net(x));
  }
  EXPECT_EQ(named(q, "nn.Module: Linear").size(), 0u);
  EXPECT_EQ(named(q, "nn.Module: fc1").size(), 1u);
}

TEST(ProfilerModules, AForwardThatRaisesClosesItsRanges) {
  nn::Sequential failing{nn::Linear(3, 4), nn::Linear(5, 2)};  // the second refuses the first's output
  nn::Sequential ok{nn::ReLU()};
  prof::Profiler p({.with_modules = true});
  {
    prof::ProfileScope scope(p);
    EXPECT_THROW(failing(st::randn({2, 3})), st::Error);
    ok(st::randn({2, 3}));
  }
  auto sequentials = named(p, "nn.Module: Sequential");
  ASSERT_EQ(sequentials.size(), 2u);
  for (const auto* s : sequentials) EXPECT_EQ(s->parent_id, -1);
  for (const auto* l : named(p, "nn.Module: Linear")) EXPECT_EQ(l->parent_id, sequentials[0]->id);
  EXPECT_EQ(only(p, "nn.Module: ReLU").parent_id, sequentials[1]->id);
  EXPECT_LE(sequentials[0]->end_ns, sequentials[1]->start_ns);
}

TEST(ProfilerModules, MultiInputCallsHaveTheirRanges) {
  // attention called by its encoder layer as self_attn(x, x, x, ...), and a loss's (input, target)
  nn::TransformerEncoderLayer layer(8, 2, {.dim_feedforward = 16, .dropout = 0});
  nn::MSELoss mse;
  Tensor x = st::randn({5, 3, 8});
  prof::Profiler p({.with_modules = true});
  p.record_modules(layer);
  {
    prof::ProfileScope scope(p);
    mse(layer(x, Tensor()), x);
  }
  const auto& root = only(p, "nn.Module: TransformerEncoderLayer");
  const auto& attn = only(p, "nn.Module: self_attn");
  EXPECT_EQ(attn.parent_id, root.id);
  EXPECT_EQ(only(p, "nn.Module: self_attn.out_proj").parent_id, attn.id);
  EXPECT_EQ(names_of(children(p, attn)).back(), "nn.Module: self_attn.out_proj");
  const auto& loss = only(p, "nn.Module: MSELoss");
  EXPECT_EQ(loss.parent_id, -1);
  EXPECT_FALSE(children(p, loss).empty());  // the loss's ops inside its range
  EXPECT_LE(root.end_ns, loss.start_ns);
}
