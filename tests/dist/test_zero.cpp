// ZeroRedundancyOptimizer under mpirun (2 and 4 ranks). Where every rank computes the whole
// batch's gradient, ZeRO's parameters are bit for bit those of one process running the plain
// optimizer (the same per-parameter update on the same values); under DDP the averaged gradients
// differ from the whole batch's by float64 round-off (1e-12). The state is sharded as PyTorch's
// greedy partition says, and a consolidated state dict is the plain optimizer's, resumable on
// another world size.
#include <unistd.h>

#include <filesystem>

#include "dist/dist_testing.h"

namespace strata {
namespace {

namespace F = nn::functional;
using Zero = dist::ZeroRedundancyOptimizer<optim::AdamW>;

struct Net : nn::Module {
  nn::Linear fc1{6, 8}, fc2{8, 8}, fc3{8, 5}, side{6, 5};
  Net() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
    register_module("side", side);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return fc3(tanh(fc2(tanh(fc1(x))))) + side(x); }
};

std::unique_ptr<Net> make_net(uint64_t seed) {
  manual_seed(seed);
  return std::make_unique<Net>();
}

struct Batch {
  Tensor x, y;
};
Batch batch(int step) {
  Generator gen(31 + static_cast<uint64_t>(step));
  return {randn({8, 6}, TensorOptions(kFloat64), &gen), randn({8, 5}, TensorOptions(kFloat64), &gen)};
}

// Weights with weight decay, biases without, each group with its own lr.
template <class G>
std::vector<G> decay_groups(Net& net) {
  std::vector<Tensor> weights, biases;
  for (auto& [name, p] : net.named_parameters()) (name.ends_with("bias") ? biases : weights).push_back(p);
  return {G(weights, {.lr = 0.01, .weight_decay = 0.1}), G(biases, {.lr = 0.02, .weight_decay = 0})};
}

void train_step(Net& net, optim::Optimizer& opt, int step) {
  Batch b = batch(step);
  F::mse_loss(net(b.x), b.y).backward();
  opt.step();
  opt.zero_grad();
}

void expect_bitwise_equal(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(equal(got[k], want[k])) << what << " " << k;
}

// A file name every rank agrees on (rank 0's process id), for a checkpoint rank 0 writes.
std::string shared_temp_path(dist::ProcessGroup& pg, const char* stem) {
  Tensor id = full({1}, static_cast<int64_t>(::getpid()), TensorOptions(kInt64));
  pg.broadcast(id, 0)->wait();
  return (std::filesystem::temp_directory_path() / fmt::format("{}_{}.ckpt", stem, id.item<int64_t>())).string();
}

void expect_same_dict(const optim::StateDict& got, const optim::StateDict& want) {
  EXPECT_EQ(got.type, want.type);
  EXPECT_EQ(got.scalars, want.scalars);
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (const auto& [key, t] : want.tensors) {
    ASSERT_TRUE(got.tensors.count(key)) << key;
    EXPECT_TRUE(equal(got.tensors.at(key), t)) << key;
  }
}

TEST(Zero, AdamWWithASchedulerStepsLikeOneProcessBitForBit) {
  auto pg = dist_testing::group();
  auto net = make_net(5), ref = make_net(5);
  Zero opt(decay_groups<Zero::Group>(*net));
  optim::AdamW ref_opt(decay_groups<optim::AdamW::Group>(*ref));
  auto decay = [](int64_t step) { return 1.0 / (1.0 + static_cast<double>(step)); };
  optim::LambdaLR sched(opt, decay), ref_sched(ref_opt, decay);
  for (int step = 0; step < 5; ++step) {
    train_step(*net, opt, step);  // no DDP: every rank has the whole batch's gradient
    train_step(*ref, ref_opt, step);
    sched.step();
    ref_sched.step();
    expect_bitwise_equal(net->parameters(), ref->parameters(), "parameter");
  }
  // the scheduler's lrs reached the wrapped optimizer at the last step
  if (const auto* local = opt.local_optimizer())
    for (size_t g = 0; g < 2; ++g) EXPECT_EQ(local->param_groups()[g].options.lr, 0.01 * (g + 1) / 5.0);
  // the consolidated dict carries the scheduled lrs and the initial_lr, as the plain AdamW's
  opt.consolidate_state_dict(0);
  if (pg->rank() == 0) expect_same_dict(opt.state_dict(), ref_opt.state_dict());
  // a scheduler step after consolidating: the dict holds the lrs the next step uses, as the plain
  // AdamW's does (a checkpoint saved then resumes exactly)
  sched.step();
  ref_sched.step();
  if (pg->rank() == 0) expect_same_dict(opt.state_dict(), ref_opt.state_dict());
}

TEST(Zero, SGDMomentumUnderDDPTrainsLikeOneProcessOnTheWholeBatch) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(100 + static_cast<uint64_t>(r)), ref = make_net(100);  // DDP copies rank 0's
  dist::DistributedDataParallel ddp(*net);
  optim::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .nesterov = true};
  dist::ZeroRedundancyOptimizer<optim::SGD> opt(net->parameters(), sgd, {.broadcast_bucket_mb = 1e-4});
  optim::SGD ref_opt(ref->parameters(), sgd);
  for (int step = 0; step < 4; ++step) {
    Batch b = batch(step);
    const int64_t rows = 8 / n;
    F::mse_loss(ddp(b.x.narrow(0, r * rows, rows)), b.y.narrow(0, r * rows, rows)).backward();
    opt.step();
    opt.zero_grad();
    train_step(*ref, ref_opt, step);  // the mean of the ranks' mean losses is the batch's mean loss
    auto got = net->parameters(), want = ref->parameters();
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE(allclose(got[k], want[k], 1e-12, 1e-13)) << "parameter " << k;
      dist_testing::expect_same_on_every_rank(*pg, got[k]);
    }
  }
}

TEST(Zero, StateShardsFollowTheGreedyPartitionAndCoverEveryParameter) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(5);
  Zero opt(decay_groups<Zero::Group>(*net));
  train_step(*net, opt, 0);
  // PyTorch's partition: each group's largest first, to the rank with the fewest elements so far
  std::vector<int64_t> load(static_cast<size_t>(n), 0);
  int64_t mine = 0, state_elements = 0, total = 0;
  for (const auto& group : opt.param_groups()) {
    std::vector<Tensor> sorted = group.params;
    auto larger = [](const Tensor& a, const Tensor& b) { return a.numel() > b.numel(); };
    std::stable_sort(sorted.begin(), sorted.end(), larger);
    for (const Tensor& p : sorted) {
      const auto least = std::min_element(load.begin(), load.end());
      const int want = static_cast<int>(least - load.begin());
      *least += p.numel();
      EXPECT_EQ(opt.rank_of(p), want);
      const optim::ParamState* st = opt.local_optimizer() ? opt.local_optimizer()->state(p) : nullptr;
      EXPECT_EQ(st != nullptr, want == r);
      // disjoint and covering: exactly one rank holds each parameter's state
      Tensor holders = full({1}, st != nullptr ? 1 : 0, TensorOptions(kInt64));
      pg->allreduce(holders)->wait();
      EXPECT_EQ(holders.item<int64_t>(), 1);
      if (st)
        for (const auto& [name, t] : st->tensors) state_elements += t.numel();
      if (want == r) mine += p.numel();
      total += p.numel();
    }
  }
  EXPECT_EQ(state_elements, 2 * mine);  // exp_avg and exp_avg_sq of this rank's parameters only
  EXPECT_LT(mine, total);
}

TEST(Zero, ConsolidatedStateIsThePlainOptimizersAndResumesOnAnotherWorldSize) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(9), ref = make_net(9);
  Zero opt(decay_groups<Zero::Group>(*net));
  optim::AdamW ref_opt(decay_groups<optim::AdamW::Group>(*ref));
  for (int step = 0; step < 3; ++step) {
    train_step(*net, opt, step);
    train_step(*ref, ref_opt, step);
  }
  optim::StateDict whole;
  for (int to = 0; to < n; ++to) {
    opt.consolidate_state_dict(to);
    if (to == r) whole = opt.state_dict();
    if (to != r) EXPECT_TRUE(testing::throws_with([&] { opt.state_dict(); }, {"not been consolidated"}));
  }
  expect_same_dict(whole, ref_opt.state_dict());
  // a checkpoint written on rank 0 holds the same dict, which every rank reads back
  const std::string path = shared_temp_path(*pg, "strata_zero");
  opt.consolidate_state_dict(0);
  if (r == 0) io::save_checkpoint(path, {.model = net.get(), .optimizer = &opt});
  pg->barrier()->wait();
  const optim::StateDict full = io::read_checkpoint(path).optimizer;
  expect_same_dict(full, whole);
  pg->barrier()->wait();
  if (r == 0) std::filesystem::remove(path);

  // resume on half the ranks (one for 2), and in one plain process, from the dict of this world
  const int half = std::max(1, n / 2);
  std::vector<int> first;
  for (int k = 0; k < half; ++k) first.push_back(k);
  auto sub = dist::new_group(first);
  auto resumed = make_net(9), plain = make_net(9);
  {
    NoGradGuard no_grad;
    for (size_t k = 0; k < net->parameters().size(); ++k) {
      resumed->parameters()[k].copy_(net->parameters()[k]);
      plain->parameters()[k].copy_(net->parameters()[k]);
    }
  }
  optim::AdamW plain_opt(decay_groups<optim::AdamW::Group>(*plain));
  plain_opt.load_state_dict(full);
  std::unique_ptr<Zero> resumed_opt;
  if (sub->is_member()) {
    resumed_opt = std::make_unique<Zero>(decay_groups<Zero::Group>(*resumed), optim::AdamWOptions{},
                                         dist::ZeroOptions{.process_group = sub});
    resumed_opt->load_state_dict(full);
  }
  for (int step = 3; step < 5; ++step) {
    train_step(*net, opt, step);
    train_step(*plain, plain_opt, step);
    if (resumed_opt) train_step(*resumed, *resumed_opt, step);
    expect_bitwise_equal(net->parameters(), plain->parameters(), "resumed in one process");
    if (resumed_opt) expect_bitwise_equal(net->parameters(), resumed->parameters(), "resumed on fewer ranks");
  }
  EXPECT_TRUE(testing::throws_with([&] { opt.state_dict(); }, {"consolidate"}));
}

// 8-bit states (codes and scales of other shapes than the parameter) and a group added after
// some steps, which the next step partitions: still one process's run, and its state dict.
TEST(Zero, Adam8bitWithAGroupAddedLaterStepsLikeOneProcess) {
  auto pg = dist_testing::group();
  auto net = make_net(21), ref = make_net(21);
  const optim::Adam8bitOptions o8{.lr = 0.01, .min_8bit_size = 16, .block_size = 8};
  auto without_side = [](Net& m) {
    std::vector<Tensor> ps;
    for (auto* l : {&m.fc1, &m.fc2, &m.fc3})
      for (const Tensor& p : l->parameters()) ps.push_back(p);
    return ps;
  };
  dist::ZeroRedundancyOptimizer<optim::Adam8bit> opt(without_side(*net), o8);
  optim::Adam8bit ref_opt(without_side(*ref), o8);
  for (int step = 0; step < 4; ++step) {
    if (step == 2) {
      opt.add_param_group(net->side.parameters());
      ref_opt.add_param_group(ref->side.parameters());
    }
    train_step(*net, opt, step);
    train_step(*ref, ref_opt, step);
    expect_bitwise_equal(net->parameters(), ref->parameters(), "parameter");
  }
  EXPECT_EQ(opt.num_param_groups(), 2u);
  opt.consolidate_state_dict(0);
  if (pg->rank() == 0) expect_same_dict(opt.state_dict(), ref_opt.state_dict());
}

// GradScaler drives it through the virtual step(): a step with inf gradients (the same on every
// rank) is skipped everywhere, the others are one process's AdamW's, bit for bit.
TEST(Zero, UnderGradScalerSkipsAnInfStepAndOtherwiseStepsLikeOneProcess) {
  auto net = make_net(17), ref = make_net(17);
  Zero opt(net->parameters(), {.lr = 0.01});
  optim::AdamW ref_opt(ref->parameters(), {.lr = 0.01});
  amp::GradScaler scaler({.init_scale = 64}), ref_scaler({.init_scale = 64});
  for (int step = 0; step < 3; ++step) {
    Batch b = batch(step);
    if (step == 1) b.y = full({8, 5}, std::numeric_limits<double>::infinity(), TensorOptions(kFloat64));
    for (auto [m, o, s] : {std::tuple<Net*, optim::Optimizer*, amp::GradScaler*>{net.get(), &opt, &scaler},
                           {ref.get(), &ref_opt, &ref_scaler}}) {
      s->scale(F::mse_loss((*m)(b.x), b.y)).backward();
      EXPECT_EQ(s->step(*o), step != 1);
      s->update();
      o->zero_grad();
    }
    expect_bitwise_equal(net->parameters(), ref->parameters(), "parameter");
  }
  EXPECT_EQ(scaler.get_scale(), 32);
}

// io::load_checkpoint on every rank of a checkpoint rank 0 wrote: each rank loads its shard, the
// run continues bit for bit; a checkpoint the optimizer refuses leaves it as it was.
TEST(Zero, LoadCheckpointOnEveryRankResumesExactlyAndRollsBackARefusal) {
  auto pg = dist_testing::group();
  const int r = pg->rank();
  auto net = make_net(13), resumed = make_net(14);
  Zero opt(decay_groups<Zero::Group>(*net));
  for (int step = 0; step < 3; ++step) train_step(*net, opt, step);
  const std::string path = shared_temp_path(*pg, "strata_zero_resume");
  opt.consolidate_state_dict(0);
  if (r == 0) io::save_checkpoint(path, {.model = net.get(), .optimizer = &opt}, {.step = 3});
  pg->barrier()->wait();

  Zero resumed_opt(decay_groups<Zero::Group>(*resumed));
  train_step(*resumed, resumed_opt, 7);  // a state of its own, which the checkpoint replaces
  io::TrainingState state{.model = resumed.get(), .optimizer = &resumed_opt};
  EXPECT_EQ(io::load_checkpoint(path, state).step, 3);
  for (int step = 3; step < 5; ++step) {
    train_step(*net, opt, step);
    train_step(*resumed, resumed_opt, step);
    expect_bitwise_equal(resumed->parameters(), net->parameters(), "resumed from the checkpoint");
  }

  // one param group where the checkpoint has two: every rank refuses it, nothing changes
  auto other = make_net(15);
  Zero other_opt(other->parameters(), {.lr = 0.03});
  train_step(*other, other_opt, 0);
  std::vector<Tensor> weights_before;
  for (const Tensor& p : other->parameters()) weights_before.push_back(p.clone());
  other_opt.consolidate_state_dict(0);
  const optim::StateDict before = r == 0 ? other_opt.state_dict() : optim::StateDict{};
  io::TrainingState other_state{.model = other.get(), .optimizer = &other_opt};
  EXPECT_TRUE(testing::throws_with([&] { io::load_checkpoint(path, other_state); },
                                   {"nothing was changed", "param group 0 has 4 parameters"}));
  other_opt.consolidate_state_dict(0);
  if (r == 0) expect_same_dict(other_opt.state_dict(), before);
  for (size_t k = 0; k < weights_before.size(); ++k) EXPECT_TRUE(equal(other->parameters()[k], weights_before[k]));
  pg->barrier()->wait();
  if (r == 0) std::filesystem::remove(path);
}

TEST(Zero, AFailureInsideTheWrappedStepRaisesEverywhereAndKeepsTheReplicasEqual) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(7);
  dist::ZeroRedundancyOptimizer<dist_testing::FlakySGD> opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  train_step(*net, opt, 0);
  opt.consolidate_state_dict(0);
  // the greedy partition of these 8 parameters gives the last rank of 2 or 4 several of them
  if (r == n - 1) {
    EXPECT_GE(opt.local_optimizer()->param_groups()[0].params.size(), 2u);
    opt.local_optimizer()->fail = true;
  }
  std::vector<Tensor> before;
  for (const Tensor& p : net->parameters()) before.push_back(p.clone());
  Batch b = batch(1);
  F::mse_loss((*net)(b.x), b.y).backward();
  EXPECT_TRUE(testing::throws_with([&] { opt.step(); }, {r == n - 1 ? "flaky update" : "step failed on rank"}));
  // the shards that stepped (and the failing rank's first parameter) moved on every rank alike
  bool moved = false;
  for (size_t k = 0; k < before.size(); ++k) {
    dist_testing::expect_same_on_every_rank(*pg, net->parameters()[k]);
    moved = moved || !equal(net->parameters()[k], before[k]);
  }
  EXPECT_TRUE(moved);
  // the state changed, so the dict consolidated before is stale
  if (r == 0) EXPECT_TRUE(testing::throws_with([&] { opt.state_dict(); }, {"step(s) old"}));
}

TEST(Zero, BadInputRaisesOnEveryRankAndChangesNothing) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  EXPECT_TRUE(testing::throws_with([] { Zero(std::vector<Tensor>{}); }, {"empty parameter list"}));
  auto net = make_net(5);
  EXPECT_TRUE(testing::throws_with([&] { Zero(net->parameters(), {}, {.broadcast_bucket_mb = 0}); },
                                   {"broadcast_bucket_mb"}));
  Zero opt(decay_groups<Zero::Group>(*net));
  EXPECT_TRUE(testing::throws_with([&] { opt.state_dict(); }, {"not been consolidated"}));
  EXPECT_TRUE(testing::throws_with([&] { opt.consolidate_state_dict(n); }, {"out of range"}));
  train_step(*net, opt, 0);
  optim::StateDict good;
  // every rank needs the whole dict: each collects it in turn
  for (int to = n - 1; to >= 0; --to) {
    opt.consolidate_state_dict(to);
    if (to == pg->rank()) good = opt.state_dict();
  }
  optim::StateDict wrong_type = good, extra_group = good, bad_shape = good;
  wrong_type.type = "SGD";
  extra_group.scalars["group.2.num_params"] = 1;
  // a state only the last rank holds: only it can see the mismatch, and every rank raises
  size_t last_owned = 0;
  auto params = opt.params();
  for (size_t k = 0; k < params.size(); ++k)
    if (opt.rank_of(params[k]) == n - 1) last_owned = k;
  bad_shape.tensors[fmt::format("state.{}.exp_avg", last_owned)] = zeros({3}, TensorOptions(kFloat64));
  EXPECT_TRUE(testing::throws_with([&] { opt.load_state_dict(wrong_type); }, {"'SGD'"}));
  EXPECT_TRUE(testing::throws_with([&] { opt.load_state_dict(extra_group); }, {"more than 2 param groups"}));
  const char* cause = pg->rank() == n - 1 ? "shape" : "failed on rank";
  EXPECT_TRUE(testing::throws_with([&] { opt.load_state_dict(bad_shape); }, {cause}));
  opt.consolidate_state_dict(0);
  if (pg->rank() == 0) expect_same_dict(opt.state_dict(), good);
  // an invalid lr on the last rank alone: every rank raises before any parameter changes
  Tensor before = params[0].clone();
  if (pg->rank() == n - 1) opt.param_groups()[0].options.lr = -1;
  F::mse_loss((*net)(batch(1).x), batch(1).y).backward();
  EXPECT_TRUE(testing::throws_with([&] { opt.step(); }, {pg->rank() == n - 1 ? "lr" : "step failed on rank"}));
  EXPECT_TRUE(equal(params[0], before));
}

}  // namespace
}  // namespace strata
