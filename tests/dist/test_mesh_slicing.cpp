// Slicing a device mesh under mpirun -np 4: on a 2 x 2 ("dp", "tp") mesh and a 1 x 2 x 2
// ("pp", "dp", "tp") one, mesh["dp"] and mesh.slice({...}) hold the ranks that share this rank's
// other coordinates (worked out here from the row-major layout), in order; their groups are the
// parent's and reduce over exactly those ranks; nested slices agree; bad names raise. Flattening
// (torch's _flatten) makes a 1-D mesh with a group of its own over the product of some dims.
#include <optional>

#include "dist/dist_testing.h"

namespace strata {
namespace {

// The sum over `group` of each member's global rank, by an allreduce on it.
int64_t sum_of_ranks(const std::shared_ptr<dist::ProcessGroup>& group) {
  Tensor t = full({1}, static_cast<double>(dist::get_rank()), TensorOptions(kInt64));
  group->allreduce(t)->wait();
  return t.item<int64_t>();
}

TEST(DeviceMeshSlicing, RowsAndColumnsOfATwoByTwoMesh) {
  auto world = dist_testing::group();
  ASSERT_EQ(world->size(), 4) << "run with mpirun -np 4";
  const int r = world->rank(), i = r / 2, j = r % 2;  // r = 2 * dp + tp
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  EXPECT_EQ(mesh.get_rank(), r);
  EXPECT_EQ(mesh.ranks(), (std::vector<int>{0, 1, 2, 3}));

  dist::DeviceMesh dp = mesh["dp"];  // the column of ranks with this rank's tp index
  EXPECT_EQ(dp.ndim(), 1);
  EXPECT_EQ(dp.shape(), std::vector<int>{2});
  EXPECT_EQ(dp.mesh_dim_names(), std::vector<std::string>{"dp"});
  EXPECT_EQ(dp.ranks(), (std::vector<int>{j, 2 + j}));
  EXPECT_EQ(dp.get_coordinate(), std::vector<int>{i});
  EXPECT_EQ(dp.get_local_rank(), i);
  EXPECT_EQ(dp.get_local_rank("dp"), mesh.get_local_rank("dp"));
  EXPECT_EQ(dp.get_rank(), r);
  EXPECT_EQ(dp.rank_at({1}), 2 + j);
  EXPECT_EQ(dp.get_group(), mesh.get_group("dp"));  // the parent's group, not a new one
  EXPECT_EQ(sum_of_ranks(dp.get_group()), j + (2 + j));

  dist::DeviceMesh tp = mesh.slice({"tp"});  // the row
  EXPECT_EQ(tp.ranks(), (std::vector<int>{2 * i, 2 * i + 1}));
  EXPECT_EQ(tp.get_local_rank(), j);
  EXPECT_EQ(sum_of_ranks(tp.get_group("tp")), 2 * i + (2 * i + 1));

  dist::DeviceMesh both = mesh.slice({"dp", "tp"});
  EXPECT_EQ(both.shape(), mesh.shape());
  EXPECT_EQ(both.ranks(), mesh.ranks());
  EXPECT_EQ(both.get_coordinate(), mesh.get_coordinate());
  EXPECT_EQ(both.get_all_groups(), mesh.get_all_groups());
}

// A slice holds the parent's groups itself: it works on once the parent is gone.
TEST(DeviceMeshSlicing, ASliceOutlivesItsParent) {
  auto world = dist_testing::group();
  ASSERT_EQ(world->size(), 4) << "run with mpirun -np 4";
  const int r = world->rank(), j = r % 2;
  std::optional<dist::DeviceMesh> dp;
  {
    auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    dp = mesh["dp"];
  }
  EXPECT_EQ(dp->ranks(), (std::vector<int>{j, 2 + j}));
  EXPECT_EQ(dp->get_rank(), r);
  EXPECT_EQ(sum_of_ranks(dp->get_group()), j + (2 + j));
}

TEST(DeviceMeshSlicing, ThreeDimsNestedSlicesAndErrors) {
  auto world = dist_testing::group();
  ASSERT_EQ(world->size(), 4) << "run with mpirun -np 4";
  const int r = world->rank(), i = r / 2, j = r % 2;  // r = 4 * pp + 2 * dp + tp, pp = 0
  auto mesh = dist::init_device_mesh("cpu", {1, 2, 2}, {"pp", "dp", "tp"});
  dist::DeviceMesh pp_tp = mesh.slice({"pp", "tp"});
  EXPECT_EQ(pp_tp.shape(), (std::vector<int>{1, 2}));
  EXPECT_EQ(pp_tp.mesh_dim_names(), (std::vector<std::string>{"pp", "tp"}));
  EXPECT_EQ(pp_tp.ranks(), (std::vector<int>{2 * i, 2 * i + 1}));
  EXPECT_EQ(pp_tp.get_coordinate(), (std::vector<int>{0, j}));
  EXPECT_EQ(pp_tp.rank_at({0, 1}), 2 * i + 1);
  EXPECT_EQ(pp_tp.get_group(1), mesh.get_group("tp"));
  EXPECT_EQ(sum_of_ranks(pp_tp.get_group("tp")), 4 * i + 1);
  dist::DeviceMesh dp_tp = mesh.slice({"dp", "tp"});
  EXPECT_EQ(dp_tp.ranks(), (std::vector<int>{0, 1, 2, 3}));
  dist::DeviceMesh dp = dp_tp["dp"];  // a slice of a slice
  EXPECT_EQ(dp.ranks(), (std::vector<int>{j, 2 + j}));
  EXPECT_EQ(dp.get_group(), mesh.get_group("dp"));
  EXPECT_EQ(sum_of_ranks(dp.get_group()), 2 * j + 2);

  auto raises = [](auto&& call, std::initializer_list<const char*> needles) {
    EXPECT_TRUE(testing::throws_with(call, needles));
  };
  raises([&] { mesh.slice({"tp", "dp"}); }, {"[DeviceMesh]", "in the mesh's order", "'dp' after 'tp'"});
  raises([&] { mesh.slice({"dp", "dp"}); }, {"once each"});
  raises([&] { mesh["ep"]; }, {"no dim named 'ep'", "'pp', 'dp', 'tp'"});
  raises([&] { mesh.slice({}); }, {"at least one dim"});
  raises([&] { mesh.get_group(); }, {"1-D mesh", "3 dims"});
  raises([&] { pp_tp.get_local_rank(); }, {"1-D mesh"});
  raises([&] { dp.rank_at({2}); }, {"outside shape"});
  auto unnamed = dist::init_device_mesh("cpu", {2, 2});
  raises([&] { unnamed["dp"]; }, {"unnamed"});
}

TEST(DeviceMeshFlatten, FlattenedDimsGetTheirOwnGroup) {
  auto world = dist_testing::group();
  ASSERT_EQ(world->size(), 4) << "run with mpirun -np 4";
  const int r = world->rank(), i = r / 2, j = r % 2;  // r = 4 * pp + 2 * dp + tp, pp = 0
  auto mesh = dist::init_device_mesh("cpu", {1, 2, 2}, {"pp", "dp", "tp"});
  dist::DeviceMesh dp_tp = mesh.slice({"dp", "tp"}).flatten();
  EXPECT_EQ(dp_tp.shape(), std::vector<int>{4});
  EXPECT_EQ(dp_tp.mesh_dim_names(), std::vector<std::string>{"dp_tp"});
  EXPECT_EQ(dp_tp.ranks(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(dp_tp.get_local_rank(), r);
  EXPECT_NE(dp_tp.get_group(), world);  // a group of its own
  EXPECT_EQ(sum_of_ranks(dp_tp.get_group()), 0 + 1 + 2 + 3);
  EXPECT_EQ(mesh["dp_tp"].get_group(), dp_tp.get_group());  // the parent finds it by name
  EXPECT_EQ(mesh.slice({"dp", "tp"}).flatten().get_group(), dp_tp.get_group());  // recorded, not made again

  dist::DeviceMesh pp_dp = mesh.slice({"pp", "dp"}).flatten("pp_dp");  // ranks {j, 2 + j}
  EXPECT_EQ(pp_dp.ranks(), (std::vector<int>{j, 2 + j}));
  EXPECT_EQ(pp_dp.get_local_rank(), i);
  EXPECT_EQ(sum_of_ranks(pp_dp.get_group()), 2 * j + 2);
  EXPECT_EQ(pp_dp.get_group()->global_ranks(), (std::vector<int>{j, 2 + j}));

  auto raises = [](auto&& call, std::initializer_list<const char*> needles) {
    EXPECT_TRUE(testing::throws_with(call, needles));
  };
  raises([&] { mesh.slice({"dp", "tp"}).flatten("pp_dp"); }, {"already names the flattened dims", "'pp', 'dp'"});
  raises([&] { mesh.flatten("tp"); }, {"already has a dim of that name"});
  raises([&] { mesh["tp"]["dp_tp"]; }, {"spans 'dp'"});
  // a dim of the mesh the slice came from cannot name a flattened one ("dp" would mean two groups)
  raises([&] { mesh["tp"].flatten("dp"); }, {"already has a dim of that name"});
  EXPECT_EQ(mesh["dp"].get_group(), mesh.get_group(1));

  raises([&] { dist::init_device_mesh("cpu", {2, 2}).flatten(); }, {"without dim names needs a name"});
}

}  // namespace
}  // namespace strata
