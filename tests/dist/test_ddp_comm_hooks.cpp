// DDP communication hooks under mpirun: what a hook sees (GradBucket), the built-in averaging
// and half-precision hooks against averages computed here with the same casts, and the errors
// of a bad registration or a bad future. PowerSGD is in test_powersgd.cpp.
#include "dist/comm_hook_testing.h"

namespace strata {
namespace {

using comm_hook_testing::backward;
using comm_hook_testing::coefficients;
using comm_hook_testing::grads;
using comm_hook_testing::kBucketCapMb;
using comm_hook_testing::Weights;
namespace hooks = dist::ddp_comm_hooks;

// CommFuture: `then` steps run once, in chain order, when waited for; a failure is rethrown by
// every wait, and the steps after it do not run.
TEST(DdpCommHooks, CommFutureRunsItsStepsOnceWhenWaitedFor) {
  auto pg = dist_testing::group();
  std::vector<int> ran;
  Tensor t = full({3}, 2.0, kFloat64);
  Tensor sum = t.clone();
  dist::CommFuture first(sum, pg->allreduce(sum, dist::ReduceOp::Sum));
  dist::CommFuture chained = first.then([&](const Tensor& v) {
    ran.push_back(1);
    return v + 1.0;
  }).then([&](const Tensor& v) {
    ran.push_back(2);
    return v * 3.0;
  });
  EXPECT_TRUE(ran.empty());
  EXPECT_FALSE(chained.is_completed());
  EXPECT_TRUE(equal(chained.wait(), full({3}, (2.0 * pg->size() + 1.0) * 3.0, kFloat64)));
  EXPECT_TRUE(chained.is_completed());
  chained.wait();
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));

  dist::CommFuture failing = dist::CommFuture(t).then([](const Tensor&) -> Tensor { throw Error("step failed"); });
  dist::CommFuture after = failing.then([&](const Tensor& v) {
    ran.push_back(3);
    return v;
  });
  EXPECT_TRUE(testing::throws_with([&] { after.wait(); }, {"step failed"}));
  EXPECT_TRUE(testing::throws_with([&] { failing.wait(); }, {"step failed"}));
  EXPECT_EQ(ran.size(), 2u);
  EXPECT_TRUE(testing::throws_with([] { dist::CommFuture().wait(); }, {"empty"}));
}

// With allreduce_hook, DDP's gradients are bit for bit those of DDP without a hook, through
// several buckets, a no_sync accumulation and a parameter no rank uses (find_unused_parameters).
TEST(DdpCommHooks, AllreduceHookEqualsNoHookBitForBit) {
  auto pg = dist_testing::group();
  const int r = pg->rank();
  Weights plain_net(7), hooked_net(7);
  dist::DDPOptions options{.bucket_cap_mb = kBucketCapMb, .find_unused_parameters = true};
  dist::DistributedDataParallel plain(plain_net, options), hooked(hooked_net, options);
  ASSERT_EQ(hooked.bucket_assignment().size(), 3u);
  hooked.register_comm_hook(nullptr, hooks::allreduce_hook);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    plain_net.use_small = hooked_net.use_small = step != 2;  // step 2: `small` unused on every rank
    if (step == 1) {
      auto g1 = plain.no_sync();
      auto g2 = hooked.no_sync();
      backward(plain, plain_net, r, 100);
      backward(hooked, hooked_net, r, 100);
    }
    backward(plain, plain_net, r, step);
    backward(hooked, hooked_net, r, step);
    const auto want = grads(plain_net), got = grads(hooked_net);
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(got[k].defined(), want[k].defined()) << "param " << k;
      EXPECT_TRUE(!want[k].defined() || equal(got[k], want[k])) << "param " << k;
    }
    EXPECT_EQ(want.back().defined(), step != 2);  // unused everywhere: .grad left as zero_grad made it
    plain_net.zero_grad();
    hooked_net.zero_grad();
  }
}

// Each rank's gradient cast as the hook casts it; `divide_first`: divided by the world size
// before the sum (the compress hooks) rather than after (a wrapped allreduce_hook). The sums are
// exact in float64 and float32 alike (bounded coefficients), then rounded once to `dtype`.
std::vector<Tensor> cast_average(Weights& net, int ranks, DType dtype, bool divide_first) {
  std::vector<Tensor> total;
  for (int q = 0; q < ranks; ++q) {
    std::vector<Tensor> c = coefficients(net, q, 0, true);
    for (size_t k = 0; k < c.size(); ++k) {
      Tensor h = c[k].to(dtype).to(kFloat64);
      if (divide_first) h = (h / static_cast<double>(ranks)).to(dtype).to(kFloat64);
      total.size() <= k ? total.push_back(h) : void(total[k] = total[k] + h);
    }
  }
  for (Tensor& t : total) t = (divide_first ? t : t / static_cast<double>(ranks)).to(dtype).to(kFloat64);
  return total;
}

TEST(DdpCommHooks, HalfCompressionHooksEqualTheAverageOfTheCasts) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  struct Case {
    const char* name;
    DType dtype;
    bool divide_first;
    std::function<void(dist::DistributedDataParallel&)> registers;
  };
  const std::vector<Case> cases = {
      {"fp16_compress_hook", kFloat16, true,
       [](auto& d) { d.register_comm_hook(nullptr, hooks::fp16_compress_hook); }},
      {"bf16_compress_hook", kBFloat16, true,
       [](auto& d) { d.register_comm_hook(nullptr, hooks::bf16_compress_hook); }},
      {"fp16_compress_wrapper", kFloat16, false,
       [](auto& d) { d.register_comm_hook(nullptr, hooks::fp16_compress_wrapper(hooks::allreduce_hook)); }},
      {"bf16_compress_wrapper", kBFloat16, false,
       [](auto& d) { d.register_comm_hook(nullptr, hooks::bf16_compress_wrapper(hooks::allreduce_hook)); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Weights net(3);
    dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
    c.registers(ddp);
    backward(ddp, net, r, 0, true);
    const auto want = cast_average(net, n, c.dtype, c.divide_first), got = grads(net);
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(got[k].dtype(), kFloat64);
      EXPECT_TRUE(equal(got[k], want[k])) << "param " << k;
    }
    // the cast is felt: the exact float64 average differs somewhere
    const auto exact = cast_average(net, n, kFloat64, false);
    bool differs = false;
    for (size_t k = 0; k < exact.size(); ++k) differs = differs || !equal(got[k], exact[k]);
    EXPECT_TRUE(differs);
  }
}

// A hook of its own: it sees each bucket once, in order, with the rank's local gradients laid end
// to end at `offsets` in `buffer`; the value of its chained future (here the sum, halved by a
// `then` step) is what DDP writes into .grad, before a bucket hook runs; its state is the
// shared_ptr it was registered with.
TEST(DdpCommHooks, CustomHookSeesLocalBucketsAndItsFutureValueLands) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  Weights net(5);
  dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
  const auto buckets = ddp.bucket_assignment();
  const std::vector<Tensor> params = net.parameters(), local = coefficients(net, r, 0);
  auto calls = std::make_shared<std::vector<size_t>>();
  ddp.register_comm_hook(calls, [&](std::vector<size_t>& seen, dist::GradBucket& bucket) {
    seen.push_back(bucket.index);
    EXPECT_EQ(bucket.is_last, bucket.index + 1 == buckets.size());
    const auto& want = buckets.at(bucket.index);
    EXPECT_EQ(bucket.parameters.size(), want.size());
    EXPECT_EQ(bucket.buffer.dim(), 1);
    int64_t at = 0;
    for (size_t i = 0; i < want.size() && i < bucket.parameters.size(); ++i) {
      EXPECT_TRUE(bucket.parameters[i].is_same(params[want[i]]));
      EXPECT_EQ(bucket.offsets[i], at);
      EXPECT_TRUE(equal(bucket.gradient(i), local[want[i]]));
      at += params[want[i]].numel();
    }
    EXPECT_EQ(at, bucket.buffer.numel());
    Tensor sum = bucket.buffer.clone();
    return dist::CommFuture(sum, pg->allreduce(sum, dist::ReduceOp::Sum)).then([](const Tensor& v) {
      return v / 2.0;
    });
  });
  std::vector<Tensor> want;  // half the sum over the ranks
  for (size_t k = 0; k < params.size(); ++k) {
    Tensor sum = zeros_like(local[k]);
    for (int q = 0; q < n; ++q) sum = sum + coefficients(net, q, 0)[k];
    want.push_back(sum / 2.0);
  }
  // a bucket hook runs after the communication hook's value landed, in .grad and in the buffer
  std::vector<size_t> landed;
  ddp.register_bucket_hook([&](const dist::GradBucket& bucket) {
    landed.push_back(bucket.index);
    for (size_t i = 0; i < bucket.parameters.size(); ++i) {
      const size_t k = buckets[bucket.index][i];
      EXPECT_TRUE(allclose(params[k].grad(), want[k], 1e-14, 1e-14)) << "param " << k;
      EXPECT_TRUE(equal(bucket.gradient(i), params[k].grad())) << "param " << k;
    }
  });
  backward(ddp, net, r, 0);
  EXPECT_EQ(*calls, (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(landed, (std::vector<size_t>{0, 1, 2}));
  const auto got = grads(net);
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(allclose(got[k], want[k], 1e-14, 1e-14)) << "param " << k;
}

TEST(DdpCommHooks, BadRegistrationsRaise) {
  auto pg = dist_testing::group();
  Weights net(1);
  dist::DistributedDataParallel ddp(net);
  const char* op = "register_comm_hook";
  EXPECT_TRUE(testing::throws_with([&] { ddp.register_comm_hook(std::shared_ptr<dist::ProcessGroup>(),
                                                                 hooks::allreduce_hook); },
                                   {op, "state is null"}));
  EXPECT_TRUE(testing::throws_with([&] { ddp.register_comm_hook(nullptr, std::function<dist::CommFuture(
                                                                    dist::ProcessGroup&, dist::GradBucket&)>()); },
                                   {op, "hook is empty"}));
  ddp.register_comm_hook(nullptr, hooks::allreduce_hook);
  EXPECT_TRUE(testing::throws_with([&] { ddp.register_comm_hook(nullptr, hooks::fp16_compress_hook); },
                                   {op, "registered already"}));
  // after a backward, even one under no_sync that communicated nothing
  Weights net2(1);
  dist::DistributedDataParallel ddp2(net2);
  {
    auto guard = ddp2.no_sync();
    backward(ddp2, net2, pg->rank(), 0);
  }
  EXPECT_TRUE(testing::throws_with([&] { ddp2.register_comm_hook(nullptr, hooks::allreduce_hook); },
                                   {op, "before the first backward"}));
}

// A future whose value does not fit the bucket raises from backward() on every rank alike,
// after the other buckets are written; so does an empty future.
TEST(DdpCommHooks, ABadFutureRaisesFromBackward) {
  auto pg = dist_testing::group();
  const int r = pg->rank();
  Weights net(2), ref(2);
  dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
  dist::DistributedDataParallel plain(ref, {.bucket_cap_mb = kBucketCapMb});
  ddp.register_comm_hook(nullptr, [](dist::ProcessGroup& group, dist::GradBucket& bucket) {
    dist::CommFuture avg = hooks::allreduce_hook(group, bucket);
    if (bucket.index != 1) return avg;
    return avg.then([](const Tensor& v) { return v.narrow(0, 0, v.numel() - 1); });
  });
  EXPECT_TRUE(testing::throws_with([&] { backward(ddp, net, r, 0); },
                                   {"communication hook's future for bucket 1", "expected a tensor of"}));
  backward(plain, ref, r, 0);
  const auto buckets = ddp.bucket_assignment();
  const std::vector<Tensor> params = net.parameters(), ref_params = ref.parameters();
  for (size_t b : {size_t{0}, size_t{2}})
    for (size_t k : buckets[b]) EXPECT_TRUE(equal(params[k].grad(), ref_params[k].grad())) << "param " << k;

  Weights net3(2);
  dist::DistributedDataParallel ddp3(net3);
  ddp3.register_comm_hook(nullptr, [](dist::ProcessGroup&, dist::GradBucket&) { return dist::CommFuture(); });
  EXPECT_TRUE(testing::throws_with([&] { backward(ddp3, net3, r, 0); }, {"empty future"}));
}

// A hook that raises (on every rank, at bucket 1) makes backward() raise; the next backward,
// whose hook does not, gives the plain average.
TEST(DdpCommHooks, AHookThatRaisesLeavesTheNextPassWorking) {
  auto pg = dist_testing::group();
  const int r = pg->rank();
  Weights net(6), ref(6);
  dist::DistributedDataParallel ddp(net, {.bucket_cap_mb = kBucketCapMb});
  dist::DistributedDataParallel plain(ref, {.bucket_cap_mb = kBucketCapMb});
  auto fail = std::make_shared<bool>(true);
  ddp.register_comm_hook(fail, [&pg](bool& raise, dist::GradBucket& bucket) {
    if (raise && bucket.index == 1) throw Error("hook failed");
    return hooks::allreduce_hook(*pg, bucket);
  });
  EXPECT_TRUE(testing::throws_with([&] { backward(ddp, net, r, 0); }, {"hook failed"}));
  *fail = false;
  net.zero_grad();
  backward(ddp, net, r, 1);
  backward(plain, ref, r, 1);
  const auto got = grads(net), want = grads(ref);
  for (size_t k = 0; k < want.size(); ++k) EXPECT_TRUE(equal(got[k], want[k])) << "param " << k;
}

}  // namespace
}  // namespace strata
