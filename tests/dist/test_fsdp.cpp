// FullyShardedDataParallel under mpirun (2 and 4 ranks): training with each sharding strategy
// equals one process training the plain model on the whole batch (float64, to round-off); a
// FullShard unit's full parameters exist only during its forward and backward (their memory is
// released, not only the handles dropped); no_sync accumulation equals a larger batch;
// clip_grad_norm_ equals the plain model's clip; bad wrapping raises.
#include <memory>

#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;

TEST(Fsdp, AdamWTrainingEqualsOneProcessOnTheWholeBatchForEveryStrategy) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(10 + static_cast<uint64_t>(pg->rank())), ref = make_net(10);  // rank 0's state everywhere
    FSDP fsdp(*net, blocks(strategy));
    EXPECT_EQ(fsdp.unit_names(), (std::vector<std::string>{"", "b1", "b2"}));
    EXPECT_EQ(fsdp.unit_parameter_names(0),
              (std::vector<std::string>{"embed.weight", "embed.bias", "head.weight", "head.bias"}));
    optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
    optim::AdamW opt(fsdp.parameters(), adamw), ref_opt(ref->parameters(), adamw);
    for (int step = 0; step < 4; ++step) {
      fsdp_step(fsdp, opt, step);
      reference_step(*ref, ref_opt, step);
      for (size_t u = 0; u < 3; ++u)
        EXPECT_TRUE(allclose(fsdp.parameters()[u], reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p; }),
                             1e-12, 1e-12))
            << "unit " << u << " step " << step << " strategy " << static_cast<int>(strategy);
    }
    expect_close_dicts(fsdp.full_state_dict(/*rank0_only=*/false), ref->state_dict(), 1e-12);
  }
}

TEST(Fsdp, ShardsAreEqualSlicesOfTheZeroPaddedFlatParameter) {
  auto pg = dist_testing::group();
  auto net = make_net(3), ref = make_net(3);
  FSDP fsdp(*net, blocks(ShardingStrategy::FullShard));
  const int64_t n = pg->size();
  const std::vector<int64_t> numel{101, 72, 72};
  for (size_t u = 0; u < 3; ++u) {
    EXPECT_EQ(fsdp.parameters()[u].numel(), (numel[u] + n - 1) / n) << u;
    EXPECT_TRUE(fsdp.parameters()[u].is_leaf() && fsdp.parameters()[u].requires_grad());
    EXPECT_TRUE(equal(fsdp.parameters()[u], reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p; })));
  }
  // outside forward and backward the module holds 0-element placeholders
  for (const Tensor& p : net->parameters()) EXPECT_EQ(p.numel(), 0);
}

// Under FullShard a unit's gathered memory lives only through its forward and its backward;
// ShardGradOp keeps it from the forward to the end of the backward; NoShard always.
TEST(Fsdp, GatheredParametersLiveOnlyWhileTheirUnitRuns) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(4);
    FSDP fsdp(*net, blocks(strategy));
    std::weak_ptr<Storage> b1_memory;
    bool b1_full_in_b2 = false, b1_gathered_in_its_backward = false, embed_full_in_b2 = false;
    // registered after FSDP's hooks: the pre-hook sees the unit gathered
    net->b1.register_forward_pre_hook([&](nn::Module&, const Tensor&) { b1_memory = net->b1.fc.weight.storage(); });
    net->b1.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
      if (out.requires_grad())
        out.register_hook([&](const Tensor&) {
          b1_gathered_in_its_backward = fsdp.is_gathered(1) && net->b1.fc.weight.numel() == 64;
          return Tensor();
        });
    });
    net->b2.register_forward_pre_hook([&](nn::Module&, const Tensor&) {
      b1_full_in_b2 = net->b1.fc.weight.numel() == 64;
      embed_full_in_b2 = net->embed.weight.numel() == 48;  // the root is gathered through the whole forward
    });
    Batch b = local_batch(0, *pg);
    Tensor loss = F::mse_loss(fsdp(b.x), b.y);
    const bool full_shard = strategy == ShardingStrategy::FullShard;
    EXPECT_EQ(b1_full_in_b2, !full_shard);
    EXPECT_TRUE(embed_full_in_b2);
    // nothing (no saved tensor) holds a FullShard unit's gathered memory after its forward
    EXPECT_EQ(b1_memory.expired(), full_shard);
    for (size_t u = 0; u < 3; ++u) EXPECT_EQ(fsdp.is_gathered(u), !full_shard) << u;
    loss.backward();
    EXPECT_TRUE(b1_gathered_in_its_backward);
    const bool sharded = strategy != ShardingStrategy::NoShard;
    for (size_t u = 0; u < 3; ++u) EXPECT_EQ(fsdp.is_gathered(u), !sharded) << u;
    EXPECT_EQ(b1_memory.expired(), sharded);
    for (const Tensor& p : net->parameters()) {
      EXPECT_EQ(p.numel() == 0, sharded);
      EXPECT_FALSE(p.grad().defined());  // flattened into the shards' grads
    }
    for (const Tensor& s : fsdp.parameters()) EXPECT_TRUE(s.grad().defined());
    // without grad mode no unit keeps its parameters after its forward, even one that a forward
    // with grad had left gathered (ShardGradOp) for a backward
    Tensor pending = fsdp(b.x);
    for (size_t u = 0; u < 3; ++u) EXPECT_EQ(fsdp.is_gathered(u), !full_shard) << u;
    {
      NoGradGuard no_grad;
      fsdp(b.x);
    }
    for (size_t u = 0; u < 3; ++u) EXPECT_EQ(fsdp.is_gathered(u), !sharded) << u;
  }
}

// Three micro-batches, the first two under no_sync, give the gradient of the sum of the three
// micro-batch losses over the whole batch.
TEST(Fsdp, NoSyncAccumulationEqualsTheLargerBatch) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(6), ref = make_net(6);
    FSDP fsdp(*net, blocks(strategy));
    Tensor ref_loss = zeros({}, TensorOptions(kFloat64));
    for (int micro = 0; micro < 3; ++micro) {
      Batch b = local_batch(micro, *pg), whole = batch(micro);
      ref_loss = ref_loss + F::mse_loss((*ref)(whole.x), whole.y);
      if (micro < 2) {
        auto guard = fsdp.no_sync();
        F::mse_loss(fsdp(b.x), b.y).backward();
        for (const Tensor& s : fsdp.parameters()) EXPECT_FALSE(s.grad().defined());  // nothing reduced yet
      } else {
        F::mse_loss(fsdp(b.x), b.y).backward();
      }
    }
    ref_loss.backward();
    for (size_t u = 0; u < 3; ++u)
      EXPECT_TRUE(allclose(fsdp.parameters()[u].grad(),
                           reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p.grad(); }), 1e-12, 1e-13))
          << "unit " << u << " strategy " << static_cast<int>(strategy);
  }
}

// A backward that raises after some units were reduced leaves nothing behind: the next step is
// the plain model's first.
TEST(Fsdp, ABackwardThatRaisesMidwayLeavesTheNextStepExact) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(7), ref = make_net(7);
    FSDP fsdp(*net, blocks(strategy));
    bool fail = true;
    net->b1.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
      if (out.requires_grad())
        out.register_hook([&](const Tensor&) -> Tensor {
          if (fail) throw Error("injected");  // after b2's and the head's gradients
          return Tensor();
        });
    });
    Batch b = local_batch(0, *pg);
    EXPECT_THROW(F::mse_loss(fsdp(b.x), b.y).backward(), Error);
    fail = false;
    optim::AdamW opt(fsdp.parameters(), {.lr = 0.01}), ref_opt(ref->parameters(), {.lr = 0.01});
    fsdp_step(fsdp, opt, 0);
    reference_step(*ref, ref_opt, 0);
    expect_close_dicts(fsdp.full_state_dict(false), ref->state_dict(), 1e-12);
  }
}

TEST(Fsdp, ClipGradNormEqualsThePlainModelsClip) {
  auto pg = dist_testing::group();
  for (double norm_type : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
    for (ShardingStrategy strategy : all_strategies()) {
      auto net = make_net(8), ref = make_net(8);
      FSDP fsdp(*net, blocks(strategy));
      Batch b = local_batch(1, *pg), whole = batch(1);
      F::mse_loss(fsdp(b.x), b.y).backward();
      F::mse_loss((*ref)(whole.x), whole.y).backward();
      const double want = optim::clip_grad_norm_(ref->parameters(), 0.05, norm_type);
      const double got = fsdp.clip_grad_norm_(0.05, norm_type);
      EXPECT_NEAR(got, want, 1e-13 * want) << norm_type;
      ASSERT_GT(want, 0.05);  // the clip did scale
      for (size_t u = 0; u < 3; ++u)
        EXPECT_TRUE(allclose(fsdp.parameters()[u].grad(),
                             reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p.grad(); }), 1e-12, 1e-14))
            << "unit " << u << " norm " << norm_type;
    }
  }
}

TEST(Fsdp, SizeBasedPolicyWrapsChildrenBeforeParents) {
  dist_testing::group();
  auto net = make_net(1);
  FSDP fsdp(*net, {.auto_wrap_policy = dist::size_based_auto_wrap_policy(60)});
  // head (45) and embed (56) are below the threshold; each block's Linear (72) is wrapped, which
  // leaves the Block itself nothing to hold
  EXPECT_EQ(fsdp.unit_names(), (std::vector<std::string>{"", "b1.fc", "b2.fc"}));
}

// A projection over a weight it is given: registered in two modules, one tensor object.
struct TiedHead : nn::Module {
  Tensor weight;
  explicit TiedHead(const Tensor& w) { weight = register_parameter("weight", w); }
  Tensor forward(const Tensor& x) override { return F::linear(x, weight); }
};
struct TiedNet : nn::Module {
  nn::Linear embed{6, 6};
  Block mid;  // 8 wide: unused here, only a unit between the two
  TiedHead head{embed.weight};
  TiedNet() {
    register_module("embed", embed);
    register_module("mid", mid);
    register_module("head", head);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return head(tanh(embed(x))); }
};

TEST(Fsdp, BadWrappingRaises) {
  dist_testing::group();
  auto net = make_net(2), other = make_net(2);
  EXPECT_THROW(FSDP(*net, {.wrap_modules = {&other->b1}}), Error);  // not inside the wrapped module
  EXPECT_THROW(FSDP(*net, {.wrap_modules = {&net->b1, &net->b1}}), Error);
  EXPECT_THROW(FSDP(*net, {.wrap_modules = {net.get()}}), Error);  // the root is always the root unit
  {
    auto wrapped = make_net(2);
    FSDP outer(*wrapped, blocks(ShardingStrategy::FullShard));  // an inner wrapper is built first, not after
    EXPECT_TRUE(testing::throws_with([&] { FSDP(wrapped->b1); }, {"'<root>'", "already inside another"}));
  }
  {
    FSDP inner(net->b1);
    EXPECT_THROW(FSDP(net->b1), Error);  // nor wrap one module twice
  }
  // a tied weight whose two modules land in different units: in two units, or used outside its own
  for (auto wrap : {std::vector<int>{0, 1}, std::vector<int>{0}, std::vector<int>{1}}) {
    manual_seed(1);
    TiedNet tied;
    std::vector<nn::Module*> units;
    for (int k : wrap) units.push_back(k == 0 ? static_cast<nn::Module*>(&tied.embed) : &tied.head);
    EXPECT_TRUE(testing::throws_with([&] { FSDP(tied, {.wrap_modules = units}); }, {"must lie inside one unit"}));
  }
  // two parameters sharing memory (not one tensor): flattening would untie them
  manual_seed(1);
  auto shared = make_net(2);
  shared->head.bias.set_data(shared->embed.bias.narrow(0, 0, 5));
  EXPECT_TRUE(testing::throws_with([&] { FSDP(*shared, {}); }, {"sharing memory", "'head.bias'"}));
}

// A tie inside one unit is one parameter: trained as the plain model trains it.
TEST(Fsdp, ATiedWeightInsideOneUnitTrainsLikeOneProcess) {
  auto pg = dist_testing::group();
  manual_seed(9);
  TiedNet tied;
  manual_seed(9);
  TiedNet ref;
  FSDP fsdp(tied, {.wrap_modules = {&tied.mid}});
  optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref.parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    Batch b = local_batch(step, *pg), whole = batch(step);
    F::mse_loss(fsdp(b.x), b.x).backward();
    F::mse_loss(ref(whole.x), whole.x).backward();
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
  expect_close_dicts(fsdp.full_state_dict(false), ref.state_dict(), 1e-12);
}

// The root's forward uses a block's weight after the block has run.
struct OutsideUse : nn::Module {
  Block block;
  nn::Linear head{8, 5};
  OutsideUse() {
    register_module("block", block);
    register_module("head", head);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = embed(x);
    Tensor y = block(h);  // first: the block gathers its weight
    return head(y + F::linear(h, block.fc.weight));
  }
  static Tensor embed(const Tensor& x) { return cat({x, x.narrow(1, 0, 2)}, 1); }  // 6 -> 8 columns
};

// FullShard has freed the block's parameters when the root uses them: a clear error. ShardGradOp
// keeps them until the backward ends, so the use is the plain model's.
TEST(Fsdp, AParameterUsedOutsideItsUnitRaisesUnderFullShardAndWorksUnderShardGradOp) {
  auto pg = dist_testing::group();
  Batch b = local_batch(0, *pg);
  {
    manual_seed(3);
    OutsideUse net;
    FSDP fsdp(net, {.wrap_modules = {&net.block}});
    EXPECT_TRUE(testing::throws_with([&] { fsdp(b.x); }, {"used outside its unit"}));
  }
  manual_seed(3);
  OutsideUse net, ref;
  ref.load_state_dict(net.state_dict());
  FSDP fsdp(net, {.sharding_strategy = ShardingStrategy::ShardGradOp, .wrap_modules = {&net.block}});
  optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref.parameters(), {.lr = 0.1});
  for (int step = 0; step < 2; ++step) {
    Batch part = local_batch(step, *pg), all = batch(step);
    F::mse_loss(fsdp(part.x), part.y).backward();
    F::mse_loss(ref(all.x), all.y).backward();
    for (auto* o : {static_cast<optim::Optimizer*>(&opt), static_cast<optim::Optimizer*>(&ref_opt)}) {
      o->step();
      o->zero_grad();
    }
  }
  expect_close_dicts(fsdp.full_state_dict(false), ref.state_dict(), 1e-12);
}

// A unit of frozen parameters has a shard that needs no grad and is never reduced.
TEST(Fsdp, AFrozenUnitStaysAsItWasWhileTheRestTrains) {
  auto pg = dist_testing::group();
  auto net = make_net(12), ref = make_net(12);
  for (Net* n : {net.get(), ref.get()})
    for (const Tensor& p : n->b1.parameters()) p.requires_grad_(false);
  FSDP fsdp(*net, blocks(ShardingStrategy::FullShard));
  EXPECT_FALSE(fsdp.parameters()[1].requires_grad());
  optim::AdamW opt(fsdp.parameters(), {.lr = 0.01}), ref_opt(ref->parameters(), {.lr = 0.01});
  for (int step = 0; step < 3; ++step) {
    fsdp_step(fsdp, opt, step);
    reference_step(*ref, ref_opt, step);
  }
  EXPECT_FALSE(fsdp.parameters()[1].grad().defined());
  expect_close_dicts(fsdp.full_state_dict(false), ref->state_dict(), 1e-12);
}

TEST(Fsdp, FrozenAndTrainableParametersInOneUnitRaise) {
  dist_testing::group();
  auto net = make_net(2);
  net->head.bias.requires_grad_(false);
  EXPECT_THROW(FSDP(*net, blocks(ShardingStrategy::FullShard)), Error);
}

}  // namespace
}  // namespace strata
