// FullyShardedDataParallel on the paths a plain training step does not take, under mpirun (2 and 4
// ranks), each against one process training the plain model (float64, to round-off): a unit
// called twice in one forward; a parameter that gets no gradient on some ranks; a forward whose
// backward never comes (eval, a metric taken with grad on) before the optimizer steps; and
// saved-tensor hooks of the caller's (activation checkpointing, counting hooks) around the wrapper.
#include <memory>

#include <strata/memory/checkpoint.hpp>

#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;

// b1 runs twice in every forward.
struct TwiceNet : Net {
  Tensor forward(const Tensor& x) override { return head(b2(b1(b1(tanh(embed(x)))))); }
};

// b2 adds its `extra` layer only on the ranks where `use_extra` is set: elsewhere that parameter
// gets no gradient while the rest of its unit does.
struct ExtraBlock : Block {
  nn::Linear extra{8, 8};
  bool use_extra = false;
  ExtraBlock() { register_module("extra", extra); }
  Tensor forward(const Tensor& x) override { return use_extra ? tanh(fc(x) + extra(x)) : tanh(fc(x)); }
};
struct BranchNet : nn::Module {
  nn::Linear embed{6, 8};
  Block b1;
  ExtraBlock b2;
  nn::Linear head{8, 5};
  BranchNet() {
    register_module("embed", embed);
    register_module("b1", b1);
    register_module("b2", b2);
    register_module("head", head);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return head(b2(b1(tanh(embed(x))))); }
};

void expect_trains_like(FSDP& fsdp, nn::Module& ref, double tol) {
  expect_close_dicts(fsdp.full_state_dict(/*rank0_only=*/false), ref.state_dict(), tol);
}

TEST(FsdpPaths, AUnitCalledTwiceInOneForwardTrainsLikeOneProcess) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    manual_seed(21);
    TwiceNet net, ref;
    ref.load_state_dict(net.state_dict());
    FSDP fsdp(net, blocks(strategy));
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref.parameters(), {.lr = 0.1});
    for (int step = 0; step < 3; ++step) {
      fsdp_step(fsdp, opt, step);
      reference_step(ref, ref_opt, step);
    }
    expect_trains_like(fsdp, ref, 1e-12);
  }
}

TEST(FsdpPaths, AParameterWithoutGradientOnSomeRanksTrainsLikeOneProcess) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    manual_seed(22);
    BranchNet net, ref;
    ref.load_state_dict(net.state_dict());
    FSDP fsdp(net, {.sharding_strategy = strategy, .wrap_modules = {&net.b1, &net.b2}});
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref.parameters(), {.lr = 0.1});
    for (int step = 0; step < 3; ++step) {
      net.b2.use_extra = pg->rank() == step % pg->size();
      Batch b = local_batch(step, *pg);
      F::mse_loss(fsdp(b.x), b.y).backward();
      opt.step();
      opt.zero_grad();
      // the reference: the mean over the ranks of each rank's loss on its rows, with its branch
      Tensor total;
      for (int r = 0; r < pg->size(); ++r) {
        ref.b2.use_extra = r == step % pg->size();
        const int64_t rows = 8 / pg->size();
        Batch all = batch(step);
        Tensor loss = F::mse_loss(ref(all.x.narrow(0, r * rows, rows)), all.y.narrow(0, r * rows, rows));
        total = total.defined() ? total + loss : loss;
      }
      (total / static_cast<double>(pg->size())).backward();
      ref_opt.step();
      ref_opt.zero_grad();
    }
    expect_trains_like(fsdp, ref, 1e-12);
  }
}

// A forward with grad on whose backward never comes (a metric on the training batch, an eval
// forward without NoGradGuard), then the optimizer step: the next forward must see the stepped
// parameters, and no unit may stay gathered after an eval forward.
TEST(FsdpPaths, AForwardWithoutBackwardBeforeTheStepLeavesTheNextStepExact) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(23), ref = make_net(23);
    FSDP fsdp(*net, blocks(strategy));
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref->parameters(), {.lr = 0.1});
    for (int step = 0; step < 3; ++step) {
      Batch b = local_batch(step, *pg);
      F::mse_loss(fsdp(b.x), b.y).backward();
      Tensor metric = fsdp(b.x);  // grad mode on, never backpropagated
      EXPECT_TRUE(metric.requires_grad());
      opt.step();
      opt.zero_grad();
      reference_step(*ref, ref_opt, step);
    }
    expect_trains_like(fsdp, *ref, 1e-12);

    fsdp.eval();
    Tensor out = fsdp(local_batch(9, *pg).x);
    for (size_t u = 0; u < 3; ++u)
      EXPECT_EQ(fsdp.is_gathered(u), strategy == ShardingStrategy::NoShard) << "unit " << u;
    fsdp.train();
    fsdp_step(fsdp, opt, 3);
    reference_step(*ref, ref_opt, 3);
    expect_trains_like(fsdp, *ref, 1e-12);
  }
}

// The caller's saved-tensor hooks around the wrapper's forward still see the activations (the
// wrapper keeps only the gathered parameters itself), so activation checkpointing around it
// really recomputes, and the gradients are the plain model's.
TEST(FsdpPaths, TheCallersSavedTensorHooksAroundTheWrapperStillApply) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    auto net = make_net(24), ref = make_net(24);
    FSDP fsdp(*net, blocks(strategy));
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref->parameters(), {.lr = 0.1});
    int b1_calls = 0;
    auto counting = net->b1.register_forward_pre_hook([&](nn::Module&, const Tensor&) { ++b1_calls; });
    int packed = 0, unpacked = 0;
    for (int step = 0; step < 2; ++step) {
      Batch b = local_batch(step, *pg);
      Tensor loss;
      if (step == 0) {
        autograd::SavedTensorHooksGuard hooks(
            [&](const Tensor& t) -> std::any {
              ++packed;
              return t;
            },
            [&](const std::any& p) -> Tensor {
              ++unpacked;
              return std::any_cast<Tensor>(p);
            });
        loss = F::mse_loss(fsdp(b.x), b.y);
      } else {
        loss = F::mse_loss(memory::checkpoint([&](const Tensor& x) { return fsdp(x); }, b.x), b.y);
      }
      loss.backward();
      opt.step();
      opt.zero_grad();
      reference_step(*ref, ref_opt, step);
    }
    EXPECT_GT(packed, 0);
    EXPECT_EQ(unpacked, packed);
    EXPECT_EQ(b1_calls, 3);  // step 0 once; step 1 the forward and its recomputation
    expect_trains_like(fsdp, *ref, 1e-12);
    counting.remove();
  }
}

// Activation checkpointing inside the forward: around two child units and the root unit's own
// layer, which the recomputation in the backward runs again.
struct CheckpointedNet : Net {
  Tensor forward(const Tensor& x) override {
    Tensor h = tanh(embed(x));
    h = memory::checkpoint([this, x](const Tensor& y) { return b2(b1(y) * tanh(embed(x))); }, h);
    return head(h);
  }
};

TEST(FsdpPaths, CheckpointingInsideTheForwardTrainsLikeOneProcess) {
  auto pg = dist_testing::group();
  for (ShardingStrategy strategy : all_strategies()) {
    manual_seed(25);
    CheckpointedNet net, ref;
    ref.load_state_dict(net.state_dict());
    FSDP fsdp(net, blocks(strategy));
    int b1_calls = 0;
    auto counting = net.b1.register_forward_pre_hook([&](nn::Module&, const Tensor&) { ++b1_calls; });
    optim::SGD opt(fsdp.parameters(), {.lr = 0.1}), ref_opt(ref.parameters(), {.lr = 0.1});
    for (int step = 0; step < 3; ++step) {
      fsdp_step(fsdp, opt, step);
      reference_step(ref, ref_opt, step);
    }
    EXPECT_EQ(b1_calls, 6);  // each forward and its recomputation
    expect_trains_like(fsdp, ref, 1e-12);
    counting.remove();
  }
}

}  // namespace
}  // namespace strata
