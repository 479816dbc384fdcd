// FullyShardedDataParallel's MixedPrecision under mpirun (2 and 4 ranks), on the CPU: the forward
// equals the plain model run with its weights rounded to param_dtype; the gradient reaching each
// shard is every rank's local low-precision gradient averaged in reduce_dtype (against the mean
// taken in float64 here, within reduce_dtype's rounding); the shards (masters) stay float32 and,
// with ShardedGradScaler, train as a float64 simulation of the plain model within bfloat16's
// tolerance; state dicts hold the float32 masters and buffers in their own dtype.
#include <map>

#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;
using dist::MixedPrecision;

// The plain model with seed's weights, rounded through float32 to `dtype` as FSDP's casts do.
std::unique_ptr<Net> net_in(uint64_t seed, DType dtype) {
  auto net = make_net(seed);
  net->to(kFloat32);
  net->to(dtype);
  return net;
}

dist::FSDPOptions with_precision(ShardingStrategy strategy, MixedPrecision mp) {
  dist::FSDPOptions o = blocks(strategy);
  o.mixed_precision = mp;
  return o;
}

TEST(FsdpMixedPrecision, ForwardEqualsThePlainModelWithRoundedWeights) {
  auto pg = dist_testing::group();
  for (DType low : {kBFloat16, kFloat16})
    for (ShardingStrategy strategy : all_strategies()) {
      auto net = net_in(31, kFloat32);
      FSDP fsdp(*net, with_precision(strategy, {.param_dtype = low}));
      bool low_inside = false;  // registered after FSDP's hook: sees the gathered unit
      net->b1.register_forward_pre_hook([&](nn::Module&, const Tensor& x) {
        low_inside = net->b1.fc.weight.dtype() == low && x.dtype() == low;
      });
      const Tensor x = local_batch(0, *pg).x.to(kFloat32);
      const Tensor out = fsdp(x);
      auto ref = net_in(31, low);
      const Tensor want = (*ref)(x.to(low));
      EXPECT_EQ(out.dtype(), low);
      EXPECT_TRUE(equal(out, want)) << (out.to(kFloat64) - want.to(kFloat64)).abs().max().item<double>();
      EXPECT_TRUE(low_inside);
      for (const Tensor& s : fsdp.parameters()) EXPECT_EQ(s.dtype(), kFloat32);
    }
}

TEST(FsdpMixedPrecision, ShardGradientsAreTheLowPrecisionGradientsAveragedInTheReduceDtype) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  for (DType reduce : {kBFloat16, kFloat32})
    for (ShardingStrategy strategy : all_strategies()) {
      auto net = net_in(32, kFloat32);
      FSDP fsdp(*net, with_precision(strategy, {.param_dtype = kBFloat16, .reduce_dtype = reduce}));
      Batch b = local_batch(0, *pg);
      F::mse_loss(fsdp(b.x.to(kFloat32)).to(kFloat32), b.y.to(kFloat32)).backward();
      // every rank's local gradient from the plain bfloat16 model on its rows, averaged in float64
      auto ref = net_in(32, kBFloat16);
      std::map<const TensorImpl*, Tensor> mean;
      const Batch whole = batch(0);
      const int64_t rows = 8 / n;
      for (int r = 0; r < n; ++r) {
        const Tensor x = whole.x.narrow(0, r * rows, rows).to(kFloat32).to(kBFloat16);
        F::mse_loss((*ref)(x).to(kFloat32), whole.y.narrow(0, r * rows, rows).to(kFloat32)).backward();
        for (const Tensor& p : ref->parameters()) {
          EXPECT_EQ(p.grad().dtype(), kBFloat16);
          Tensor& m = mean[p.impl_ptr().get()];
          m = m.defined() ? m + p.grad().to(kFloat64) / n : p.grad().to(kFloat64) / n;
          p.set_grad(Tensor());
        }
      }
      for (size_t u = 0; u < 3; ++u) {
        const Tensor got = fsdp.parameters()[u].grad();
        ASSERT_EQ(got.dtype(), kFloat32);
        const Tensor want =
            reference_shard(fsdp, u, *ref, [&](const Tensor& p) { return mean.at(p.impl_ptr().get()); });
        if (reduce == kBFloat16) {  // the float32 mean rounded once to bfloat16 (Note [Half reductions])
          EXPECT_TRUE(equal(got, got.to(kBFloat16).to(kFloat32))) << u;
          EXPECT_TRUE(allclose(got.to(kFloat64), want, 1.0 / 256, 1e-7)) << u;
        } else {
          EXPECT_TRUE(allclose(got.to(kFloat64), want, 1e-6, 1e-9)) << u;
        }
      }
    }
}

TEST(FsdpMixedPrecision, TrainsWithShardedGradScalerAsAFloat64SimulationWithinBfloat16Tolerance) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = net_in(33, kFloat32), ref = make_net(33);  // the reference: float64 throughout
    FSDP fsdp(*net, with_precision(strategy, {.param_dtype = kBFloat16, .reduce_dtype = kFloat32}));
    optim::SGD opt(fsdp.parameters(), {.lr = 0.2}), ref_opt(ref->parameters(), {.lr = 0.2});
    dist::ShardedGradScaler scaler({.init_scale = 1024.0});
    const Batch local = local_batch(0, *pg), whole = batch(0);
    std::vector<double> losses;
    for (int step = 0; step < 6; ++step) {
      const Tensor loss = F::mse_loss(fsdp(local.x.to(kFloat32)).to(kFloat32), local.y.to(kFloat32));
      scaler.scale(loss).backward();
      EXPECT_TRUE(scaler.step(opt));
      scaler.update();
      opt.zero_grad();
      Tensor mean_loss = full({1}, loss.item<double>(), TensorOptions(kFloat64));  // the whole batch's
      pg->allreduce(mean_loss, dist::ReduceOp::Avg)->wait();
      losses.push_back(mean_loss.item<double>());
      const Tensor ref_loss = F::mse_loss((*ref)(whole.x), whole.y);
      ref_loss.backward();
      ref_opt.step();
      ref_opt.zero_grad();
      EXPECT_NEAR(losses.back(), ref_loss.item<double>(), 1e-2 * ref_loss.item<double>()) << step;
    }
    EXPECT_LT(losses.back(), 0.9 * losses.front());
    for (size_t u = 0; u < 3; ++u) {
      const Tensor shard = fsdp.parameters()[u];
      ASSERT_EQ(shard.dtype(), kFloat32);
      EXPECT_TRUE(allclose(shard.to(kFloat64), reference_shard(fsdp, u, *ref, [](const Tensor& p) { return p; }),
                           0, 2e-3)) << u;
      // the masters keep float32's precision: the updates were not rounded to bfloat16
      EXPECT_FALSE(equal(shard, shard.to(kBFloat16).to(kFloat32))) << u;
    }
    const nn::StateDict dict = fsdp.full_state_dict(/*rank0_only=*/false);
    for (const auto& [name, t] : dict) {
      EXPECT_EQ(t.dtype(), kFloat32) << name;
      EXPECT_TRUE(allclose(t.to(kFloat64), ref->state_dict().at(name), 0, 2e-3)) << name;
    }
  }
}

// A state dict taken between a forward and its backward replaces a kept low-precision unit by the
// float32 masters; the backward gathers the low-precision one again and gives the same gradients.
TEST(FsdpMixedPrecision, AStateDictBetweenForwardAndBackwardLeavesTheGradientsAsTheyWere) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    std::vector<Tensor> grads[2];
    for (int summon = 0; summon < 2; ++summon) {
      auto net = net_in(36, kFloat32);
      FSDP fsdp(*net, with_precision(strategy, {.param_dtype = kBFloat16}));
      Batch b = local_batch(1, *pg);
      const Tensor loss = F::mse_loss(fsdp(b.x.to(kFloat32)).to(kFloat32), b.y.to(kFloat32));
      if (summon) {
        const nn::StateDict dict = fsdp.full_state_dict(/*rank0_only=*/false);
        EXPECT_EQ(dict.at("b1.fc.weight").dtype(), kFloat32);
      }
      loss.backward();
      for (const Tensor& s : fsdp.parameters()) grads[summon].push_back(s.grad().clone());
    }
    for (size_t u = 0; u < grads[0].size(); ++u) EXPECT_TRUE(equal(grads[1][u], grads[0][u])) << u;
  }
}

struct Shifted : nn::Module {
  nn::Linear fc{6, 5};
  Tensor shift;
  Shifted() {
    register_module("fc", fc);
    shift = register_buffer("shift", randn({5}));
  }
  Tensor forward(const Tensor& x) override { return fc(x) + shift; }
};

TEST(FsdpMixedPrecision, StateDictsHoldTheFloat32MastersAndBuffersInTheirOwnDtype) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    manual_seed(34);
    Shifted net, ref;
    nn::StateDict original = net.state_dict();
    for (auto& [name, t] : original) t = t.clone();
    FSDP fsdp(net, {.sharding_strategy = strategy,
                    .mixed_precision = {.param_dtype = kBFloat16, .buffer_dtype = kBFloat16}});
    EXPECT_EQ(net.shift.dtype(), kBFloat16);
    const nn::StateDict full = fsdp.full_state_dict(/*rank0_only=*/false);
    EXPECT_TRUE(equal(full.at("fc.weight"), original.at("fc.weight")));  // the masters, exactly
    EXPECT_TRUE(equal(full.at("fc.bias"), original.at("fc.bias")));
    EXPECT_EQ(full.at("shift").dtype(), kFloat32);  // kept in bfloat16, saved in its own dtype
    EXPECT_TRUE(equal(full.at("shift"), original.at("shift").to(kBFloat16).to(kFloat32)));
    nn::StateDict sharded = fsdp.sharded_state_dict();
    for (auto& [name, t] : sharded) t = t.clone();  // the dict aliases the shards
    EXPECT_EQ(sharded.at("_fsdp.unit.0.shard").dtype(), kFloat32);
    EXPECT_EQ(sharded.at("shift").dtype(), kFloat32);

    // the forward: the plain module with bfloat16 weights and buffer
    ref.load_state_dict(original);
    ref.to(kBFloat16);
    const Tensor x = randn({3, 6});
    EXPECT_TRUE(equal(fsdp(x), ref(x.to(kBFloat16))));

    // loading a full dict writes the float32 masters; summon_full_params shows them in float32
    nn::StateDict doubled = full;
    for (auto& [name, t] : doubled) t = t * 2;
    fsdp.load_full_state_dict(doubled);
    {
      auto summoned = fsdp.summon_full_params(/*writeback=*/false);
      EXPECT_EQ(net.fc.weight.dtype(), kFloat32);
      EXPECT_TRUE(equal(net.fc.weight, original.at("fc.weight") * 2));
      EXPECT_EQ(net.shift.dtype(), kFloat32);
    }
    EXPECT_EQ(net.shift.dtype(), kBFloat16);
    EXPECT_TRUE(equal(fsdp.full_state_dict(false).at("fc.weight"), original.at("fc.weight") * 2));
    ref.load_state_dict(doubled);
    EXPECT_TRUE(equal(fsdp(x), ref(x.to(kBFloat16))));  // the next forward casts the new masters
    fsdp.load_sharded_state_dict(sharded);
    EXPECT_TRUE(equal(fsdp.full_state_dict(false).at("fc.weight"), original.at("fc.weight")));
    EXPECT_TRUE(equal(fsdp.full_state_dict(false).at("shift"), full.at("shift")));
  }
}

TEST(FsdpMixedPrecision, ANonFloatingDtypeRaises) {
  auto pg = dist_testing::group();
  auto net = make_net(35);
  EXPECT_THROW({ FSDP bad(*net, with_precision(ShardingStrategy::FullShard, {.param_dtype = kInt32})); }, Error);
  EXPECT_THROW({ FSDP bad(*net, with_precision(ShardingStrategy::FullShard, {.reduce_dtype = kBool})); }, Error);
  FSDP fsdp(*net, blocks(ShardingStrategy::FullShard));  // nothing was left wrapped
  EXPECT_FALSE(fsdp.mixed_precision().param_dtype.has_value());
}

}  // namespace
}  // namespace strata
