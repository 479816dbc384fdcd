// FullyShardedDataParallel's state under mpirun (2 and 4 ranks): the full state dict is the plain
// model's and loads back; the full optimizer state dict is a plain AdamW's over the model's
// parameters, and resuming from both continues bit for bit; sharded state dicts round-trip and
// refuse another world size, rank or model; summon_full_params writes changes back.
#include <unistd.h>

#include <filesystem>

#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;

TEST(FsdpState, FullStateDictIsThePlainModelsOnRankZeroAndLoadsBack) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(20), ref = make_net(20);
    FSDP fsdp(*net, blocks(strategy));
    nn::StateDict dict = fsdp.full_state_dict();
    if (pg->rank() == 0) {
      const nn::StateDict want = ref->state_dict();
      ASSERT_EQ(dict.size(), want.size());
      for (const auto& [name, t] : want) EXPECT_TRUE(equal(dict.at(name), t)) << name;
    } else {
      EXPECT_TRUE(dict.empty());
    }
    // another model's values load into the shards (every rank passes the same dict)
    auto other = make_net(21);
    fsdp.load_full_state_dict(other->state_dict());
    const nn::StateDict loaded = fsdp.full_state_dict(/*rank0_only=*/false);
    for (const auto& [name, t] : other->state_dict()) EXPECT_TRUE(equal(loaded.at(name), t)) << name;
    for (size_t u = 0; u < 3; ++u)
      EXPECT_TRUE(equal(fsdp.parameters()[u], reference_shard(fsdp, u, *other, [](const Tensor& p) { return p; })));
    // a dict of another model: every rank raises, nothing changes
    nn::StateDict bad = other->state_dict();
    bad.erase("b2.fc.bias");
    EXPECT_THROW(fsdp.load_full_state_dict(bad), Error);
    bad = other->state_dict();
    bad["head.weight"] = zeros({5, 9}, TensorOptions(kFloat64));
    EXPECT_THROW(fsdp.load_full_state_dict(bad), Error);
    expect_close_dicts(fsdp.full_state_dict(false), other->state_dict(), 0);
  }
}

TEST(FsdpState, FullOptimizerStateIsThePlainAdamWsAndResumesBitForBit) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(30), ref = make_net(30);
    FSDP fsdp(*net, blocks(strategy));
    optim::AdamWOptions adamw{.lr = 0.02, .weight_decay = 0.05};
    optim::AdamW opt(fsdp.parameters(), adamw), ref_opt(ref->parameters(), adamw);
    for (int step = 0; step < 3; ++step) {
      fsdp_step(fsdp, opt, step);
      reference_step(*ref, ref_opt, step);
    }
    const optim::StateDict full = fsdp.full_optim_state_dict(opt, /*rank0_only=*/false);
    const nn::StateDict model = fsdp.full_state_dict(false);
    // the plain AdamW's layout over net.parameters(): keys, steps and hyperparameters exactly
    const optim::StateDict want = ref_opt.state_dict();
    EXPECT_EQ(full.type, want.type);
    EXPECT_EQ(full.scalars, want.scalars);
    ASSERT_EQ(full.tensors.size(), want.tensors.size());
    for (const auto& [key, t] : want.tensors) {
      ASSERT_TRUE(full.tensors.count(key)) << key;
      EXPECT_TRUE(allclose(full.tensors.at(key), t, 1e-11, 1e-14)) << key;
    }
    EXPECT_TRUE(fsdp.full_optim_state_dict(opt).tensors.empty() == (pg->rank() != 0));
    // go on two steps; a fresh wrapper over another model, resumed from both dicts, takes the
    // same two steps bit for bit
    for (int step = 3; step < 5; ++step) fsdp_step(fsdp, opt, step);
    auto net2 = make_net(31);
    FSDP fsdp2(*net2, blocks(strategy));
    optim::AdamW opt2(fsdp2.parameters(), {.lr = 0.5});
    fsdp2.load_full_state_dict(model);
    fsdp2.load_full_optim_state_dict(opt2, full);
    EXPECT_EQ(opt2.param_groups()[0].options.lr, 0.02);
    for (int step = 3; step < 5; ++step) fsdp_step(fsdp2, opt2, step);
    for (size_t u = 0; u < 3; ++u) EXPECT_TRUE(equal(fsdp2.parameters()[u], fsdp.parameters()[u])) << u;
    // a dict of another model or optimizer: every rank raises, opt2 keeps its state
    optim::StateDict bad = full;
    bad.scalars["group.0.num_params"] = 3;
    EXPECT_THROW(fsdp2.load_full_optim_state_dict(opt2, bad), Error);
    bad = full;
    bad.tensors.erase("state.2.exp_avg");
    EXPECT_THROW(fsdp2.load_full_optim_state_dict(opt2, bad), Error);
    optim::SGD sgd(fsdp2.parameters(), {.lr = 0.1});
    EXPECT_THROW(fsdp2.load_full_optim_state_dict(sgd, full), Error);
    optim::AdamW stray(net2->parameters(), {});  // not over the shards
    EXPECT_THROW(fsdp2.full_optim_state_dict(stray), Error);
    const optim::StateDict after = fsdp2.full_optim_state_dict(opt2, false);
    EXPECT_EQ(after.scalars.at("state.0.step"), 5);
  }
}

// Groups of whole units: group g of the full dict holds the parameters of group g's units, in
// the module's order, as a plain AdamW with those groups writes it.
TEST(FsdpState, FullOptimizerStateKeepsTheGroupsOfUnits) {
  auto pg = dist_testing::group();
  auto net = make_net(35), ref = make_net(35);
  FSDP fsdp(*net, blocks(ShardingStrategy::ShardGradOp));
  const auto shards = fsdp.parameters();
  using G = optim::AdamW::Group;
  optim::AdamW opt({G({shards[0]}, {.lr = 0.01}), G({shards[1], shards[2]}, {.lr = 0.03, .weight_decay = 0})});
  auto params = [&](std::initializer_list<nn::Module*> ms) {
    std::vector<Tensor> out;
    for (nn::Module* m : ms)
      for (const Tensor& p : m->parameters()) out.push_back(p);
    return out;
  };
  optim::AdamW ref_opt({G(params({&ref->embed, &ref->head}), {.lr = 0.01}),
                        G(params({&ref->b1, &ref->b2}), {.lr = 0.03, .weight_decay = 0})});
  for (int step = 0; step < 2; ++step) {
    fsdp_step(fsdp, opt, step);
    reference_step(*ref, ref_opt, step);
  }
  const optim::StateDict got = fsdp.full_optim_state_dict(opt, false), want = ref_opt.state_dict();
  EXPECT_EQ(got.scalars, want.scalars);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [key, t] : want.tensors) EXPECT_TRUE(allclose(got.tensors.at(key), t, 1e-11, 1e-14)) << key;
  expect_close_dicts(fsdp.full_state_dict(false), ref->state_dict(), 1e-12);
}

// io checkpoints hold plain models and optimizers: the full dicts go into plain copies, which
// rank 0 saves; every rank reads the file back and resumes bit for bit.
// Adam8bit keeps one quantization scale per block of the flat shard: no plain layout exists, so
// the full optimizer state dict refuses it on every rank instead of cutting the scales wrongly.
TEST(FsdpState, FullOptimizerStateRefusesStateLaidOverTheShardInBlocks) {
  auto pg = dist_testing::group();
  auto net = make_net(60);
  FSDP fsdp(*net, blocks(ShardingStrategy::FullShard));
  optim::Adam8bit opt(fsdp.parameters(), {.lr = 1e-3, .min_8bit_size = 1, .block_size = 4});
  fsdp_step(fsdp, opt, 0);
  try {
    fsdp.full_optim_state_dict(opt);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg_absmax"), std::string::npos) << e.what();
  }
}

TEST(FsdpState, ResumesThroughAnIoCheckpointOfThePlainModelAndOptimizer) {
  auto pg = dist_testing::group();
  auto net = make_net(60);
  FSDP fsdp(*net, blocks(ShardingStrategy::FullShard));
  optim::AdamW opt(fsdp.parameters(), {.lr = 0.03});
  for (int step = 0; step < 2; ++step) fsdp_step(fsdp, opt, step);
  const nn::StateDict model = fsdp.full_state_dict();
  const optim::StateDict state = fsdp.full_optim_state_dict(opt);
  Tensor id = full({1}, static_cast<int64_t>(::getpid()), TensorOptions(kInt64));
  pg->broadcast(id, 0)->wait();
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("strata_fsdp_{}.ckpt", id.item<int64_t>())).string();
  if (pg->rank() == 0) {
    auto plain = make_net(0);
    plain->load_state_dict(model);
    optim::AdamW plain_opt(plain->parameters(), {});
    plain_opt.load_state_dict(state);
    io::save_checkpoint(path, {.model = plain.get(), .optimizer = &plain_opt}, {.step = 2});
  }
  pg->barrier()->wait();
  auto plain = make_net(1);
  optim::AdamW plain_opt(plain->parameters(), {});
  io::TrainingState resumed{.model = plain.get(), .optimizer = &plain_opt};
  EXPECT_EQ(io::load_checkpoint(path, resumed).step, 2);
  pg->barrier()->wait();
  if (pg->rank() == 0) std::filesystem::remove(path);
  auto net2 = make_net(61);
  FSDP fsdp2(*net2, blocks(ShardingStrategy::FullShard));
  optim::AdamW opt2(fsdp2.parameters(), {});
  fsdp2.load_full_state_dict(plain->state_dict());
  fsdp2.load_full_optim_state_dict(opt2, plain_opt.state_dict());
  for (int step = 2; step < 4; ++step) {
    fsdp_step(fsdp, opt, step);
    fsdp_step(fsdp2, opt2, step);
  }
  for (size_t u = 0; u < 3; ++u) EXPECT_TRUE(equal(fsdp2.parameters()[u], fsdp.parameters()[u])) << u;
}

TEST(FsdpState, ShardedStateDictRoundTripsAndRefusesAnotherLayout) {
  auto pg = dist_testing::group();
  auto net = make_net(40), ref = make_net(41);
  FSDP fsdp(*net, blocks(ShardingStrategy::FullShard));
  nn::StateDict saved;  // copied, as a file would keep it: the dict aliases the shards
  for (const auto& [k, t] : fsdp.sharded_state_dict()) saved[k] = t.clone();
  EXPECT_EQ(saved.at("_fsdp.world_size").item<int64_t>(), pg->size());
  EXPECT_EQ(saved.at("_fsdp.unit.0.numel").item<int64_t>(), 101);
  std::vector<Tensor> before;
  for (const Tensor& s : fsdp.parameters()) before.push_back(s.clone());
  fsdp.load_full_state_dict(ref->state_dict());  // changes every shard
  auto refused = [&](const char* key, Tensor value) {
    nn::StateDict bad = saved;
    bad[key] = value;
    EXPECT_THROW(fsdp.load_sharded_state_dict(bad), Error) << key;
  };
  const TensorOptions i64(kInt64);
  refused("_fsdp.world_size", full({}, pg->size() * 2, i64));   // saved by another world size
  refused("_fsdp.rank", full({}, (pg->rank() + 1) % pg->size(), i64));
  refused("_fsdp.unit.1.numel", full({}, 73, i64));             // another model
  refused("_fsdp.unit.2.shard", zeros({3}, TensorOptions(kFloat64)));
  refused("_fsdp.unit.3.shard", zeros({1}, TensorOptions(kFloat64)));  // a unit this wrapper lacks
  for (size_t u = 0; u < 3; ++u)  // nothing half-written: the shards still hold ref's values
    EXPECT_TRUE(equal(fsdp.parameters()[u], reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p; }))) << u;
  fsdp.load_sharded_state_dict(saved);
  for (size_t u = 0; u < 3; ++u) EXPECT_TRUE(equal(fsdp.parameters()[u], before[u])) << u;
}

TEST(FsdpState, SummonFullParamsShowsAndWritesBackTheParameters) {
  dist_testing::group();
  auto net = make_net(50), ref = make_net(50);
  FSDP fsdp(*net, blocks(ShardingStrategy::FullShard));
  {
    auto full_params = fsdp.summon_full_params();
    for (size_t u = 0; u < 3; ++u) EXPECT_TRUE(fsdp.is_gathered(u));
    EXPECT_TRUE(equal(net->b2.fc.weight, ref->b2.fc.weight));
    EXPECT_THROW(fsdp(zeros({2, 6}, TensorOptions(kFloat64))), Error);  // no forward inside
    NoGradGuard no_grad;
    net->b2.fc.weight.mul_(2.0);
  }
  for (size_t u = 0; u < 3; ++u) EXPECT_FALSE(fsdp.is_gathered(u));
  EXPECT_TRUE(equal(fsdp.full_state_dict(false).at("b2.fc.weight"), ref->b2.fc.weight * 2.0));
  {
    auto read_only = fsdp.summon_full_params(/*writeback=*/false);
    NoGradGuard no_grad;
    net->b2.fc.weight.zero_();
  }
  EXPECT_TRUE(equal(fsdp.full_state_dict(false).at("b2.fc.weight"), ref->b2.fc.weight * 2.0));
}

}  // namespace
}  // namespace strata
