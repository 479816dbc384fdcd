// FullyShardedDataParallel's prefetching under mpirun (2 and 4 ranks): backward_prefetch and
// forward_prefetch change when the next unit's all-gather is issued, never the result (training
// with any of them is bit for bit the training without), and the recorded gather events show each
// prefetched gather issued before the unit that needs it starts. CPU offload of a CPU module
// changes nothing either (its GPU side: test_fsdp_offload_cuda.cpp).
#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;
using dist::BackwardPrefetch;
using Event = dist::GatherEvent;

dist::FSDPOptions with_prefetch(ShardingStrategy s, BackwardPrefetch backward, bool forward) {
  dist::FSDPOptions o = blocks(s);
  if (s == ShardingStrategy::HybridShard || s == ShardingStrategy::HybridShardZero2)
    o.device_mesh = dist::DeviceMesh({2, dist::get_world_size() / 2}, {"replicate", "shard"});
  o.backward_prefetch = backward;
  o.forward_prefetch = forward;
  return o;
}

size_t count(const std::vector<Event>& events, Event::Kind kind) {
  const auto of_kind = [&](const Event& e) { return e.kind == kind; };
  return static_cast<size_t>(std::count_if(events.begin(), events.end(), of_kind));
}

TEST(FsdpPrefetch, TrainingWithPrefetchingIsBitForBitTheTrainingWithout) {
  auto pg = dist_testing::group();
  const std::pair<BackwardPrefetch, bool> configs[] = {{BackwardPrefetch::None, false},
                                                       {BackwardPrefetch::BackwardPre, false},
                                                       {BackwardPrefetch::BackwardPost, false},
                                                       {BackwardPrefetch::BackwardPre, true},
                                                       {BackwardPrefetch::None, true}};
  for (ShardingStrategy s : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard,
                             ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2}) {
    std::vector<Tensor> baseline;
    for (const auto& [backward, forward] : configs) {
      auto net = make_net(100);
      FSDP fsdp(*net, with_prefetch(s, backward, forward));
      fsdp.record_gather_events();
      optim::AdamW opt(fsdp.parameters(), {.lr = 0.01, .weight_decay = 0.1});
      for (int step = 0; step < 4; ++step) {
        fsdp_step(fsdp, opt, step);
        if (s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard)
          for (size_t u = 0; u < 3; ++u) EXPECT_FALSE(fsdp.is_gathered(u));  // nothing prefetched is left over
      }
      const std::vector<Event> events = fsdp.gather_events();
      // every gather issued is waited for, and prefetching issues some unless nothing is freed
      EXPECT_EQ(count(events, Event::Issue) + count(events, Event::Prefetch), count(events, Event::Wait));
      // ShardGradOp keeps the units gathered from the forward to the end of the backward
      const bool frees = s != ShardingStrategy::NoShard;
      const bool frees_in_forward = s == ShardingStrategy::FullShard || s == ShardingStrategy::HybridShard;
      const bool prefetches = (forward && frees) || (backward != BackwardPrefetch::None && frees_in_forward);
      EXPECT_EQ(count(events, Event::Prefetch) > 0, prefetches) << static_cast<int>(s);
      if (baseline.empty()) {
        for (const Tensor& shard : fsdp.parameters()) baseline.push_back(shard.detach().clone());
        continue;
      }
      for (size_t u = 0; u < 3; ++u)
        EXPECT_TRUE(equal(fsdp.parameters()[u], baseline[u]))
            << "strategy " << static_cast<int>(s) << " backward " << static_cast<int>(backward) << " forward "
            << forward << " unit " << u;
    }
  }
}

// Units: 0 the root (embed, head), 1 b1, 2 b2. The forward runs 0, 1, 2 and ends them 1, 2, 0; the
// backward runs 0, 2, 1.
TEST(FsdpPrefetch, TheNextUnitsGatherIsIssuedBeforeItIsNeeded) {
  auto pg = dist_testing::group();
  for (const bool prefetch : {false, true}) {
    auto net = make_net(110);
    FSDP fsdp(*net, with_prefetch(ShardingStrategy::FullShard,
                                  prefetch ? BackwardPrefetch::BackwardPre : BackwardPrefetch::None, prefetch));
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1});
    // registered after FSDP's: at the start of b2's backward, before its gradients are computed
    std::vector<Event> at_b2_backward;
    net->b2.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
      if (out.requires_grad())
        out.register_hook([&](const Tensor&) {
          at_b2_backward = fsdp.gather_events();
          return Tensor();
        });
    });
    const auto issue = prefetch ? Event::Prefetch : Event::Issue;
    for (int step = 0; step < 2; ++step) {
      fsdp.record_gather_events();
      fsdp_step(fsdp, opt, step);
      // the first forward has no recorded order to prefetch in
      const auto fwd = step == 0 ? Event::Issue : issue;
      const std::vector<Event> want{{Event::Issue, 0, false}, {Event::Wait, 0, false}, {fwd, 1, false},
                                    {Event::Wait, 1, false},  {fwd, 2, false},         {Event::Wait, 2, false},
                                    {Event::Issue, 0, true},  {Event::Wait, 0, true},  {issue, 2, true},
                                    {Event::Wait, 2, true},   {issue, 1, true},        {Event::Wait, 1, true}};
      const std::vector<Event> got = fsdp.gather_events();
      ASSERT_EQ(got.size(), want.size()) << "step " << step << " prefetch " << prefetch;
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(got[i], want[i]) << "event " << i << " step " << step << " prefetch " << prefetch << ": got kind "
                                   << static_cast<int>(got[i].kind) << " unit " << got[i].unit;
      // with BackwardPre, b1's gather is in flight before b2's gradients are computed
      ASSERT_EQ(at_b2_backward.size(), prefetch ? 11u : 10u);
      const Event last = prefetch ? Event{Event::Prefetch, 1, true} : Event{Event::Wait, 2, true};
      EXPECT_EQ(at_b2_backward.back(), last);
    }
  }
}

// BackwardPost issues the next unit's gather once a unit's gradients are all in: b2's, whose
// backward ends before the root's (the root's embed is the last layer the backward reaches).
TEST(FsdpPrefetch, BackwardPostPrefetchesAfterAUnitsGradientsAreIn) {
  auto pg = dist_testing::group();
  auto net = make_net(120);
  FSDP fsdp(*net, with_prefetch(ShardingStrategy::FullShard, BackwardPrefetch::BackwardPost, false));
  optim::SGD opt(fsdp.parameters(), {.lr = 0.1});
  fsdp.record_gather_events();
  fsdp_step(fsdp, opt, 0);
  std::vector<Event> backward;
  for (const Event& e : fsdp.gather_events())
    if (e.backward) backward.push_back(e);
  const std::vector<Event> want{{Event::Issue, 0, true}, {Event::Wait, 0, true},     {Event::Issue, 2, true},
                                {Event::Wait, 2, true},  {Event::Prefetch, 1, true}, {Event::Wait, 1, true}};
  EXPECT_EQ(backward, want);
}

// A frozen first unit (its input and parameters need no gradient) has no backward: as PyTorch
// (_needs_pre_backward_unshard), neither backward prefetch gathers it for nothing.
TEST(FsdpPrefetch, AUnitWithoutABackwardIsNotPrefetchedInTheBackward) {
  auto pg = dist_testing::group();
  for (const BackwardPrefetch mode : {BackwardPrefetch::BackwardPre, BackwardPrefetch::BackwardPost}) {
    auto net = make_net(150);
    net->embed.weight.requires_grad_(false);
    net->embed.bias.requires_grad_(false);
    dist::FSDPOptions o = with_prefetch(ShardingStrategy::FullShard, mode, false);
    o.wrap_modules = {&net->embed};
    FSDP fsdp(*net, o);
    ASSERT_EQ(fsdp.unit_names(), (std::vector<std::string>{"", "embed", "b1", "b2"}));
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1});
    for (int step = 0; step < 2; ++step) {
      fsdp.record_gather_events();
      fsdp_step(fsdp, opt, step);
      const std::vector<Event> events = fsdp.gather_events();
      EXPECT_EQ(std::count(events.begin(), events.end(), Event{Event::Prefetch, 1, true}), 0)
          << "mode " << static_cast<int>(mode) << " step " << step;
      EXPECT_EQ(count(events, Event::Issue) + count(events, Event::Prefetch), count(events, Event::Wait));
      EXPECT_EQ(std::count(events.begin(), events.end(), Event{Event::Prefetch, 2, true}), 1);  // b1's still is
    }
  }
}

// A net whose forward may skip b2, so that a forward prefetches (after b1) a unit it never uses.
struct SkippingNet : Net {
  bool skip = false;
  Tensor forward(const Tensor& x) override {
    const Tensor h = b1(tanh(embed(x)));
    return head(skip ? h : b2(h));
  }
};

// The prefetched gather of a unit that the forward then skips is waited for and freed by the end
// of the backward, and the training goes on as the plain model's (whose b2 gets no gradient).
TEST(FsdpPrefetch, AGatherPrefetchedForAUnitNeverUsedIsFreed) {
  auto pg = dist_testing::group();
  manual_seed(140);
  SkippingNet net, ref;
  ref.load_state_dict(net.state_dict());
  FSDP fsdp(net, with_prefetch(ShardingStrategy::FullShard, BackwardPrefetch::BackwardPre, true));
  optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref.parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    net.skip = ref.skip = step == 1;
    fsdp.record_gather_events();
    fsdp_step(fsdp, opt, step);
    reference_step(ref, ref_opt, step);
    for (size_t u = 0; u < 3; ++u) EXPECT_FALSE(fsdp.is_gathered(u)) << "step " << step << " unit " << u;
    const std::vector<Event> events = fsdp.gather_events();
    const auto has = [&](Event e) { return std::find(events.begin(), events.end(), e) != events.end(); };
    const bool b2_prefetched = has({Event::Prefetch, 2, false}), b2_used = has({Event::Wait, 2, false});
    // after b1's forward in the previous forward's order: not in the first, nor after the skip
    EXPECT_EQ(b2_prefetched, step == 1) << step;
    EXPECT_EQ(b2_used, step != 1) << step;
  }
  expect_close_dicts(fsdp.full_state_dict(false), ref.state_dict(), 1e-12);
}

// CPU offload of a CPU module: the shards were on the CPU already; the training is bit for bit
// the training without it.
TEST(FsdpCpuOffload, OfACpuModuleChangesNothing) {
  auto pg = dist_testing::group();
  for (ShardingStrategy s : all_strategies()) {
    std::vector<std::vector<Tensor>> shards;
    for (bool offload : {false, true}) {
      auto net = make_net(130);
      dist::FSDPOptions o = blocks(s);
      o.cpu_offload = {.offload_params = offload};
      FSDP fsdp(*net, o);
      optim::AdamW opt(fsdp.parameters(), {.lr = 0.01});
      for (int step = 0; step < 3; ++step) fsdp_step(fsdp, opt, step);
      shards.push_back(fsdp.parameters());
    }
    for (size_t u = 0; u < 3; ++u) EXPECT_TRUE(equal(shards[0][u], shards[1][u])) << static_cast<int>(s);
  }
}

}  // namespace
}  // namespace strata
