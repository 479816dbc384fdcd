// The MPI process group under mpirun (2 and 4 ranks): every collective in every dtype and in
// contiguous and strided layouts, against the closed-form result of rank-dependent inputs
// computed here in float64; async operations; a send/recv ring with tags; local argument
// errors. Every rank runs every test, so the collectives line up.
#include <chrono>
#include <cstdlib>
#include <thread>

#include "dist/collective_values.h"

namespace strata {
namespace {

using namespace dist_testing;  // NOLINT: the value helpers

TEST(Collectives, RankAndSizeComeFromTheLauncher) {
  auto pg = dist_testing::group();
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  ASSERT_TRUE(rank && size) << "run under mpirun";
  EXPECT_EQ(pg->rank(), std::atoi(rank));
  EXPECT_EQ(pg->size(), std::atoi(size));
  EXPECT_EQ(dist::get_rank(), pg->rank());
  EXPECT_EQ(dist::get_world_size(), pg->size());
  EXPECT_EQ(pg->backend(), "mpi");
  EXPECT_TRUE(dist::is_available("mpi"));
}

TEST(Collectives, AllReduceEveryOpDTypeAndLayout) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min})
    for (DType d : kAllDTypes)
      for (Layout layout : kLayouts) {
        if (op == ReduceOp::Avg && !is_floating(d)) continue;
        SCOPED_TRACE(fmt::format("{} {} {}", op_name(op), d, testing::layout_name(layout)));
        Tensor t = make([&](int64_t i) { return value_for(op, r, i, d); }, d, layout);
        const bool strided = !t.is_contiguous();
        dist::all_reduce(t, op);
        EXPECT_EQ(t.is_contiguous(), !strided);  // written back into the caller's own view
        EXPECT_EQ(values(t), expect([&](int64_t i) { return reduced(op, n, i, d); }, d));
      }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  auto pg = dist_testing::group();
  for (int root = 0; root < pg->size(); ++root)
    for (DType d : kAllDTypes)
      for (Layout layout : kLayouts) {
        SCOPED_TRACE(fmt::format("root {} {} {}", root, d, testing::layout_name(layout)));
        Tensor t = make([&](int64_t i) { return general_value(pg->rank(), i, d); }, d, layout);
        dist::broadcast(t, root);
        EXPECT_EQ(values(t), expect([&](int64_t i) { return general_value(root, i, d); }, d));
      }
}

TEST(Collectives, AllGather) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  for (DType d : kAllDTypes)
    for (Layout layout : kLayouts) {
      SCOPED_TRACE(fmt::format("{} {}", d, testing::layout_name(layout)));
      Tensor input = make([&](int64_t i) { return general_value(pg->rank(), i, d); }, d, layout);
      std::vector<Tensor> outputs;
      for (int k = 0; k < n; ++k) outputs.push_back(make([](int64_t) { return 0.0; }, d, layout));
      dist::all_gather(outputs, input);
      for (int k = 0; k < n; ++k)
        EXPECT_EQ(values(outputs[k]), expect([&](int64_t i) { return general_value(k, i, d); }, d)) << "from " << k;
    }
}

TEST(Collectives, ReduceScatter) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  const int64_t stride = checked_numel(kShape);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Product, ReduceOp::Max, ReduceOp::Min})
    for (DType d : kAllDTypes)
      for (Layout layout : kLayouts) {
        if (op == ReduceOp::Avg && !is_floating(d)) continue;
        SCOPED_TRACE(fmt::format("{} {} {}", op_name(op), d, testing::layout_name(layout)));
        // input k of rank r holds value_for(op, r, k * stride + i): each rank's part differs
        std::vector<Tensor> inputs;
        for (int k = 0; k < n; ++k)
          inputs.push_back(make([&](int64_t i) { return value_for(op, r, k * stride + i, d); }, d, layout));
        Tensor output = make([](int64_t) { return 0.0; }, d, layout);
        dist::reduce_scatter(output, inputs, op);
        EXPECT_EQ(values(output), expect([&](int64_t i) { return reduced(op, n, r * stride + i, d); }, d));
      }
}

TEST(Collectives, AsyncOperationsCompleteInOrder) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  std::vector<Tensor> ts;
  std::vector<std::shared_ptr<dist::Work>> works;
  for (int k = 0; k < 8; ++k) {
    ts.push_back(full({1000 + k}, static_cast<double>(pg->rank() + k), TensorOptions(kFloat64)));
    works.push_back(dist::all_reduce(ts.back(), ReduceOp::Sum, nullptr, /*async_op=*/true));
    ASSERT_NE(works.back(), nullptr);
  }
  Tensor big = ones({1 << 20}, TensorOptions(kFloat32));
  auto big_work = pg->allreduce(big, ReduceOp::Avg);
  while (!works.back()->is_completed()) std::this_thread::yield();
  for (int k = 0; k < 8; ++k) {
    works[k]->wait();
    works[k]->wait();  // waiting twice is harmless and divides nothing twice
    const double expected = n * (n - 1) / 2.0 + n * k;
    EXPECT_EQ(values(ts[k]), std::vector<double>(1000 + k, expected)) << k;
  }
  big_work->wait();
  EXPECT_EQ(big.min().item<float>(), 1.0f);
  EXPECT_EQ(big.max().item<float>(), 1.0f);
}

// Two threads waiting on one Work: neither returns before the result is written back into
// the caller's strided view (the second waiter must not see the first one's copy half done).
TEST(Collectives, EveryWaiterSeesTheWrittenBackResult) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  for (int round = 0; round < 4; ++round) {
    Tensor base = full({2048, 2048}, pg->rank() + 1.0, TensorOptions(kFloat64));
    Tensor t = base.narrow(1, 0, 1024);  // strided: reduced in a copy, written back on wait
    auto work = pg->allreduce(t, ReduceOp::Sum);
    const double* last = base.data_ptr<double>() + 2047 * 2048 + 1023;  // the last element written back
    double seen[2] = {0, 0};
    std::thread other([&] {
      work->wait();
      seen[1] = *last;
    });
    work->wait();
    seen[0] = *last;
    other.join();
    EXPECT_EQ(seen[0], n * (n + 1) / 2.0) << round;
    EXPECT_EQ(seen[1], n * (n + 1) / 2.0) << round;
  }
}

TEST(Collectives, SendRecvRingWithTags) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(fmt::format("{}", d));
    // two messages to the next rank, tags 1 and 2; received in the opposite order, into
    // strided tensors
    Tensor a = make([&](int64_t i) { return general_value(r, i, d); }, d, Layout::Transposed);
    Tensor b = make([&](int64_t i) { return general_value(r + 1, i, d); }, d, Layout::Contiguous);
    Tensor got_a = make([](int64_t) { return 0.0; }, d, Layout::Sliced);
    Tensor got_b = make([](int64_t) { return 0.0; }, d, Layout::Transposed);
    auto s1 = dist::isend(a, next, nullptr, 1);
    auto s2 = dist::isend(b, next, nullptr, 2);
    auto r2 = dist::irecv(got_b, prev, nullptr, 2);
    dist::recv(got_a, prev, nullptr, 1);
    r2->wait();
    s1->wait();
    s2->wait();
    EXPECT_EQ(values(got_a), expect([&](int64_t i) { return general_value(prev, i, d); }, d));
    EXPECT_EQ(values(got_b), expect([&](int64_t i) { return general_value(prev + 1, i, d); }, d));
  }
}

TEST(Collectives, DroppedReceiveIsCancelled) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  Tensor lost = zeros({4}, TensorOptions(kInt64));
  {
    auto dropped = dist::irecv(lost, prev, nullptr, 7);
    EXPECT_FALSE(dropped->is_completed());
  }  // dropped unmatched: cancelled, not waited for (which would hang)
  dist::barrier();
  // a later message with the same tag goes to the receive posted for it
  Tensor got = zeros({4}, TensorOptions(kInt64));
  auto s = dist::isend(full({4}, r + 1, TensorOptions(kInt64)), next, nullptr, 7);
  dist::recv(got, prev, nullptr, 7);
  s->wait();
  EXPECT_EQ(values(got), std::vector<double>(4, prev + 1));
  EXPECT_EQ(values(lost), std::vector<double>(4, 0));
}

TEST(Collectives, BarrierWaitsForTheLastRank) {
  auto pg = dist_testing::group();
  if (pg->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  dist::barrier();
  const auto start = std::chrono::steady_clock::now();
  if (pg->rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  dist::barrier();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.2) << "rank " << pg->rank() << " left the barrier before rank 0 entered it";
}

TEST(Collectives, LocalMistakesRaiseBeforeAnythingIsSent) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  Tensor f = zeros({3}, TensorOptions(kFloat32));
  auto raises = [](auto&& call, const char* needle) { EXPECT_TRUE(testing::throws_with(call, {needle})); };
  raises([&] { dist::all_reduce(zeros({3}, TensorOptions(kInt64)), ReduceOp::Avg); }, "floating dtype");
  raises([&] { dist::all_reduce(Tensor()); }, "undefined");
  raises([&] { dist::broadcast(f, n); }, "root rank");
  raises([&] { dist::broadcast(f, -1); }, "out of range");
  raises([&] { dist::send(f, n); }, "destination rank");
  raises([&] { dist::recv(f, -1); }, "source rank");
  raises([&] { dist::send(f, pg->rank()); }, "itself");
  raises([&] { dist::send(f, (pg->rank() + 1) % n, nullptr, -1); }, "tag");
  std::vector<Tensor> wrong_count(static_cast<size_t>(n + 1), f);
  raises([&] { dist::all_gather(wrong_count, f); }, "output tensors given");
  std::vector<Tensor> wrong_dtype(static_cast<size_t>(n), zeros({3}, TensorOptions(kFloat64)));
  raises([&] { dist::all_gather(wrong_dtype, f); }, "float64");
  std::vector<Tensor> wrong_shape(static_cast<size_t>(n), zeros({4}, TensorOptions(kFloat32)));
  raises([&] { dist::reduce_scatter(f, wrong_shape); }, "[4]");
  raises([&] { dist::init_process_group("mpi"); }, "exists already");
  raises([&] { dist::init_process_group("gloo"); }, "unknown backend");
  // the group still works afterwards
  Tensor one = ones({2}, TensorOptions(kInt32));
  dist::all_reduce(one);
  EXPECT_EQ(values(one), std::vector<double>(2, n));
}

TEST(Collectives, NewGroupsHaveTheirOwnCommunicator) {
  auto pg = dist_testing::group();
  auto other = dist::new_mpi_group();
  EXPECT_EQ(other->rank(), pg->rank());
  EXPECT_EQ(other->size(), pg->size());
  // interleaved async traffic on the two groups does not mix
  Tensor a = full({5}, pg->rank() + 1.0, TensorOptions(kFloat64));
  Tensor b = full({5}, 10.0 * (pg->rank() + 1), TensorOptions(kFloat64));
  auto wa = pg->allreduce(a, ReduceOp::Max);
  auto wb = other->allreduce(b, ReduceOp::Sum);
  wb->wait();
  wa->wait();
  const int n = pg->size();
  EXPECT_EQ(values(a), std::vector<double>(5, n));
  EXPECT_EQ(values(b), std::vector<double>(5, 10.0 * n * (n + 1) / 2));
}


// Creating a group is collective over MPI's world: it must queue behind the collectives already
// in flight on the communication thread, or a rank whose communication thread holds MPI (inside
// an allreduce) and a rank whose own thread holds it (inside the group's creation) wait for each
// other forever. Rank 1 lets its allreduce start first; rank 0 creates the group at once.
TEST(Collectives, NewGroupWhileAnAllReduceIsInFlight) {
  auto pg = dist_testing::group();
  if (pg->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int round = 0; round < 3; ++round) {
    Tensor t = full({64}, pg->rank() + 1.0, TensorOptions(kFloat64));
    auto work = pg->allreduce(t, ReduceOp::Sum);
    if (pg->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto other = dist::new_mpi_group();
    work->wait();
    const int n = pg->size();
    EXPECT_EQ(values(t), std::vector<double>(64, n * (n + 1) / 2.0));
    EXPECT_EQ(other->size(), n);
  }
}

}  // namespace
}  // namespace strata
