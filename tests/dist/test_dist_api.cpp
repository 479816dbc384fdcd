// The dist API in one process, without mpirun: what raises before a group exists, and the
// errors naming the build option of a backend missing from this build.
#include "testing.h"

namespace strata {
namespace {

using testing::throws_with;

TEST(DistApi, NothingWorksBeforeInitProcessGroup) {
  EXPECT_FALSE(dist::is_initialized());
  EXPECT_TRUE(throws_with([] { dist::default_group(); }, {"init_process_group"}));
  EXPECT_TRUE(throws_with([] { dist::get_rank(); }, {"no default process group"}));
  EXPECT_TRUE(throws_with([] { dist::all_reduce(zeros({2})); }, {"no default process group"}));
  nn::Linear layer(2, 2);
  EXPECT_TRUE(throws_with([&] { dist::DistributedDataParallel ddp(layer); }, {"no default process group"}));
  EXPECT_TRUE(throws_with([&] { dist::GPipe pipe(layer); }, {"no default process group"}));
  EXPECT_TRUE(throws_with([&] { dist::Schedule1F1B pipe(layer); }, {"no default process group"}));
  EXPECT_TRUE(throws_with([&] { dist::ScheduleInterleaved1F1B pipe({&layer}); }, {"no default process group"}));
  EXPECT_TRUE(throws_with([&] { dist::ZeroRedundancyOptimizer<optim::SGD> opt(layer.parameters()); },
                          {"no default process group"}));
  EXPECT_TRUE(throws_with([] { dist::ColumnParallelLinear(2, 2); }, {"no default process group"}));
  EXPECT_TRUE(throws_with([] { dist::init_process_group("gloo"); }, {"unknown backend 'gloo'"}));
  EXPECT_FALSE(dist::is_available("gloo"));
  dist::destroy_process_group();  // harmless without a group
}

TEST(DistApi, MissingBackendsNameTheirBuildOption) {
  if (!dist::is_available("mpi")) {
    EXPECT_TRUE(throws_with([] { dist::init_process_group("mpi"); }, {"STRATA_WITH_MPI"}));
    EXPECT_TRUE(throws_with([] { dist::new_mpi_group(); }, {"STRATA_WITH_MPI"}));
  }
  if (!dist::is_available("nccl")) {
    EXPECT_TRUE(throws_with([] { dist::new_nccl_group(0); }, {"NCCL backend is not in this build"}));
  } else if (cuda::device_count() == 0) {
    EXPECT_TRUE(throws_with([] { dist::new_nccl_group(0); }, {"CUDA device 0 does not exist"}));
  }
}

}  // namespace
}  // namespace strata
