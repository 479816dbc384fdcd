// Timeouts of process groups under mpirun (2 and 4 ranks). The last rank skips a collective (or
// a send): the others' waits raise within the group's timeout, naming the operation, its
// sequence number, the group, the rank and the time waited, and the group then refuses every
// operation. So that every rank can finalize MPI, the skipping rank then calls the collective
// late: it completes the others' calls, which stay in MPI (MPI cannot cancel them).
// Also: the timeout options and STRATA_DIST_TIMEOUT, and the latency of a normal allreduce next
// to MPI_Allreduce called directly (printed, not asserted).
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dist/dist_testing.h"

namespace strata {
namespace {

using dist::ReduceOp;
using std::chrono::milliseconds;
using testing::values;
using Clock = std::chrono::steady_clock;

std::string world_ranks(int n) {
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(r);
  return fmt::format("global ranks [{}]", fmt::join(ranks, ", "));
}

double micros_since(Clock::time_point start, int reps) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / reps;
}

// Runs first, while no timed-out operation is being polled, so MPI is called from here alone.
TEST(Timeouts, AllreduceLatencyNextToMpiDirectly) {
  auto world = dist_testing::group();
  const int n = world->size();
  for (int64_t numel : {int64_t{1}, int64_t{1} << 20}) {
    const int reps = numel == 1 ? 2000 : 20;
    Tensor t = ones({numel}, TensorOptions(kFloat32));
    dist::all_reduce(t);  // warm up both paths
    dist::barrier();
    auto start = Clock::now();
    for (int i = 0; i < reps; ++i) dist::all_reduce(t);
    const double ours = micros_since(start, reps);
    dist::barrier();
    std::vector<float> raw(static_cast<size_t>(numel), 1.0f);
    MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(numel), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    start = Clock::now();
    for (int i = 0; i < reps; ++i)
      MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(numel), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double direct = micros_since(start, reps);
    if (world->rank() == 0)
      std::printf("[timing] %d ranks, allreduce of %lld float32: dist::all_reduce %.1f us, MPI_Allreduce %.1f us\n", n,
                  static_cast<long long>(numel), ours, direct);
    // the values are still right after all the repetitions: n^(reps + 1) for every element
    const double expected = std::pow(static_cast<double>(n), reps + 1);
    EXPECT_DOUBLE_EQ(values(t)[0], expected);
    EXPECT_DOUBLE_EQ(values(t)[static_cast<size_t>(numel - 1)], expected);
  }
}

TEST(Timeouts, OptionsAndEnvironment) {
  auto world = dist_testing::group();
  const int n = world->size();
  unsetenv("STRATA_DIST_TIMEOUT");
  EXPECT_EQ(dist::default_timeout(), std::chrono::minutes(30));
  setenv("STRATA_DIST_TIMEOUT", "1.5", 1);
  EXPECT_EQ(dist::default_timeout(), milliseconds(1500));
  auto from_env = dist::new_group({0});  // collective over the world: every rank calls it
  if (world->rank() == 0) EXPECT_EQ(from_env->timeout(), milliseconds(1500));
  for (const char* bad : {"abc", "0", "-2", "5s"}) {
    setenv("STRATA_DIST_TIMEOUT", bad, 1);
    EXPECT_TRUE(testing::throws_with([] { dist::default_timeout(); }, {"STRATA_DIST_TIMEOUT", bad}));
  }
  unsetenv("STRATA_DIST_TIMEOUT");

  auto given = dist::new_group({0, n - 1}, milliseconds(2500));
  if (given->is_member()) EXPECT_EQ(given->timeout(), milliseconds(2500));
  EXPECT_TRUE(testing::throws_with([&] { dist::new_group({0}, milliseconds(0)); }, {"[new_group]", "positive"}));
  EXPECT_TRUE(testing::throws_with([&] { world->set_timeout(milliseconds(-1)); }, {"[set_timeout]", "positive"}));

  // the default group's timeout is init_process_group's option
  dist::destroy_process_group();
  dist::init_process_group("mpi", milliseconds(45000));
  EXPECT_EQ(dist::default_group()->timeout(), milliseconds(45000));
  EXPECT_FALSE(dist::default_group()->is_broken());

  // wait(timeout) on an operation that completes returns normally
  Tensor t = full({3}, 1.0, TensorOptions(kFloat64));
  dist::all_reduce(t, ReduceOp::Sum, nullptr, true)->wait(milliseconds(60000));
  EXPECT_EQ(values(t), std::vector<double>(3, n));
}

// The last rank skips an allreduce; the others time out; then it calls it late.
TEST(Timeouts, SkippedAllreduceTimesOutAndBreaksTheGroup) {
  auto world = dist_testing::group();
  const int r = world->rank(), n = world->size();
  auto group = dist::new_group(world->global_ranks(), milliseconds(1000));
  Tensor before = full({4}, r + 1.0, TensorOptions(kFloat64));
  dist::all_reduce(before, ReduceOp::Sum, group);  // SeqNum=1 completes on every rank
  EXPECT_EQ(values(before), std::vector<double>(4, n * (n + 1) / 2.0));

  Tensor t = full({4}, r + 1.0, TensorOptions(kFloat64));
  const bool skips = r == n - 1;
  if (!skips) {
    const auto start = Clock::now();
    EXPECT_TRUE(testing::throws_with([&] { dist::all_reduce(t, ReduceOp::Sum, group); },
                                     {"[all_reduce] timed out", "SeqNum=2", "mpi process group", world_ranks(n).c_str(),
                                      fmt::format("group rank {} (global rank {})", r, r).c_str(),
                                      "timeout of 1000 ms", "exit the process"}));
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_GE(waited, 0.99);
    EXPECT_LT(waited, 6.0);  // the timeout plus polling slack on a loaded machine
    // t's contents are unspecified now: MPI may have written partial sums into it in place
    EXPECT_TRUE(group->is_broken());
    Tensor u = ones({2}, TensorOptions(kFloat32));
    EXPECT_TRUE(testing::throws_with([&] { dist::all_reduce(u, ReduceOp::Sum, group); },
                                     {"[all_reduce] the process group is unusable", "SeqNum=2"}));
    EXPECT_TRUE(testing::throws_with([&] { dist::barrier(group); }, {"[barrier]", "unusable"}));
    EXPECT_TRUE(testing::throws_with([&] { dist::broadcast(u, 0, group); }, {"[broadcast]", "unusable"}));
    EXPECT_FALSE(world->is_broken());  // other groups are unaffected
  }
  if (skips) {
    // no world collective to learn that the others timed out: their communication threads are
    // inside the timed-out allreduce until this rank calls it (Note [Collective timeouts])
    std::this_thread::sleep_for(milliseconds(2500));
    EXPECT_FALSE(group->is_broken());
    dist::all_reduce(t, ReduceOp::Sum, group);  // late: completes the others' calls still in MPI
    EXPECT_EQ(values(t), std::vector<double>(4, n * (n + 1) / 2.0));
  }
  Tensor w = full({2}, r + 1.0, TensorOptions(kFloat64));
  dist::all_reduce(w, ReduceOp::Max);  // the world's collectives still work
  EXPECT_EQ(values(w), std::vector<double>(2, n));
}

// Nobody waits: the communication thread's watchdog fails the Work and breaks the group.
TEST(Timeouts, UnwaitedOperationIsExpiredByTheWatchdog) {
  auto world = dist_testing::group();
  const int r = world->rank(), n = world->size();
  auto pair = dist::new_group({0, n - 1}, milliseconds(300));
  Tensor t = full({5}, r + 1.0, TensorOptions(kFloat32));
  dist::barrier();  // start together
  if (r == 0) {
    auto work = dist::all_reduce(t, ReduceOp::Sum, pair, true);  // SeqNum=1; rank n-1 is not there yet
    std::this_thread::sleep_for(milliseconds(1200));
    EXPECT_TRUE(pair->is_broken());
    EXPECT_TRUE(work->is_completed());
    EXPECT_TRUE(testing::throws_with([&] { work->wait(); }, {"[all_reduce] timed out", "SeqNum=1", "300 ms"}));
    EXPECT_TRUE(testing::throws_with([&] { dist::send(t, 1, pair); }, {"[send]", "unusable"}));
  }
  if (r == n - 1) {
    std::this_thread::sleep_for(milliseconds(1800));  // past rank 0's checks
    dist::all_reduce(t, ReduceOp::Sum, pair);  // late: completes rank 0's still-running allreduce
    EXPECT_EQ(values(t), std::vector<double>(5, 1.0 + n));
  }
  dist::barrier();
}

// A receive whose sender never sends: wait(timeout) raises, and the dropped receive is cancelled.
TEST(Timeouts, ReceiveWithoutSenderTimesOutInWait) {
  auto world = dist_testing::group();
  const int r = world->rank(), n = world->size();
  auto pair = dist::new_group({0, n - 1});  // the default 30 minutes; the wait's own timeout applies
  if (r == 0) {
    Tensor t = zeros({3}, TensorOptions(kInt64));
    auto work = dist::irecv(t, 1, pair, 7);
    const auto start = Clock::now();
    EXPECT_TRUE(testing::throws_with([&] { work->wait(milliseconds(400)); },
                                     {"[recv] timed out", "SeqNum=1", "timeout of 400 ms"}));
    EXPECT_GE(std::chrono::duration<double>(Clock::now() - start).count(), 0.39);
    EXPECT_TRUE(pair->is_broken());
    EXPECT_TRUE(testing::throws_with([&] { work->wait(); }, {"[recv] timed out"}));  // the same error again
  }
  dist::barrier();
}

TEST(Timeouts, WaitRejectsNonPositiveTimeout) {
  auto world = dist_testing::group();
  Tensor t = ones({2}, TensorOptions(kFloat64));
  auto work = dist::all_reduce(t, ReduceOp::Sum, nullptr, true);
  EXPECT_TRUE(testing::throws_with([&] { work->wait(milliseconds(0)); }, {"[wait]", "positive"}));
  work->wait();
  EXPECT_EQ(values(t), std::vector<double>(2, world->size()));
}

}  // namespace
}  // namespace strata
