// What the FullyShardedDataParallel tests share: a float64 model of three kinds of units (the
// root's own layers, two blocks), the batches, the plain single-process reference they train
// against, and the check that a shard equals this rank's part of a reference's flattened tensors.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/dist_testing.h"

namespace strata::fsdp_testing {

namespace F = nn::functional;
using FSDP = dist::FullyShardedDataParallel;
using dist::ShardingStrategy;

struct Block : nn::Module {
  nn::Linear fc{8, 8};
  Block() { register_module("fc", fc); }
  std::string name() const override { return "Block"; }
  Tensor forward(const Tensor& x) override { return tanh(fc(x)); }
};

// Root parameters (embed, head: 101 elements, padded to a multiple of the world size) and two
// Block units of 72 elements each.
struct Net : nn::Module {
  nn::Linear embed{6, 8};
  Block b1, b2;
  nn::Linear head{8, 5};
  Net() {
    register_module("embed", embed);
    register_module("b1", b1);
    register_module("b2", b2);
    register_module("head", head);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return head(b2(b1(tanh(embed(x))))); }
};

inline std::unique_ptr<Net> make_net(uint64_t seed) {
  manual_seed(seed);
  return std::make_unique<Net>();
}

inline dist::FSDPOptions blocks(ShardingStrategy s) {
  return {.sharding_strategy = s, .auto_wrap_policy = dist::module_wrap_policy<Block>()};
}

inline const std::vector<ShardingStrategy>& all_strategies() {
  static const std::vector<ShardingStrategy> all{ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                                 ShardingStrategy::NoShard};
  return all;
}

struct Batch {
  Tensor x, y;
};
// The whole batch of step `step` (8 rows), and this rank's equal share of it.
inline Batch batch(int step) {
  Generator gen(71 + static_cast<uint64_t>(step));
  return {randn({8, 6}, TensorOptions(kFloat64), &gen), randn({8, 5}, TensorOptions(kFloat64), &gen)};
}
inline Batch local_batch(int step, dist::ProcessGroup& pg) {
  Batch b = batch(step);
  const int64_t rows = 8 / pg.size();
  return {b.x.narrow(0, pg.rank() * rows, rows), b.y.narrow(0, pg.rank() * rows, rows)};
}

inline void fsdp_step(FSDP& fsdp, optim::Optimizer& opt, int step) {
  // a hybrid wrapper spans the world: each rank its own share of the batch
  Batch b = local_batch(step, fsdp.replicate_group() ? *dist::default_group() : *fsdp.process_group());
  F::mse_loss(fsdp(b.x), b.y).backward();
  opt.step();
  opt.zero_grad();
}
inline void reference_step(Net& net, optim::Optimizer& opt, int step) {
  Batch b = batch(step);
  F::mse_loss(net(b.x), b.y).backward();
  opt.step();
  opt.zero_grad();
}

// This rank's part of `tensors` (looked up in `reference` by the unit's parameter names) laid end
// to end and zero-padded to the shard size times the shard count.
template <class Get>
Tensor reference_shard(FSDP& fsdp, size_t unit, Net& reference, Get get) {
  std::vector<Tensor> parts;
  int64_t numel = 0;
  for (const std::string& name : fsdp.unit_parameter_names(unit)) {
    for (auto& [n, p] : reference.named_parameters())
      if (n == name) parts.push_back(get(p).reshape({-1}));
    numel += parts.back().numel();
  }
  const Tensor shard = fsdp.parameters()[unit];
  const int64_t shards = fsdp.sharding_strategy() == ShardingStrategy::NoShard ? 1 : fsdp.process_group()->size();
  const int64_t rank = shards == 1 ? 0 : fsdp.process_group()->rank();
  parts.push_back(zeros({shard.numel() * shards - numel}, TensorOptions(kFloat64)));
  return cat(parts, 0).narrow(0, rank * shard.numel(), shard.numel());
}

inline void expect_close_dicts(const nn::StateDict& got, const nn::StateDict& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    ASSERT_EQ(got.at(name).shape(), t.shape()) << name;
    EXPECT_TRUE(allclose(got.at(name), t, tol, tol)) << name << "\n" << (got.at(name) - t).abs().max().item<double>();
  }
}

}  // namespace strata::fsdp_testing
