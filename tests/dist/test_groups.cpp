// Subgroups (dist::new_group) and device meshes under mpirun (2 and 4 ranks): the even and the
// odd ranks reduce independently, a rank outside a group gets a handle that raises, ranks
// translate between group and world; a (size/2) x 2 mesh's row and column groups and a 3-D
// mesh's coordinates, each checked against sums over the ranks computed here.
#include <algorithm>
#include <chrono>
#include <thread>

#include "dist/dist_testing.h"

namespace strata {
namespace {

using dist::ReduceOp;
using testing::values;

auto raises = [](auto&& call, const char* needle) { EXPECT_TRUE(testing::throws_with(call, {needle})); };

// The ranks of the world with parity p.
std::vector<int> parity_ranks(int n, int p) {
  std::vector<int> ranks;
  for (int r = p; r < n; r += 2) ranks.push_back(r);
  return ranks;
}

TEST(Groups, EvenAndOddRanksReduceIndependently) {
  auto world = dist_testing::group();
  const int r = world->rank(), n = world->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  // every rank creates both, in the same order; the odd list is given out of order
  auto evens = dist::new_group(parity_ranks(n, 0));
  std::vector<int> odd_list = parity_ranks(n, 1);
  std::reverse(odd_list.begin(), odd_list.end());
  auto odds = dist::new_group(odd_list);
  auto mine = r % 2 == 0 ? evens : odds, other = r % 2 == 0 ? odds : evens;
  const std::vector<int> members = parity_ranks(n, r % 2);
  ASSERT_TRUE(mine->is_member());
  EXPECT_EQ(mine->rank(), r / 2);  // group ranks follow the sorted global ranks
  EXPECT_EQ(mine->size(), static_cast<int>(members.size()));
  EXPECT_EQ(mine->global_ranks(), members);
  EXPECT_EQ(mine->backend(), "mpi");

  // async on the own group, interleaved with the world: the values never mix
  Tensor t = full({7}, r + 1.0, TensorOptions(kFloat64));
  Tensor w = full({7}, r + 1.0, TensorOptions(kFloat64));
  auto work = dist::all_reduce(t, ReduceOp::Sum, mine, true);
  dist::all_reduce(w, ReduceOp::Max);
  work->wait();
  double sum = 0;
  for (int m : members) sum += m + 1;
  EXPECT_EQ(values(t), std::vector<double>(7, sum));
  EXPECT_EQ(values(w), std::vector<double>(7, n));

  // a rooted collective takes the destination as a group rank
  const int last = mine->size() - 1;
  Tensor g = full({2}, static_cast<double>(r), TensorOptions(kInt64));
  std::vector<Tensor> gathered;
  if (mine->rank() == last)
    for (size_t k = 0; k < members.size(); ++k) gathered.push_back(zeros({2}, TensorOptions(kInt64)));
  dist::gather(g, gathered, last, mine);
  for (size_t k = 0; k < gathered.size(); ++k) EXPECT_EQ(values(gathered[k]), std::vector<double>(2, members[k]));

  // rank translation
  for (size_t k = 0; k < members.size(); ++k) {
    EXPECT_EQ(dist::get_global_rank(mine, static_cast<int>(k)), members[k]);
    EXPECT_EQ(dist::get_group_rank(mine, members[k]), static_cast<int>(k));
  }
  raises([&] { dist::get_group_rank(mine, (r + 1) % n); }, "not a member");
  raises([&] { dist::get_global_rank(mine, mine->size()); }, "out of range");

  // the other group's handle refuses everything, naming the group
  EXPECT_FALSE(other->is_member());
  EXPECT_EQ(other->rank(), -1);
  EXPECT_EQ(other->size(), -1);
  EXPECT_EQ(other->global_ranks(), parity_ranks(n, 1 - r % 2));
  raises([&] { dist::all_reduce(t, ReduceOp::Sum, other); }, "not a member of the group of global ranks");
  raises([&] { dist::barrier(other); }, "[barrier] this rank is not a member");
  raises([&] { dist::broadcast(t, 0, other); }, "not a member");
}

TEST(Groups, BadRankListsRaise) {
  auto world = dist_testing::group();
  const int n = world->size();
  raises([&] { dist::new_group({}); }, "empty");
  raises([&] { dist::new_group({0, n}); }, "out of range");
  raises([&] { dist::new_group({0, 0}); }, "listed twice");
}

// Creating a group is collective over the world: it queues behind the world's collectives in
// flight on the communication thread (see Collectives.NewGroupWhileAnAllReduceIsInFlight).
TEST(Groups, NewGroupWhileAnAllReduceIsInFlight) {
  auto world = dist_testing::group();
  const int n = world->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int round = 0; round < 3; ++round) {
    Tensor t = full({64}, world->rank() + 1.0, TensorOptions(kFloat64));
    auto work = world->allreduce(t, ReduceOp::Sum);
    if (world->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto pair = dist::new_group({0, 1});
    work->wait();
    EXPECT_EQ(values(t), std::vector<double>(64, n * (n + 1) / 2.0));
    EXPECT_EQ(pair->is_member(), world->rank() < 2);
  }
}

TEST(DeviceMesh, RowsAndColumnsOfATwoColumnMesh) {
  auto world = dist_testing::group();
  const int r = world->rank(), n = world->size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int rows = n / 2;
  auto mesh = dist::init_device_mesh("cpu", {rows, 2}, {"dp", "tp"});
  const int row = r / 2, col = r % 2;
  EXPECT_EQ(mesh.get_coordinate(), (std::vector<int>{row, col}));
  EXPECT_EQ(mesh.get_local_rank("dp"), row);
  EXPECT_EQ(mesh.get_local_rank(1), col);
  EXPECT_EQ(mesh.size(), n);
  EXPECT_EQ(mesh.size(0), rows);
  EXPECT_EQ(mesh.rank_at({row, col}), r);
  auto tp = mesh.get_group("tp"), dp = mesh.get_group("dp");
  EXPECT_EQ(tp->global_ranks(), (std::vector<int>{2 * row, 2 * row + 1}));
  std::vector<int> column;
  for (int i = 0; i < rows; ++i) column.push_back(2 * i + col);
  EXPECT_EQ(dp->global_ranks(), column);
  EXPECT_EQ(tp->rank(), col);
  EXPECT_EQ(dp->rank(), row);

  Tensor a = full({3}, static_cast<double>(r), TensorOptions(kFloat32));
  Tensor b = full({3}, static_cast<double>(r), TensorOptions(kFloat32));
  auto wa = dist::all_reduce(a, ReduceOp::Sum, tp, true);
  auto wb = dist::all_reduce(b, ReduceOp::Sum, dp, true);
  wb->wait();
  wa->wait();
  double column_sum = 0;
  for (int c : column) column_sum += c;
  EXPECT_EQ(values(a), std::vector<double>(3, 4.0 * row + 1));  // 2 row + (2 row + 1)
  EXPECT_EQ(values(b), std::vector<double>(3, column_sum));
}

TEST(DeviceMesh, ThreeDimsAndBadShapes) {
  auto world = dist_testing::group();
  const int r = world->rank(), n = world->size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  auto mesh = dist::init_device_mesh("cpu", {1, n / 2, 2}, {"pp", "dp", "tp"});
  EXPECT_EQ(mesh.get_coordinate(), (std::vector<int>{0, r / 2, r % 2}));
  auto pp = mesh.get_group("pp");
  EXPECT_EQ(pp->size(), 1);
  EXPECT_EQ(pp->global_ranks(), std::vector<int>{r});
  Tensor t = full({2}, r + 5.0, TensorOptions(kFloat64));
  dist::all_reduce(t, ReduceOp::Sum, pp);  // a group of one: unchanged
  EXPECT_EQ(values(t), std::vector<double>(2, r + 5.0));
  EXPECT_EQ(mesh.get_group(2)->global_ranks(), mesh.get_group("tp")->global_ranks());

  raises([&] { dist::DeviceMesh({n, 2}); }, "holds");
  raises([&] { dist::DeviceMesh({n}, {"dp", "tp"}); }, "2 dim names given for 1 dims");
  raises([&] { dist::DeviceMesh({n, 1}, {"dp", "dp"}); }, "given twice");
  raises([&] { dist::DeviceMesh({n, 1, 1, 1}); }, "1, 2 or 3 dims");
  raises([&] { dist::DeviceMesh({n, 0}); }, "at least one rank");
  raises([&] { mesh.get_group("sp"); }, "no dim named 'sp'");
  raises([&] { mesh.get_local_rank(3); }, "out of range");
  raises([&] { dist::init_device_mesh("cuda", {n}); }, "needs the nccl backend");
  raises([&] { dist::init_device_mesh("tpu", {n}); }, "unknown device type");
}

}  // namespace
}  // namespace strata
