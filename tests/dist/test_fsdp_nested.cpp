// Nested FullyShardedDataParallel wrappers under mpirun (2 and 4 ranks): wrappers built over the
// blocks first, then one over the whole model, which skips the blocks' parameters. Training with
// an optimizer over the outer wrapper's parameters() equals one process training the plain model
// on the whole batch (float64); the state dicts, clipping, no_sync and summon_full_params cover
// the nested wrappers; a wrapper built inside another, or destroyed before it, raises.
#include <memory>

#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;

struct Nest {
  std::unique_ptr<Net> net;
  std::unique_ptr<FSDP> b1, b2, outer;
};

// b1 under `inner`, b2 under FullShard, the rest under `outer`.
Nest nest(uint64_t seed, ShardingStrategy inner, ShardingStrategy outer) {
  Nest n{make_net(seed), nullptr, nullptr, nullptr};
  n.b1 = std::make_unique<FSDP>(n.net->b1, dist::FSDPOptions{.sharding_strategy = inner});
  n.b2 = std::make_unique<FSDP>(n.net->b2);
  n.outer = std::make_unique<FSDP>(*n.net, dist::FSDPOptions{.sharding_strategy = outer});
  return n;
}

TEST(FsdpNested, TrainingThroughTheOuterWrapperEqualsOneProcessOnTheWholeBatch) {
  auto pg = dist_testing::group();
  for (ShardingStrategy inner : all_strategies())
    for (ShardingStrategy outer : all_strategies()) {
      Nest n = nest(200, inner, outer);
      auto ref = make_net(200);
      EXPECT_EQ(n.outer->unit_names(), std::vector<std::string>{""});
      EXPECT_EQ(n.outer->unit_parameter_names(0),
                (std::vector<std::string>{"embed.weight", "embed.bias", "head.weight", "head.bias"}));
      ASSERT_EQ(n.outer->parameters().size(), 3u);  // its own shard, then b1's and b2's
      EXPECT_TRUE(n.outer->parameters()[1].is_same(n.b1->parameters()[0]));
      optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
      optim::AdamW opt(n.outer->parameters(), adamw), ref_opt(ref->parameters(), adamw);
      for (int step = 0; step < 4; ++step) {
        Batch b = local_batch(step, *pg);
        Tensor loss = F::mse_loss((*n.outer)(b.x), b.y);
        loss.backward();
        opt.step();
        opt.zero_grad();
        reference_step(*ref, ref_opt, step);
      }
      const std::string what = fmt::format("inner {} outer {}", static_cast<int>(inner), static_cast<int>(outer));
      expect_close_dicts(n.outer->full_state_dict(/*rank0_only=*/false), ref->state_dict(), 1e-12);
      EXPECT_EQ(n.outer->full_state_dict().empty(), pg->rank() != 0) << what;
      EXPECT_TRUE(allclose(n.outer->parameters()[0],
                           reference_shard(*n.outer, 0, *ref, [](const Tensor& p) { return p; }), 1e-12, 1e-12))
          << what;
    }
}

// A block whose forward saves a view of its weight (w^T for the product), not the parameter.
struct ViewBlock : nn::Module {
  Tensor w = register_parameter("w", randn({8, 8}, TensorOptions(kFloat64)));
  std::string name() const override { return "ViewBlock"; }
  Tensor forward(const Tensor& x) override { return tanh(matmul(x, w.t())); }
};
struct ViewNet : nn::Module {
  nn::Linear embed{6, 8};
  ViewBlock block;
  nn::Linear head{8, 5};
  ViewNet() {
    register_module("embed", embed);
    register_module("block", block);
    register_module("head", head);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return head(block(tanh(embed(x)))); }
};

// The outer forward's saved-tensor hooks keep a nested FullShard unit's saved views as places in
// its flat parameter, so its gathered memory is released after its forward and rebuilt for the
// backward.
TEST(FsdpNested, TheOuterForwardReleasesANestedUnitsGatheredMemory) {
  auto pg = dist_testing::group();
  manual_seed(230);
  ViewNet net, ref;
  ref.load_state_dict(net.state_dict());
  FSDP inner(net.block);
  FSDP outer(net);
  std::weak_ptr<Storage> memory;
  net.block.register_forward_pre_hook([&](nn::Module&, const Tensor&) { memory = net.block.w.storage(); });
  optim::SGD opt(outer.parameters(), {.lr = 0.1}), ref_opt(ref.parameters(), {.lr = 0.1});
  for (int step = 0; step < 2; ++step) {
    Batch b = local_batch(step, *pg), whole = batch(step);
    Tensor loss = F::mse_loss(outer(b.x), b.y);
    EXPECT_TRUE(memory.expired());
    loss.backward();
    opt.step();
    F::mse_loss(ref(whole.x), whole.y).backward();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
  expect_close_dicts(outer.full_state_dict(false), ref.state_dict(), 1e-12);
}

TEST(FsdpNested, StateClippingNoSyncAndSummonCoverTheNestedWrappers) {
  auto pg = dist_testing::group();
  Nest n = nest(210, ShardingStrategy::ShardGradOp, ShardingStrategy::FullShard);
  auto ref = make_net(210);
  optim::AdamWOptions adamw{.lr = 0.02, .weight_decay = 0.05};
  optim::AdamW opt(n.outer->parameters(), adamw), ref_opt(ref->parameters(), adamw);
  for (int step = 0; step < 3; ++step) {
    fsdp_step(*n.outer, opt, step);
    reference_step(*ref, ref_opt, step);
  }
  // the full optimizer state is a plain AdamW's over net.parameters(), and it resumes a flat wrapper
  const optim::StateDict full = n.outer->full_optim_state_dict(opt, /*rank0_only=*/false);
  const optim::StateDict want = ref_opt.state_dict();
  EXPECT_EQ(full.scalars, want.scalars);
  ASSERT_EQ(full.tensors.size(), want.tensors.size());
  for (const auto& [key, t] : want.tensors) EXPECT_TRUE(allclose(full.tensors.at(key), t, 1e-11, 1e-14)) << key;
  auto flat_net = make_net(211);
  FSDP flat(*flat_net, blocks(ShardingStrategy::FullShard));
  optim::AdamW flat_opt(flat.parameters(), adamw);
  flat.load_full_state_dict(n.outer->full_state_dict(false));
  flat.load_full_optim_state_dict(flat_opt, full);
  fsdp_step(flat, flat_opt, 3);
  // and loads back into the nested wrappers
  Nest m = nest(212, ShardingStrategy::FullShard, ShardingStrategy::NoShard);
  optim::AdamW m_opt(m.outer->parameters(), adamw);
  m.outer->load_full_state_dict(n.outer->full_state_dict(false));
  m.outer->load_full_optim_state_dict(m_opt, full);
  fsdp_step(*m.outer, m_opt, 3);
  reference_step(*ref, ref_opt, 3);
  expect_close_dicts(flat.full_state_dict(false), ref->state_dict(), 1e-11);
  expect_close_dicts(m.outer->full_state_dict(false), ref->state_dict(), 1e-11);
  // clipping takes every wrapper's gradients
  for (double norm : {2.0, std::numeric_limits<double>::infinity()}) {
    Batch b = local_batch(4, *pg), whole = batch(4);
    F::mse_loss((*m.outer)(b.x), b.y).backward();
    F::mse_loss((*ref)(whole.x), whole.y).backward();
    EXPECT_NEAR(m.outer->clip_grad_norm_(0.01, norm), optim::clip_grad_norm_(ref->parameters(), 0.01, norm), 1e-12);
    expect_close_dicts(m.outer->full_state_dict(false), ref->state_dict(), 1e-11);
    m_opt.zero_grad();
    ref_opt.zero_grad();
  }
  // no_sync on the outer wrapper holds the nested ones' reductions back too
  {
    auto guard = m.outer->no_sync();
    Batch b = local_batch(5, *pg);
    F::mse_loss((*m.outer)(b.x), b.y).backward();
    for (const Tensor& s : m.outer->parameters()) EXPECT_FALSE(s.grad().defined());
  }
  // summon_full_params shows the nested wrappers' parameters
  {
    auto full_params = m.outer->summon_full_params();
    EXPECT_EQ(m.net->b1.fc.weight.numel(), 64);
    EXPECT_TRUE(allclose(m.net->b2.fc.bias, ref->b2.fc.bias, 1e-11, 1e-11));
  }
  EXPECT_EQ(m.net->b1.fc.weight.numel(), 0);
}

// Two blocks under a module without parameters of its own: a nested wrapper over it has no root
// unit, so only the outer wrapper's forward tells it that a new forward pass begins.
struct Pair : nn::Module {
  Block b1, b2;
  Pair() {
    register_module("b1", b1);
    register_module("b2", b2);
  }
  Tensor forward(const Tensor& x) override { return b2(b1(x)); }
};
struct PairNet : nn::Module {
  nn::Linear embed{6, 8};
  Pair pair;
  nn::Linear head{8, 5};
  PairNet() {
    register_module("embed", embed);
    register_module("pair", pair);
    register_module("head", head);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return head(pair(tanh(embed(x)))); }
};

// A nested wrapper's forward_prefetch follows each forward's order, not only the first one's,
// and it trains as the plain model.
TEST(FsdpNested, ANestedWrapperWithoutARootUnitPrefetchesInEveryForward) {
  auto pg = dist_testing::group();
  manual_seed(240);
  PairNet net, ref;
  ref.load_state_dict(net.state_dict());
  FSDP inner(net.pair, {.auto_wrap_policy = dist::module_wrap_policy<Block>(), .forward_prefetch = true});
  ASSERT_EQ(inner.unit_names(), (std::vector<std::string>{"b1", "b2"}));
  FSDP outer(net);
  optim::SGD opt(outer.parameters(), {.lr = 0.1}), ref_opt(ref.parameters(), {.lr = 0.1});
  using Event = dist::GatherEvent;
  for (int step = 0; step < 3; ++step) {
    inner.record_gather_events();
    Batch b = local_batch(step, *pg), whole = batch(step);
    F::mse_loss(outer(b.x), b.y).backward();
    opt.step();
    F::mse_loss(ref(whole.x), whole.y).backward();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
    const std::vector<Event> events = inner.gather_events();
    // b2 (unit 1) is prefetched when b1's forward starts, from the second forward on
    const bool prefetched = std::count(events.begin(), events.end(), Event{Event::Prefetch, 1, false}) == 1;
    EXPECT_EQ(prefetched, step > 0) << "step " << step;
  }
  expect_close_dicts(outer.full_state_dict(false), ref.state_dict(), 1e-12);
}

TEST(FsdpNested, AWrapperInsideAnotherOrDestroyedBeforeItRaises) {
  dist_testing::group();
  auto net = make_net(220);
  auto b1 = std::make_unique<FSDP>(net->b1);
  EXPECT_THROW(FSDP(*net, {.wrap_modules = {&net->b1.fc}}), Error);  // inside the nested wrapper
  FSDP outer(*net);
  EXPECT_TRUE(testing::throws_with([&] { FSDP(net->b2); }, {"already inside another"}));
  b1.reset();
  EXPECT_TRUE(testing::throws_with([&] { outer.parameters(); }, {"destroyed first"}));
}

}  // namespace
}  // namespace strata
