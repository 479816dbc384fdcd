// ZeroRedundancyOptimizer::overlap_with_ddp under mpirun (2 and 4 ranks): with DDP's buckets
// forced small (a parameter or two each), the AdamW steps run inside the backward, bucket by
// bucket, and the parameters a backward returns are bit for bit those of the same ZeRO stepped
// after the backward (a twin under its own DDP), identical on every rank, and to 1e-12 one
// process's AdamW on the whole batch; a scheduler's lr reaches the overlapped steps; the
// consolidated state is the twin's; step() raises, and a parameter outside DDP is refused.
#include "dist/dist_testing.h"

namespace strata {
namespace {

namespace F = nn::functional;
using Zero = dist::ZeroRedundancyOptimizer<optim::AdamW>;

struct Chain : nn::Module {
  nn::Linear first{6, 8}, middle{8, 8}, last{8, 5};
  Chain() {
    register_module("first", first);
    register_module("middle", middle);
    register_module("last", last);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return last(tanh(middle(tanh(first(x))))); }
};

std::unique_ptr<Chain> make_chain(uint64_t seed) {
  manual_seed(seed);
  return std::make_unique<Chain>();
}

std::vector<Tensor> snapshot(nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(ZeroOverlap, StepsInsideTheBackwardLikeTheStepAfterIt) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  // different seeds per rank: DDP gives every rank rank 0's parameters (seed 100)
  auto net = make_chain(100 + static_cast<uint64_t>(r)), twin = make_chain(100 + static_cast<uint64_t>(r));
  auto ref = make_chain(100);
  dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 1e-4}), twin_ddp(*twin, {.bucket_cap_mb = 1e-4});
  ASSERT_GE(ddp.bucket_assignment().size(), 4u);
  const optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
  Zero opt(net->parameters(), adamw), twin_opt(twin->parameters(), adamw);
  optim::AdamW ref_opt(ref->parameters(), adamw);
  opt.overlap_with_ddp(ddp);
  auto decay = [](int64_t step) { return 1.0 / (1.0 + static_cast<double>(step)); };
  optim::LambdaLR sched(opt, decay), twin_sched(twin_opt, decay), ref_sched(ref_opt, decay);
  const int64_t rows = 8 / n;
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    Generator gen(31 + static_cast<uint64_t>(step));
    Tensor x = randn({8, 6}, TensorOptions(kFloat64), &gen), y = randn({8, 5}, TensorOptions(kFloat64), &gen);
    Tensor mine_x = x.narrow(0, r * rows, rows), mine_y = y.narrow(0, r * rows, rows);
    auto before = snapshot(*net);
    F::mse_loss(ddp(mine_x), mine_y).backward();  // the step happens here
    auto after = net->parameters();
    for (size_t k = 0; k < after.size(); ++k) EXPECT_FALSE(equal(after[k], before[k])) << "param " << k;
    opt.zero_grad();
    F::mse_loss(twin_ddp(mine_x), mine_y).backward();
    twin_opt.step();
    twin_opt.zero_grad();
    F::mse_loss((*ref)(x), y).backward();  // the mean of the ranks' mean losses is the batch's
    ref_opt.step();
    ref_opt.zero_grad();
    sched.step();
    twin_sched.step();
    ref_sched.step();
    auto twins = twin->parameters(), refs = ref->parameters();
    for (size_t k = 0; k < after.size(); ++k) {
      EXPECT_TRUE(equal(after[k], twins[k])) << "param " << k << " against the step after the backward";
      EXPECT_TRUE(allclose(after[k], refs[k], 1e-12, 1e-13)) << "param " << k << " against one process";
      Tensor root = after[k].detach().clone();
      pg->broadcast(root, 0)->wait();
      EXPECT_TRUE(equal(root, after[k])) << "param " << k << " differs from rank 0's";
    }
  }
  opt.consolidate_state_dict(0);
  twin_opt.consolidate_state_dict(0);
  if (r == 0) {
    const optim::StateDict got = opt.state_dict(), want = twin_opt.state_dict();
    EXPECT_EQ(got.scalars, want.scalars);
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (const auto& [key, t] : want.tensors) EXPECT_TRUE(equal(got.tensors.at(key), t)) << key;
  }
  EXPECT_TRUE(testing::throws_with([&] { opt.step(); }, {"[ZeroRedundancyOptimizer]", "overlap_with_ddp"}));
}

TEST(ZeroOverlap, ParametersOutsideDDPAreRefused) {
  auto pg = dist_testing::group();
  auto net = make_chain(7);
  dist::DistributedDataParallel ddp(*net);
  Tensor extra = zeros({3}, TensorOptions(kFloat64)).requires_grad_();
  std::vector<Tensor> params = net->parameters();
  params.push_back(extra);
  Zero opt(params, {.lr = 0.01});
  EXPECT_TRUE(testing::throws_with([&] { opt.overlap_with_ddp(ddp); }, {"parameter 6", "none of DDP's buckets"}));
  opt.step();  // not overlapping: step() still works
  // a group added after overlap_with_ddp with a parameter outside DDP: the next backward raises
  // (on every rank: each sees it) before any parameter changes
  Zero overlapped(net->parameters(), {.lr = 0.01});
  overlapped.overlap_with_ddp(ddp);
  overlapped.add_param_group(Zero::Group({extra}, {.lr = 0.01}));
  auto before = snapshot(*net);
  Tensor x = ones({2, 6}, TensorOptions(kFloat64)), y = zeros({2, 5}, TensorOptions(kFloat64));
  EXPECT_TRUE(testing::throws_with([&] { F::mse_loss(ddp(x), y).backward(); },
                                   {"parameter 6", "none of DDP's buckets"}));
  auto after = net->parameters();
  for (size_t k = 0; k < after.size(); ++k) EXPECT_TRUE(equal(after[k], before[k])) << "param " << k;
}

// A rank whose wrapped optimizer raises midway through an overlapped step (after some of its
// parameters moved): the backward raises on every rank, none waits forever on a broadcast the
// failing rank never started, the replicas stay equal, and the next backward steps normally.
TEST(ZeroOverlap, AFailureInsideAnOverlappedStepRaisesOnEveryRank) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_chain(13);
  dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 1e-4});
  dist::ZeroRedundancyOptimizer<dist_testing::FlakySGD> opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  opt.overlap_with_ddp(ddp);
  Tensor x = randn({4, 6}, TensorOptions(kFloat64)), y = randn({4, 5}, TensorOptions(kFloat64));
  auto train = [&] { F::mse_loss(ddp(x), y).backward(); };
  train();
  opt.zero_grad();
  if (r == n - 1) {  // fails at its last parameter: the earlier ones (if any) have stepped
    ASSERT_NE(opt.local_optimizer(), nullptr);
    opt.local_optimizer()->fail = true;
    opt.local_optimizer()->fail_at = static_cast<int>(opt.local_optimizer()->param_groups()[0].params.size());
  }
  auto before = snapshot(*net);
  EXPECT_TRUE(testing::throws_with(train, {r == n - 1 ? "flaky update" : "step failed on rank"}));
  bool moved = false;
  for (size_t k = 0; k < before.size(); ++k) {
    dist_testing::expect_same_on_every_rank(*pg, net->parameters()[k]);
    moved = moved || !equal(net->parameters()[k], before[k]);
  }
  EXPECT_TRUE(moved);  // the shards of the ranks that did not fail
  if (r == n - 1) opt.local_optimizer()->fail = false;
  opt.zero_grad();
  before = snapshot(*net);
  train();
  for (size_t k = 0; k < before.size(); ++k) {
    dist_testing::expect_same_on_every_rank(*pg, net->parameters()[k]);
    EXPECT_FALSE(equal(net->parameters()[k], before[k])) << "param " << k;
  }
}

// What step() checks before any parameter changes (here an invalid lr on the last rank alone)
// raises on every rank from the backward; the failing rank's shard keeps its values and every
// rank receives them.
TEST(ZeroOverlap, BadOptionsOnOneRankRaiseOnEveryRank) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_chain(17);
  dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 1e-4});
  Zero opt(net->parameters(), {.lr = 0.01});
  opt.overlap_with_ddp(ddp);
  auto before = snapshot(*net);
  if (r == n - 1) opt.param_groups()[0].options.lr = -1;
  Tensor x = randn({4, 6}, TensorOptions(kFloat64)), y = randn({4, 5}, TensorOptions(kFloat64));
  EXPECT_TRUE(testing::throws_with([&] { F::mse_loss(ddp(x), y).backward(); },
                                   {r == n - 1 ? "lr" : "step failed on rank"}));
  auto params = net->parameters();
  for (size_t k = 0; k < params.size(); ++k) {
    dist_testing::expect_same_on_every_rank(*pg, params[k]);
    if (opt.rank_of(params[k]) == n - 1) EXPECT_TRUE(equal(params[k], before[k])) << "param " << k;
  }
}

// The optimizer may be destroyed before the DDP wrapper: the backward then only reduces.
TEST(ZeroOverlap, AnOptimizerGoneFirstLeavesDDPAlone) {
  auto pg = dist_testing::group();
  auto net = make_chain(9);
  dist::DistributedDataParallel ddp(*net);
  { Zero(net->parameters(), {.lr = 0.01}).overlap_with_ddp(ddp); }
  auto before = snapshot(*net);
  F::mse_loss(ddp(ones({2, 6}, TensorOptions(kFloat64))), zeros({2, 5}, TensorOptions(kFloat64))).backward();
  auto after = net->parameters();
  for (size_t k = 0; k < after.size(); ++k) {
    EXPECT_TRUE(equal(after[k], before[k]));
    EXPECT_TRUE(after[k].grad().defined());
  }
}

}  // namespace
}  // namespace strata
