// DistributedDataParallel under mpirun: ranks training on their parts of a batch take the same
// steps, to float64 round-off, as one process training a copy of the model (rank 0's
// initialization) on the per-rank losses averaged, which every rank computes here on its own.
// Buckets are forced small so there are several; gradient accumulation under no_sync; a
// parameter that one rank does not use and one that no rank uses; BatchNorm's buffers.
#include <numeric>

#include "dist/dist_testing.h"

namespace strata {
namespace {

using testing::values;
namespace F = nn::functional;

constexpr uint64_t kSeed = 1234;
constexpr int64_t kBatch = 8;

struct Net : nn::Module {
  nn::Linear fc1{6, 8}, fc2{8, 8}, fc3{8, 5}, side{6, 5}, never{6, 5};
  bool use_side = true;
  Net() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
    register_module("side", side);
    register_module("never", never);  // in no forward: no rank ever gives it a gradient
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = fc3(tanh(fc2(tanh(fc1(x)))));
    return use_side ? y + side(x) : y;
  }
};

// The model of rank `rank`: rank 0's starts as the reference does, the others differ until
// DDP copies rank 0's parameters to them.
std::unique_ptr<Net> make_net(int rank) {
  manual_seed(kSeed + 17 * static_cast<uint64_t>(rank));
  auto net = std::make_unique<Net>();
  net->to(kFloat64);
  return net;
}

struct Batch {
  Tensor x, y;
};
Batch global_batch(int step) {
  Generator gen(99 + static_cast<uint64_t>(step));
  return {randn({kBatch, 6}, TensorOptions(kFloat64), &gen), randn({kBatch, 5}, TensorOptions(kFloat64), &gen)};
}
Batch shard(const Batch& b, int rank, int ranks) {
  const int64_t rows = kBatch / ranks;
  return {b.x.narrow(0, rank * rows, rows), b.y.narrow(0, rank * rows, rows)};
}

// The reference loss: the mean over ranks of each rank's loss, each with that rank's forward.
Tensor reference_loss(Net& ref, const Batch& b, int ranks, const std::function<bool(int)>& uses_side) {
  Tensor total;
  for (int r = 0; r < ranks; ++r) {
    Batch s = shard(b, r, ranks);
    ref.use_side = uses_side(r);
    Tensor l = F::mse_loss(ref(s.x), s.y);
    total = total.defined() ? total + l : l;
  }
  return total / static_cast<double>(ranks);
}

void expect_same_tensors(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(got[k].defined(), want[k].defined()) << what << " " << k;
    if (got[k].defined()) EXPECT_TRUE(allclose(got[k], want[k], 1e-12, 1e-13)) << what << " " << k;
  }
}

// The gradients of every parameter but `never`'s two (the last), which no forward uses.
std::vector<Tensor> grads(Net& net) {
  std::vector<Tensor> g;
  for (const Tensor& p : net.parameters()) g.push_back(p.grad());
  g.resize(g.size() - 2);
  return g;
}

TEST(DDP, SeveralBucketsTrainLikeOneProcessOnTheWholeBatch) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(r), ref = make_net(0);
  dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 200.0 / (1 << 20)});
  expect_same_tensors(net->parameters(), ref->parameters(), "broadcast parameter");
  const auto buckets = ddp.bucket_assignment();
  EXPECT_GE(buckets.size(), 5u);
  EXPECT_EQ(buckets.front().front(), net->parameters().size() - 1);  // reverse order
  optim::SGD opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < 4; ++step) {
    Batch b = global_batch(step), mine = shard(b, r, n);
    // every parameter but `never` is used: only the buckets holding `never` wait for the end
    F::mse_loss(ddp(mine.x), mine.y).backward();
    reference_loss(*ref, b, n, [](int) { return true; }).backward();
    expect_same_tensors(grads(*net), grads(*ref), "gradient");
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
    expect_same_tensors(net->parameters(), ref->parameters(), "parameter");
  }
}

TEST(DDP, BucketsStartDuringTheBackwardPass) {
  auto pg = dist_testing::group();
  auto net = make_net(pg->rank());
  // `never` frozen: every bucket fills during the backward and starts before it ends
  for (const Tensor& p : net->never.parameters()) p.requires_grad_(false);
  dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 200.0 / (1 << 20)});
  Batch mine = shard(global_batch(0), pg->rank(), pg->size());
  F::mse_loss(ddp(mine.x), mine.y).backward();
  EXPECT_EQ(ddp.buckets_started_during_backward(), ddp.bucket_assignment().size());
  // one bucket for everything under the default 25 MiB
  auto net2 = make_net(pg->rank());
  dist::DistributedDataParallel ddp2(*net2);
  EXPECT_EQ(ddp2.bucket_assignment().size(), 1u);
}

// register_bucket_hook: each bucket once, in index order, the last one marked, with its
// parameters, whose .grad already holds the average when the hook runs; the buckets still start
// during the backward; a hook that raises makes backward() raise after every bucket is written.
TEST(DDP, BucketHookSeesEachBucketAveragedInOrder) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(r), ref = make_net(0);
  for (const Tensor& p : net->never.parameters()) p.requires_grad_(false);
  dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 200.0 / (1 << 20)});
  const auto buckets = ddp.bucket_assignment();
  ASSERT_GE(buckets.size(), 3u);
  const std::vector<Tensor> params = net->parameters(), ref_params = ref->parameters();
  Batch b = global_batch(0), mine = shard(b, r, n);
  reference_loss(*ref, b, n, [](int) { return true; }).backward();
  std::vector<size_t> seen;
  int throw_at = -1;
  ddp.register_bucket_hook([&](const dist::GradBucket& bucket) {
    EXPECT_EQ(bucket.is_last, bucket.index + 1 == buckets.size());
    const auto& want = buckets.at(bucket.index);
    EXPECT_EQ(bucket.parameters.size(), want.size());
    for (size_t i = 0; i < want.size() && i < bucket.parameters.size(); ++i) {
      EXPECT_TRUE(bucket.parameters[i].is_same(params[want[i]])) << "bucket " << bucket.index;
      EXPECT_TRUE(allclose(params[want[i]].grad(), ref_params[want[i]].grad(), 1e-12, 1e-13))
          << "bucket " << bucket.index << " param " << want[i];
    }
    seen.push_back(bucket.index);
    if (static_cast<int>(bucket.index) == throw_at) throw Error("hook failed");
  });
  std::vector<size_t> in_order(buckets.size());
  std::iota(in_order.begin(), in_order.end(), size_t{0});
  for (int pass = 0; pass < 3; ++pass) {
    SCOPED_TRACE(fmt::format("pass {}", pass));
    throw_at = pass == 1 ? 1 : -1;
    seen.clear();
    net->zero_grad();
    auto backward = [&] { F::mse_loss(ddp(mine.x), mine.y).backward(); };
    if (pass == 1) EXPECT_TRUE(testing::throws_with(backward, {"hook failed"}));
    else backward();
    const std::vector<size_t> want = pass == 1 ? std::vector<size_t>{0, 1} : in_order;
    EXPECT_EQ(seen, want);
    EXPECT_EQ(ddp.buckets_started_during_backward(), buckets.size());
    for (size_t k = 0; k + 2 < params.size(); ++k)  // every bucket written, even after a raise
      EXPECT_TRUE(allclose(params[k].grad(), ref_params[k].grad(), 1e-12, 1e-13)) << "param " << k;
  }
}

TEST(DDP, NoSyncAccumulationEqualsTheUnsplitRun) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(r), ref = make_net(0), local = make_net(0);
  dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 300.0 / (1 << 20)});
  Batch b = global_batch(5), mine = shard(b, r, n);
  const int64_t half = mine.x.size(0) / 2;
  {
    auto guard = ddp.no_sync();
    F::mse_loss(ddp(mine.x.narrow(0, 0, half)), mine.y.narrow(0, 0, half)).mul(0.5).backward();
  }
  // no communication yet: each rank holds its own first micro-batch's gradient
  F::mse_loss((*local)(mine.x.narrow(0, 0, half)), mine.y.narrow(0, 0, half)).mul(0.5).backward();
  expect_same_tensors(grads(*net), grads(*local), "local gradient under no_sync");
  F::mse_loss(ddp(mine.x.narrow(0, half, half)), mine.y.narrow(0, half, half)).mul(0.5).backward();
  reference_loss(*ref, b, n, [](int) { return true; }).backward();
  expect_same_tensors(grads(*net), grads(*ref), "accumulated gradient");
}

void check_unused(bool find_unused_parameters) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto net = make_net(r), ref = make_net(0);
  dist::DistributedDataParallel ddp(
      *net, {.bucket_cap_mb = 200.0 / (1 << 20), .find_unused_parameters = find_unused_parameters});
  auto uses_side = [](int rank) { return rank == 0; };  // `side` is used by rank 0 only
  for (int step = 0; step < 2; ++step) {
    Batch b = global_batch(step), mine = shard(b, r, n);
    net->use_side = uses_side(r);
    F::mse_loss(ddp(mine.x), mine.y).backward();
    reference_loss(*ref, b, n, uses_side).backward();
    expect_same_tensors(grads(*net), grads(*ref), "gradient");
    // with find_unused_parameters the forward found `never` (and `side` on rank 1): their
    // buckets, counted at the start of the backward, did not hold the others back
    const size_t all = ddp.bucket_assignment().size();
    if (find_unused_parameters) EXPECT_EQ(ddp.buckets_started_during_backward(), all);
    else EXPECT_LT(ddp.buckets_started_during_backward(), all);
    // `never`, unused everywhere: untouched with find_unused_parameters, zeros without
    for (const Tensor& p : net->never.parameters()) {
      if (find_unused_parameters) {
        EXPECT_FALSE(p.grad().defined());
      } else {
        ASSERT_TRUE(p.grad().defined());
        EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0);
      }
    }
    net->zero_grad();
    ref->zero_grad();
  }
}

TEST(DDP, ParametersUnusedOnSomeRanksStillReduce) { check_unused(false); }
TEST(DDP, FindUnusedParametersLeavesGloballyUnusedGradientsAlone) { check_unused(true); }

// A backward that raises after some buckets started (a hook on fc1's weight, whose gradient
// comes last) leaves the reducer mid-pass; retrying the same graph (retain_graph) must start
// a fresh pass rather than count the earlier gradients twice or skip the reduction. A second
// backward through the retained graph then adds the same averaged gradient again.
TEST(DDP, BackwardRetriedAfterItRaisedMidwayStillReduces) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(r), ref = make_net(0);
  for (const Tensor& p : net->never.parameters()) p.requires_grad_(false);  // buckets start early
  dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 200.0 / (1 << 20)});
  bool fail = true;
  net->fc1.weight.register_hook([&fail](const Tensor& g) {
    STRATA_CHECK(!fail, "[test] the first backward fails");
    return g;
  });
  Batch b = global_batch(3), mine = shard(b, r, n);
  Tensor loss = F::mse_loss(ddp(mine.x), mine.y);
  EXPECT_TRUE(testing::throws_with([&] { loss.backward(Tensor(), /*retain_graph=*/true); }, {"first backward"}));
  EXPECT_GT(ddp.buckets_started_during_backward(), 0u);
  net->zero_grad();
  fail = false;
  loss.backward(Tensor(), /*retain_graph=*/true);
  reference_loss(*ref, b, n, [](int) { return true; }).backward(Tensor(), /*retain_graph=*/true);
  expect_same_tensors(grads(*net), grads(*ref), "gradient after the retry");
  loss.backward();
  std::vector<Tensor> twice;
  for (const Tensor& g : grads(*ref)) twice.push_back(g * 2.0);
  expect_same_tensors(grads(*net), twice, "gradient after a second backward");
}

// find_unused_parameters: what one forward found unused must not carry over to a later forward
// whose output DDP cannot walk (forward_with returning a pair), which does use those parameters.
TEST(DDP, UnusedParametersAreFoundAgainForEveryForward) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  auto net = make_net(r), ref = make_net(0);
  dist::DistributedDataParallel ddp(*net, {.find_unused_parameters = true});
  Batch b = global_batch(4), mine = shard(b, r, n);
  net->use_side = false;
  F::mse_loss(ddp(mine.x), mine.y).backward();  // `side` found unused
  net->zero_grad();
  net->use_side = true;
  auto [out, extra] = ddp.forward_with([&] { return std::make_pair((*net)(mine.x), 0); });
  F::mse_loss(out, mine.y).backward();
  reference_loss(*ref, b, n, [](int) { return true; }).backward();
  expect_same_tensors(grads(*net), grads(*ref), "gradient");
}

// A float16 and a bfloat16 model: the buckets hold half-precision gradients, averaged through
// float32 and rounded once; they match the float64 reference to the dtype's precision.
TEST(DDP, HalfPrecisionGradientsAverage) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  for (DType d : {kFloat16, kBFloat16}) {
    SCOPED_TRACE(fmt::format("{}", d));
    auto net = make_net(r), ref = make_net(0);
    net->to(d);
    dist::DistributedDataParallel ddp(*net, {.bucket_cap_mb = 200.0 / (1 << 20)});
    Batch b = global_batch(6), mine = shard(b, r, n);
    F::mse_loss(ddp(mine.x.to(d)).to(kFloat64), mine.y).backward();
    // the reference starts from the same rounded parameters
    {
      NoGradGuard no_grad;
      for (size_t k = 0; k < ref->parameters().size(); ++k)
        ref->parameters()[k].copy_(net->parameters()[k].to(kFloat64));
    }
    reference_loss(*ref, b, n, [](int) { return true; }).backward();
    const double tol = d == kFloat16 ? 1e-2 : 5e-2;
    auto got = grads(*net), want = grads(*ref);
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_TRUE(got[k].defined()) << k;
      EXPECT_EQ(got[k].dtype(), d);
      EXPECT_TRUE(allclose(got[k].to(kFloat64), want[k], tol, tol)) << k;
    }
  }
}

TEST(DDP, BroadcastBuffersCopiesRankZeroStatisticsEachForward) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  for (bool broadcast : {true, false}) {
    nn::BatchNorm1d bn(3);
    bn.to(kFloat64);
    dist::DistributedDataParallel ddp(bn, {.broadcast_buffers = broadcast});
    ddp(full({4, 3}, 1.0 + r, TensorOptions(kFloat64)) + arange(12, TensorOptions(kFloat64)).view({4, 3}));
    std::vector<Tensor> means;
    for (int k = 0; k < n; ++k) means.push_back(zeros({3}, TensorOptions(kFloat64)));
    dist::all_gather(means, bn.running_mean);
    EXPECT_FALSE(equal(means[0], means[1])) << "each rank updates its own statistics";
    ddp.eval();
    ddp(zeros({2, 3}, TensorOptions(kFloat64)));  // eval: statistics are read, not updated
    dist::all_gather(means, bn.running_mean);
    EXPECT_EQ(equal(means[0], means[1]), broadcast) << "broadcast_buffers " << broadcast;
  }
}

TEST(DDP, DifferentModelsRaiseOnEveryRank) {
  auto pg = dist_testing::group();
  nn::Linear small(3, 2), large(3, 4);
  nn::Linear& mine = pg->rank() == 0 ? small : large;
  if (pg->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  EXPECT_TRUE(testing::throws_with([&] { dist::DistributedDataParallel ddp(mine); }, {"different models"}));
  // frozen parameters are broadcast too: they must match as well
  for (const Tensor& p : mine.parameters()) p.requires_grad_(false);
  EXPECT_TRUE(testing::throws_with([&] { dist::DistributedDataParallel ddp(mine); }, {"different models"}));
  EXPECT_TRUE(testing::throws_with([&] { dist::DistributedDataParallel ddp(small, {.bucket_cap_mb = 0}); },
                                   {"bucket_cap_mb"}));
}

}  // namespace
}  // namespace strata
