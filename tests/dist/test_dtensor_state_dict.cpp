// Tensor-parallel training and state dicts under mpirun -np 4: an MLP parallelized colwise then
// rowwise, trained a few AdamW steps on its local shards, holds the blocks of the same MLP trained
// whole in one process; its full state dict equals the whole model's; full and sharded dicts load
// into fresh models parallelized over another mesh shape (and unparallelized) and give the same
// outputs; bad dicts raise on every rank.
#include "dist/dtensor_testing.h"

namespace strata {
namespace {

using namespace dtensor_testing;
using dist::Partial;
using dist::Replicate;
using dist::Shard;

const Tensor& input() {
  static const Tensor x = global_values({4, 6});
  return x;
}

// Three AdamW steps on sum(net(x) * w), whole or on this rank's shards.
void train(Mlp& m) {
  optim::AdamW opt(m.net.parameters(), {.lr = 0.05, .weight_decay = 0.1});
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    Tensor y = m.net(input());
    (y * global_values(y.shape(), 1.0 + step)).sum().backward();
    opt.step();
  }
}

void expect_blocks_of(Mlp& parallel, Mlp& whole, const dist::DeviceMesh& tp) {
  EXPECT_TRUE(close(parallel.fc(0).weight.detach(), block(whole.fc(0).weight, 0, tp)));
  EXPECT_TRUE(close(parallel.fc(0).bias.detach(), block(whole.fc(0).bias, 0, tp)));
  EXPECT_TRUE(close(parallel.fc(2).weight.detach(), block(whole.fc(2).weight, 1, tp)));
  EXPECT_TRUE(close(parallel.fc(2).bias.detach(), whole.fc(2).bias.detach()));
}

void expect_same_outputs(Mlp& a, Mlp& b) {
  NoGradGuard no_grad;
  EXPECT_TRUE(close(a.net(input()), b.net(input())));
}

const std::map<std::string, dist::ParallelStyle> kPlan{{"0", dist::ColwiseParallel{}},
                                                      {"2", dist::RowwiseParallel{}}};

TEST(DTensorStateDict, AdamWOnShardsEqualsTheWholeModel) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  for (int64_t hidden : {8, 10}) {  // 10: 3, 3, 3, 1 rows per rank
    Mlp whole(hidden), parallel(hidden);
    dist::parallelize_module(parallel.net, tp, kPlan);
    train(whole);
    train(parallel);
    EXPECT_FALSE(close(whole.fc(0).weight.detach(), Mlp(hidden).fc(0).weight.detach()));  // it moved
    expect_blocks_of(parallel, whole, tp);
    expect_same_outputs(parallel, whole);
  }
}

TEST(DTensorStateDict, FullDictRoundTripsOntoAnotherMeshShape) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  Mlp whole(10), parallel(10);
  dist::parallelize_module(parallel.net, tp, kPlan);
  train(whole);
  train(parallel);
  const nn::StateDict full = dist::get_model_state_dict(parallel.net, {.full_state_dict = true});
  const nn::StateDict want = whole.net.state_dict();
  ASSERT_EQ(full.size(), want.size());
  for (const auto& [key, value] : want) EXPECT_TRUE(close(full.at(key), value.detach())) << key;
  const nn::StateDict only0 = dist::get_model_state_dict(parallel.net, {.full_state_dict = true, .rank0_only = true});
  EXPECT_EQ(only0.size(), dist::get_rank() == 0 ? want.size() : 0u);
  EXPECT_EQ(dist::get_model_state_dict(parallel.net).at("0.weight").shape(), parallel.fc(0).weight.shape());

  Mlp fresh(10), plain(10);
  Generator g(9);
  for (const Tensor& p : fresh.net.parameters()) p.set_data(randn(p.shape(), TensorOptions(kFloat64), &g));
  dist::parallelize_module(fresh.net, mesh["tp"], kPlan);  // 2 ranks per layer now
  const nn::LoadResult loaded = dist::set_model_state_dict(fresh.net, full);
  EXPECT_TRUE(loaded.missing_keys.empty() && loaded.unexpected_keys.empty());
  expect_blocks_of(fresh, whole, mesh["tp"]);
  expect_same_outputs(fresh, whole);
  dist::set_model_state_dict(plain.net, full);  // no parallel layer: loaded as it is
  expect_same_outputs(plain, whole);
}

TEST(DTensorStateDict, ShardedDictKeepsPlacementsAndReshards) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  Mlp whole(10), parallel(10);
  dist::parallelize_module(parallel.net, tp, kPlan);
  train(whole);
  train(parallel);
  const dist::ShardedStateDict sharded = dist::get_sharded_model_state_dict(parallel.net);
  EXPECT_EQ(sharded.at("0.weight").placements(), Placements{Shard(0)});
  EXPECT_EQ(sharded.at("0.bias").placements(), Placements{Shard(0)});
  EXPECT_EQ(sharded.at("2.weight").placements(), Placements{Shard(1)});
  EXPECT_EQ(sharded.at("2.bias").placements(), Placements{Replicate()});
  EXPECT_EQ(sharded.at("0.weight").shape(), (Shape{10, 6}));
  EXPECT_TRUE(close(sharded.at("0.weight").to_local(), parallel.fc(0).weight.detach()));
  for (const auto& [key, value] : whole.net.state_dict())
    EXPECT_TRUE(close(sharded.at(key).full_tensor(), value.detach())) << key;

  Mlp same_mesh(10), other_mesh(10);
  dist::parallelize_module(same_mesh.net, tp, {{"0", dist::ColwiseParallel{}}, {"2", dist::ColwiseParallel{}}});
  dist::parallelize_module(other_mesh.net, mesh["tp"], kPlan);
  dist::set_model_state_dict(same_mesh.net, sharded);  // 2.weight: Shard(1) -> Shard(0), an all-to-all
  dist::set_model_state_dict(other_mesh.net, sharded);  // another mesh: gathered, then cut
  EXPECT_TRUE(close(same_mesh.fc(2).weight.detach(), block(whole.fc(2).weight, 0, tp)));
  expect_blocks_of(other_mesh, whole, mesh["tp"]);
  expect_same_outputs(other_mesh, whole);
}

TEST(DTensorStateDict, BadDictsRaiseOnEveryRank) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  Mlp whole(8), parallel(8);
  dist::parallelize_module(parallel.net, tp, kPlan);
  auto raises = [](auto&& call, std::initializer_list<const char*> needles) {
    EXPECT_TRUE(testing::throws_with(call, needles));
  };
  nn::StateDict wrong = whole.net.state_dict();
  wrong["0.weight"] = zeros({9, 6}, TensorOptions(kFloat64));
  raises([&] { dist::set_model_state_dict(parallel.net, wrong); }, {"set_model_state_dict", "0.weight", "[9, 6]"});
  nn::StateDict missing = whole.net.state_dict();
  missing.erase("2.bias");
  raises([&] { dist::set_model_state_dict(parallel.net, missing); }, {"2.bias"});
  EXPECT_NO_THROW(dist::set_model_state_dict(parallel.net, missing, {.strict = false}));
  raises([&] { dist::get_sharded_model_state_dict(whole.net); }, {"get_sharded_model_state_dict", "parallelized"});
  expect_blocks_of(parallel, whole, tp);  // nothing half-loaded, ranks still in step
  expect_same_outputs(parallel, whole);
}

}  // namespace
}  // namespace strata
