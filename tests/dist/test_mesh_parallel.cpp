// Data and tensor parallelism combined on a (size/2) x 2 device mesh under mpirun: DDP over the
// "dp" dim wrapping a column- then row-parallel MLP over "tp" trains as the whole MLP does in one
// process on the whole batch (each "dp" replica sees its slice of it), in float64, for 3 SGD
// steps: every shard's gradient and parameters equal the matching slice of the reference's.
#include "dist/dist_testing.h"

namespace strata {
namespace {

constexpr int64_t kIn = 6, kHidden = 8, kOut = 5, kRowsPerReplica = 4;

struct TensorParallelMlp : nn::Module {
  dist::ColumnParallelLinear col;
  dist::RowParallelLinear row;
  TensorParallelMlp(std::shared_ptr<dist::ProcessGroup> tp, Generator* g1, Generator* g2)
      : col(kIn, kHidden, tp, {.gather_output = false, .generator = g1}),
        row(kHidden, kOut, tp, {.input_is_parallel = true, .generator = g2}) {
    register_module("col", col);
    register_module("row", row);
  }
  Tensor forward(const Tensor& x) override { return row(tanh(col(x))); }
};

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_TRUE(allclose(got, want, 1e-12, 1e-13)) << what;
}

TEST(MeshParallel, DataParallelOverTensorParallelMatchesOneProcess) {
  auto world = dist_testing::group();
  const int n = world->size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int replicas = n / 2;
  auto mesh = dist::init_device_mesh("cpu", {replicas, 2}, {"dp", "tp"});
  const int dp = mesh.get_local_rank("dp"), tp = mesh.get_local_rank("tp");
  const int64_t part = kHidden / 2;

  Generator g1(11), g2(12), h1(11), h2(12);
  nn::Linear fc1(kIn, kHidden, {.generator = &g1}), fc2(kHidden, kOut, {.generator = &g2});
  TensorParallelMlp model(mesh.get_group("tp"), &h1, &h2);
  for (nn::Module* m : std::initializer_list<nn::Module*>{&fc1, &fc2, &model}) m->to(kFloat64);
  dist::DistributedDataParallel ddp(model, {.process_group = mesh.get_group("dp")});
  std::vector<Tensor> ref_params{fc1.weight, fc1.bias, fc2.weight, fc2.bias};
  optim::SGD opt(model.parameters(), {.lr = 0.1});
  optim::SGD ref_opt(ref_params, {.lr = 0.1});

  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    Generator data(100 + static_cast<uint64_t>(step));
    const TensorOptions f64(kFloat64);
    Tensor x = randn({replicas * kRowsPerReplica, kIn}, f64, &data);
    Tensor target = randn({replicas * kRowsPerReplica, kOut}, f64, &data);
    Tensor mine = x.narrow(0, dp * kRowsPerReplica, kRowsPerReplica);
    Tensor my_target = target.narrow(0, dp * kRowsPerReplica, kRowsPerReplica);
    // the mean over replicas of each replica's mean loss is the mean loss over the whole batch
    nn::functional::mse_loss(ddp(mine), my_target).backward();
    nn::functional::mse_loss(fc2(tanh(fc1(x))), target).backward();
    expect_close(model.col.weight.grad(), fc1.weight.grad().narrow(0, tp * part, part), "column weight gradient");
    expect_close(model.col.bias.grad(), fc1.bias.grad().narrow(0, tp * part, part), "column bias gradient");
    expect_close(model.row.weight.grad(), fc2.weight.grad().narrow(1, tp * part, part), "row weight gradient");
    expect_close(model.row.bias.grad(), fc2.bias.grad(), "row bias gradient");
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
    expect_close(model.col.weight, fc1.weight.narrow(0, tp * part, part), "column weight");
    expect_close(model.row.weight, fc2.weight.narrow(1, tp * part, part), "row weight");
    expect_close(model.row.bias, fc2.bias, "row bias");
  }
}

}  // namespace
}  // namespace strata
