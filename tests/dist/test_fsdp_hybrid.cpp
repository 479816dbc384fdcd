// FullyShardedDataParallel's hybrid strategies under mpirun (2 and 4 ranks): for every grid of
// replicas x shards, from a 2-d device mesh, explicit groups or the split by node, training equals
// one process training the plain model on the whole batch (float64), the replicas hold the same
// shards, the state dicts are the plain model's and optimizer's and load at another layout; groups
// that do not form a grid raise on every rank.
#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;

// Every (replicas, shards) grid of the world's ranks.
std::vector<std::vector<int>> grids(int world) {
  std::vector<std::vector<int>> shapes;
  for (int r = 1; r <= world; ++r)
    if (world % r == 0) shapes.push_back({r, world / r});
  return shapes;
}

dist::FSDPOptions hybrid(ShardingStrategy s, const dist::DeviceMesh& mesh) {
  dist::FSDPOptions o = blocks(s);
  o.device_mesh = mesh;
  return o;
}

const ShardingStrategy kHybrids[] = {ShardingStrategy::HybridShard, ShardingStrategy::HybridShardZero2};

void expect_trains_as_the_plain_model(const dist::FSDPOptions& options, uint64_t seed, const std::string& what) {
  auto pg = dist_testing::group();
  auto net = make_net(seed + static_cast<uint64_t>(pg->rank())), ref = make_net(seed);  // rank 0's state everywhere
  FSDP fsdp(*net, options);
  optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
  optim::AdamW opt(fsdp.parameters(), adamw), ref_opt(ref->parameters(), adamw);
  for (int step = 0; step < 4; ++step) {
    fsdp_step(fsdp, opt, step);
    reference_step(*ref, ref_opt, step);
    for (size_t u = 0; u < 3; ++u) {
      EXPECT_TRUE(allclose(fsdp.parameters()[u], reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p; }),
                           1e-12, 1e-12))
          << what << " unit " << u << " step " << step;
      dist_testing::expect_same_on_every_rank(*fsdp.replicate_group(), fsdp.parameters()[u]);
      EXPECT_FALSE(fsdp.is_gathered(u)) << what;
    }
  }
  expect_close_dicts(fsdp.full_state_dict(/*rank0_only=*/false), ref->state_dict(), 1e-12);
  EXPECT_EQ(fsdp.full_state_dict().empty(), pg->rank() != 0) << what;  // global rank 0 only
}

TEST(FsdpHybrid, TrainingOnEveryGridOfAMeshEqualsOneProcessOnTheWholeBatch) {
  auto pg = dist_testing::group();
  for (const auto& shape : grids(pg->size()))
    for (ShardingStrategy s : kHybrids) {
      dist::DeviceMesh mesh(shape, {"replicate", "shard"});
      const std::string what = fmt::format("grid {}x{} strategy {}", shape[0], shape[1], static_cast<int>(s));
      auto probe_net = make_net(1);
      FSDP probe(*probe_net, hybrid(s, mesh));
      EXPECT_EQ(probe.process_group()->size(), shape[1]) << what;
      EXPECT_EQ(probe.replicate_group()->size(), shape[0]) << what;
      EXPECT_EQ(probe.parameters()[1].numel(), (72 + shape[1] - 1) / shape[1]) << what;
      expect_trains_as_the_plain_model(hybrid(s, mesh), 40, what);
    }
}

TEST(FsdpHybrid, ExplicitGroupsAndTheSplitByNodeTrainAsThePlainModel) {
  auto pg = dist_testing::group();
  const int w = pg->size(), shards = w / 2;  // replicas of `shards` consecutive ranks
  std::vector<std::shared_ptr<dist::ProcessGroup>> shard_groups, replicate_groups;
  for (int r = 0; r < 2; ++r) {
    std::vector<int> ranks;
    for (int s = 0; s < shards; ++s) ranks.push_back(r * shards + s);
    shard_groups.push_back(dist::new_group(ranks));
  }
  for (int s = 0; s < shards; ++s) replicate_groups.push_back(dist::new_group({s, shards + s}));
  for (ShardingStrategy s : kHybrids) {
    dist::FSDPOptions o = blocks(s);
    o.process_group = shard_groups[static_cast<size_t>(pg->rank() / shards)];
    o.replicate_group = replicate_groups[static_cast<size_t>(pg->rank() % shards)];
    expect_trains_as_the_plain_model(o, 50, "explicit groups");
    // neither given: the ranks of one node (all of them, on one machine) shard, one replica
    auto by_node_net = make_net(1);
    FSDP by_node(*by_node_net, blocks(s));
    EXPECT_EQ(by_node.process_group()->size(), w);
    EXPECT_EQ(by_node.replicate_group()->size(), 1);
    expect_trains_as_the_plain_model(blocks(s), 60, "split by node");
  }
}

TEST(FsdpHybrid, ClippingTakesTheNormOfTheWholeModelsGradient) {
  auto pg = dist_testing::group();
  dist::DeviceMesh mesh({2, pg->size() / 2}, {"replicate", "shard"});
  auto net = make_net(70), ref = make_net(70);
  FSDP fsdp(*net, hybrid(ShardingStrategy::HybridShard, mesh));
  Batch b = local_batch(0, *pg), whole = batch(0);
  F::mse_loss(fsdp(b.x), b.y).backward();
  F::mse_loss((*ref)(whole.x), whole.y).backward();
  const double want = optim::clip_grad_norm_(ref->parameters(), 0.01);
  EXPECT_NEAR(fsdp.clip_grad_norm_(0.01), want, 1e-12);
  for (size_t u = 0; u < 3; ++u)
    EXPECT_TRUE(allclose(fsdp.parameters()[u].grad(),
                         reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p.grad(); }), 1e-12, 1e-14));
}

// no_sync on a hybrid wrapper holds back both groups' reductions; the next synced backward
// reduces the accumulated gradients once: the mean over all ranks of the two steps' sum.
TEST(FsdpHybrid, NoSyncAccumulatesAndTheNextBackwardAveragesOverEveryRankOnce) {
  auto pg = dist_testing::group();
  for (ShardingStrategy s : kHybrids) {
    dist::DeviceMesh mesh({2, pg->size() / 2}, {"replicate", "shard"});
    auto net = make_net(75), ref = make_net(75);
    FSDP fsdp(*net, hybrid(s, mesh));
    {
      auto guard = fsdp.no_sync();
      Batch b = local_batch(0, *pg);
      F::mse_loss(fsdp(b.x), b.y).backward();
      for (const Tensor& shard : fsdp.parameters()) EXPECT_FALSE(shard.grad().defined());
    }
    Batch b = local_batch(1, *pg);
    F::mse_loss(fsdp(b.x), b.y).backward();
    for (int step = 0; step < 2; ++step) {
      Batch whole = batch(step);
      F::mse_loss((*ref)(whole.x), whole.y).backward();
    }
    for (size_t u = 0; u < 3; ++u) {
      EXPECT_TRUE(allclose(fsdp.parameters()[u].grad(),
                           reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p.grad(); }), 1e-12, 1e-14))
          << static_cast<int>(s) << " unit " << u;
      EXPECT_FALSE(fsdp.is_gathered(u));
    }
  }
}

// The full dicts move between grids and to FullShard over the world; the sharded dict is one
// shard group's: it loads on any replica, or into FullShard over a group of the shard group's size.
TEST(FsdpHybrid, StateDictsAreThePlainModelsAndLoadAtAnotherLayout) {
  auto pg = dist_testing::group();
  const int w = pg->size();
  dist::DeviceMesh mesh({2, w / 2}, {"replicate", "shard"});
  auto net = make_net(80), ref = make_net(80);
  FSDP fsdp(*net, hybrid(ShardingStrategy::HybridShard, mesh));
  optim::AdamWOptions adamw{.lr = 0.02, .weight_decay = 0.05};
  optim::AdamW opt(fsdp.parameters(), adamw), ref_opt(ref->parameters(), adamw);
  for (int step = 0; step < 3; ++step) {
    fsdp_step(fsdp, opt, step);
    reference_step(*ref, ref_opt, step);
  }
  const optim::StateDict full = fsdp.full_optim_state_dict(opt, /*rank0_only=*/false);
  EXPECT_EQ(fsdp.full_optim_state_dict(opt).tensors.empty(), pg->rank() != 0);
  const optim::StateDict want = ref_opt.state_dict();
  EXPECT_EQ(full.scalars, want.scalars);
  for (const auto& [key, t] : want.tensors) EXPECT_TRUE(allclose(full.tensors.at(key), t, 1e-11, 1e-14)) << key;
  const nn::StateDict model = fsdp.full_state_dict(false);
  // another layout resumes from the two full dicts and follows the plain model
  for (const dist::FSDPOptions& other :
       {blocks(ShardingStrategy::FullShard), hybrid(ShardingStrategy::HybridShardZero2,
                                                    dist::DeviceMesh({w, 1}, {"replicate", "shard"}))}) {
    auto net2 = make_net(81);
    FSDP fsdp2(*net2, other);
    optim::AdamW opt2(fsdp2.parameters(), {.lr = 0.5});
    fsdp2.load_full_state_dict(model);
    fsdp2.load_full_optim_state_dict(opt2, full);
    auto ref2 = make_net(81);
    ref2->load_state_dict(model);
    optim::AdamW ref_opt2(ref2->parameters(), adamw);
    ref_opt2.load_state_dict(want);
    for (int step = 3; step < 5; ++step) {
      fsdp_step(fsdp2, opt2, step);
      reference_step(*ref2, ref_opt2, step);
    }
    expect_close_dicts(fsdp2.full_state_dict(false), ref2->state_dict(), 1e-11);
  }
  // a bad dict raises on every rank, nothing changes
  nn::StateDict bad = model;
  bad.erase("b1.fc.weight");
  EXPECT_THROW(fsdp.load_full_state_dict(bad), Error);
  expect_close_dicts(fsdp.full_state_dict(false), model, 0);
  // the sharded dict: the shard group's size and rank
  const nn::StateDict sharded = fsdp.sharded_state_dict();
  EXPECT_EQ(sharded.at("_fsdp.world_size").item<int64_t>(), w / 2);
  EXPECT_EQ(sharded.at("_fsdp.rank").item<int64_t>(), fsdp.process_group()->rank());
  nn::StateDict copy;
  for (const auto& [k, t] : sharded) copy[k] = t.clone();
  auto net3 = make_net(82);
  FSDP fsdp3(*net3, {.process_group = fsdp.process_group(), .auto_wrap_policy = dist::module_wrap_policy<Block>()});
  fsdp3.load_sharded_state_dict(copy);
  for (size_t u = 0; u < 3; ++u) EXPECT_TRUE(equal(fsdp3.parameters()[u], fsdp.parameters()[u]));
  if (w > 2) {
    auto net4 = make_net(83);
    FSDP world(*net4, blocks(ShardingStrategy::FullShard));
    EXPECT_THROW(world.load_sharded_state_dict(copy), Error);  // saved by groups of w / 2
  }
}

TEST(FsdpHybrid, GroupsThatDoNotFormAGridRaiseOnEveryRank) {
  auto pg = dist_testing::group();
  const int w = pg->size();
  auto net = make_net(90);
  auto expect_error = [&](const dist::FSDPOptions& o, const std::string& words) {
    try {
      FSDP fsdp(*net, o);
      ADD_FAILURE() << "no error, expected one naming: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  dist::DeviceMesh line({w}), square({2, w / 2});
  expect_error(hybrid(ShardingStrategy::HybridShard, line), "needs a 2-d device_mesh");
  expect_error(hybrid(ShardingStrategy::FullShard, square), "needs a 1-d device_mesh");
  dist::FSDPOptions o = blocks(ShardingStrategy::FullShard);
  o.replicate_group = pg;
  expect_error(o, "replicate_group is for HybridShard");
  o.sharding_strategy = ShardingStrategy::HybridShard;
  expect_error(o, "without process_group");
  o.process_group = pg;  // the world twice: they cross at every rank
  expect_error(o, "share " + std::to_string(w) + " ranks");
  o.device_mesh = square;
  expect_error(o, "not both");
  if (w == 4) {
    // shard groups of 3 and 1 ranks: sizes that do not divide the world into a grid
    auto s012 = dist::new_group({0, 1, 2}), s3 = dist::new_group({3});
    auto r03 = dist::new_group({0, 3}), r1 = dist::new_group({1}), r2 = dist::new_group({2});
    dist::FSDPOptions uneven = blocks(ShardingStrategy::HybridShard);
    uneven.process_group = pg->rank() == 3 ? s3 : s012;
    uneven.replicate_group = pg->rank() == 0 || pg->rank() == 3 ? r03 : (pg->rank() == 1 ? r1 : r2);
    expect_error(uneven, "do not form a grid");
    // replicas that hold different shards: {0, 1} x {2, 3} shards replicated as {0, 3} and {1, 2}
    auto s01 = dist::new_group({0, 1}), s23 = dist::new_group({2, 3}), r12 = dist::new_group({1, 2});
    dist::FSDPOptions crossed = blocks(ShardingStrategy::HybridShardZero2);
    crossed.process_group = pg->rank() < 2 ? s01 : s23;
    crossed.replicate_group = pg->rank() == 0 || pg->rank() == 3 ? r03 : r12;
    expect_error(crossed, "must hold the same shard");
  }
  // nothing hangs: the ranks go on together
  FSDP fine(*net, hybrid(ShardingStrategy::HybridShard, square));
  EXPECT_EQ(fine.replicate_group()->size(), 2);
}

}  // namespace
}  // namespace strata
