// ShardedGradScaler under mpirun (2 and 4 ranks): an inf in one rank's shard of the gradient makes
// every rank skip the step and back the scale off alike (a plain GradScaler would step on the
// ranks whose shards are clean); without infs, FSDP training with the scaler equals the unscaled
// run (float64, power-of-two scales: to round-off); it covers ZeroRedundancyOptimizer without DDP;
// its state dict is a GradScaler's and round-trips.
#include <cmath>
#include <limits>

#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.detach().clone());
  return out;
}

void poison_last_rank(dist::ProcessGroup& pg, const Tensor& grad) {
  if (pg.rank() != pg.size() - 1) return;
  NoGradGuard no_grad;
  grad.narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
}

TEST(ShardedGradScaler, AnInfInOneRanksShardMakesEveryRankSkipAndBackOffTogether) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp}) {
    auto net = make_net(21);
    FSDP fsdp(*net, blocks(strategy));
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1});
    dist::ShardedGradScaler scaler({.init_scale = 1024.0, .growth_interval = 3});
    Batch b = local_batch(0, *pg);
    scaler.scale(F::mse_loss(fsdp(b.x), b.y)).backward();
    poison_last_rank(*pg, fsdp.parameters()[1].grad());
    const std::vector<Tensor> before = clones(fsdp.parameters());
    // every other rank's own gradients are finite: only the agreement makes it skip
    EXPECT_FALSE(scaler.step(opt));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 512.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
    for (size_t u = 0; u < before.size(); ++u) EXPECT_TRUE(equal(fsdp.parameters()[u], before[u])) << u;
    opt.zero_grad();

    // the verdict of an unscale_ that no step() read is agreed in update()
    scaler.scale(F::mse_loss(fsdp(b.x), b.y)).backward();
    poison_last_rank(*pg, fsdp.parameters()[2].grad());
    scaler.unscale_(opt);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 256.0);
    opt.zero_grad();

    // a clean step steps everywhere and counts towards growth
    scaler.scale(F::mse_loss(fsdp(b.x), b.y)).backward();
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    EXPECT_EQ(scaler.growth_tracker(), 1);
    EXPECT_FALSE(equal(fsdp.parameters()[0], before[0]));
    dist_testing::expect_same_on_every_rank(*pg, full({1}, scaler.get_scale(), TensorOptions(kFloat64)));
  }
}

TEST(ShardedGradScaler, WithoutInfsTrainingEqualsTheUnscaledRun) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(22), plain_net = make_net(22);
    FSDP fsdp(*net, blocks(strategy)), plain(*plain_net, blocks(strategy));
    optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
    optim::AdamW opt(fsdp.parameters(), adamw), plain_opt(plain.parameters(), adamw);
    dist::ShardedGradScaler scaler({.init_scale = 65536.0, .growth_interval = 2});
    for (int step = 0; step < 4; ++step) {
      Batch b = local_batch(step, *pg);
      scaler.scale(F::mse_loss(fsdp(b.x), b.y)).backward();
      scaler.unscale_(opt);
      const double norm = fsdp.clip_grad_norm_(0.5);
      EXPECT_TRUE(scaler.step(opt));
      scaler.update();
      opt.zero_grad();
      F::mse_loss(plain(b.x), b.y).backward();
      EXPECT_NEAR(plain.clip_grad_norm_(0.5), norm, 1e-12 * norm);
      plain_opt.step();
      plain_opt.zero_grad();
      for (size_t u = 0; u < 3; ++u)
        EXPECT_TRUE(allclose(fsdp.parameters()[u], plain.parameters()[u], 1e-12, 1e-12)) << u << " step " << step;
    }
    EXPECT_EQ(scaler.get_scale(), 65536.0 * 4);  // grown after steps 2 and 4
  }
}

TEST(ShardedGradScaler, CoversZeroRedundancyOptimizerWithoutDdp) {
  auto pg = dist_testing::group();
  auto net = make_net(23);  // the same model everywhere; each rank's gradient is its own batch's
  dist::ZeroRedundancyOptimizer<optim::SGD> opt(net->parameters(), {.lr = 0.1});
  dist::ShardedGradScaler scaler;
  Batch b = local_batch(0, *pg);
  scaler.scale(F::mse_loss((*net)(b.x), b.y)).backward();
  // the last rank's poisoned gradient belongs to a parameter another rank steps: without the
  // agreement the ranks would disagree on stepping (and ZeRO's broadcasts would not match)
  poison_last_rank(*pg, net->embed.weight.grad().view({-1}));
  const std::vector<Tensor> before = clones(net->parameters());
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  for (size_t k = 0; k < before.size(); ++k) EXPECT_TRUE(equal(net->parameters()[k], before[k])) << k;
}

TEST(ShardedGradScaler, StateDictIsAGradScalersAndRoundTrips) {
  auto pg = dist_testing::group();
  auto net = make_net(24);
  FSDP fsdp(*net, blocks(ShardingStrategy::FullShard));
  optim::SGD opt(fsdp.parameters(), {.lr = 0.01});
  amp::GradScalerOptions options{.init_scale = 256.0, .growth_factor = 4.0, .backoff_factor = 0.25,
                                 .growth_interval = 5};
  dist::ShardedGradScaler scaler(options);
  for (int step = 0; step < 3; ++step) {
    Batch b = local_batch(step, *pg);
    scaler.scale(F::mse_loss(fsdp(b.x), b.y)).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
  }
  const optim::StateDict dict = scaler.state_dict();
  EXPECT_EQ(dict.type, "GradScaler");
  EXPECT_EQ(dict.scalars.at("scale"), 256.0);
  EXPECT_EQ(dict.scalars.at("_growth_tracker"), 3.0);
  EXPECT_EQ(dict.scalars.at("growth_factor"), 4.0);
  EXPECT_EQ(dict.scalars.at("backoff_factor"), 0.25);
  EXPECT_EQ(dict.scalars.at("growth_interval"), 5.0);
  dist::ShardedGradScaler resumed;
  resumed.load_state_dict(dict);
  EXPECT_EQ(resumed.get_scale(), 256.0);
  EXPECT_EQ(resumed.growth_tracker(), 3);
  EXPECT_EQ(resumed.options().growth_factor, 4.0);
  amp::GradScaler plain;  // the two load each other's dicts
  plain.load_state_dict(dict);
  EXPECT_EQ(plain.state_dict().scalars, dict.scalars);
  dist::ShardedGradScaler from_plain;
  from_plain.load_state_dict(plain.state_dict());
  EXPECT_EQ(from_plain.state_dict().scalars, dict.scalars);
  optim::StateDict bad = dict;
  bad.scalars.erase("scale");
  EXPECT_THROW(from_plain.load_state_dict(bad), Error);
  EXPECT_EQ(from_plain.get_scale(), 256.0);
}

}  // namespace
}  // namespace strata
