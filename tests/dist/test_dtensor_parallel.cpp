// parallelize_module and distribute_module under mpirun -np 4: an MLP with its first Linear
// colwise- and its second rowwise-parallel gives the output and the input gradient of the same
// MLP whole in one process (same seeds), each rank's weight gradients are its torch.chunk block
// of the whole ones (uneven hidden sizes too), on a 1-D mesh and on the "tp" slice of a 2 x 2
// mesh; sequence parallel output layouts; distribute_module's default replication and hooks;
// bad plans raising.
#include "dist/dtensor_testing.h"

namespace strata {
namespace {

using namespace dtensor_testing;
using dist::Replicate;
using dist::Shard;

void check_mlp(const dist::DeviceMesh& tp, int64_t hidden) {
  Mlp whole(hidden), parallel(hidden);
  dist::parallelize_module(parallel.net, tp, {{"0", dist::ColwiseParallel{}}, {"2", dist::RowwiseParallel{}}});
  EXPECT_EQ(parallel.fc(0).weight.shape(), block(whole.fc(0).weight, 0, tp).shape());
  EXPECT_EQ(parallel.fc(2).weight.shape(), block(whole.fc(2).weight, 1, tp).shape());

  const Tensor x = global_values({3, 6});
  Tensor xr = x.clone().requires_grad_(), xp = x.clone().requires_grad_();
  Tensor want = whole.net(xr), got = parallel.net(xp);
  EXPECT_TRUE(close(got.detach(), want.detach()));
  const Tensor w = global_values(want.shape(), 1.0);
  (want * w).sum().backward();
  (got * w).sum().backward();  // every rank the same loss on the replicated output
  EXPECT_TRUE(close(xp.grad(), xr.grad()));
  EXPECT_TRUE(close(parallel.fc(0).weight.grad(), block(whole.fc(0).weight.grad(), 0, tp)));
  EXPECT_TRUE(close(parallel.fc(0).bias.grad(), block(whole.fc(0).bias.grad(), 0, tp)));
  EXPECT_TRUE(close(parallel.fc(2).weight.grad(), block(whole.fc(2).weight.grad(), 1, tp)));
  EXPECT_TRUE(close(parallel.fc(2).bias.grad(), whole.fc(2).bias.grad()));
}

TEST(DTensorParallel, ColwiseThenRowwiseMlpEqualsTheWholeOne) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  check_mlp(tp, 8);
  check_mlp(tp, 10);  // 3, 3, 3, 1 hidden features per rank
}

TEST(DTensorParallel, OnTheTpSliceOfATwoByTwoMesh) {
  dist_testing::group();
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  check_mlp(mesh["tp"], 7);
}

TEST(DTensorParallel, SequenceParallelLayouts) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  Mlp whole(8), parallel(8);
  // rows of the input arrive scattered and leave scattered (the bias is added to the all-reduced value)
  dist::parallelize_module(parallel.net, tp,
                           {{"0", dist::ColwiseParallel{.input_layouts = Shard(0)}},
                            {"2", dist::RowwiseParallel{.output_layouts = Shard(0)}}});
  const Tensor x = global_values({8, 6});
  Tensor xr = x.clone().requires_grad_(), xp = block(x, 0, tp).requires_grad_();
  Tensor want = whole.net(xr), got = parallel.net(xp);
  EXPECT_TRUE(close(got.detach(), block(want, 0, tp).detach()));
  // each rank's loss on its rows: together the loss of the whole output
  const Tensor w = global_values(want.shape(), 1.0);
  (want * w).sum().backward();
  (got * block(w, 0, tp)).sum().backward();
  EXPECT_TRUE(close(xp.grad(), block(xr.grad(), 0, tp)));
  EXPECT_TRUE(close(parallel.fc(0).weight.grad(), block(whole.fc(0).weight.grad(), 0, tp)));
  EXPECT_TRUE(close(parallel.fc(2).weight.grad(), block(whole.fc(2).weight.grad(), 1, tp)));
  EXPECT_TRUE(close(parallel.fc(2).bias.grad(), whole.fc(2).bias.grad()));
}

TEST(DTensorParallel, DistributeModuleReplicatesAndHooks) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  Generator gen(100 + dist::get_rank());  // different weights on every rank
  nn::Linear layer(3, 2, {.generator = &gen});
  layer.to(kFloat64);
  Tensor first = layer.weight.detach().clone();
  dist::default_group()->broadcast(first, 0)->wait();
  int inputs = 0, outputs = 0;
  dist::distribute_module(
      layer, tp, {},
      [&](nn::Module&, const Tensor& x, const dist::DeviceMesh&) { ++inputs; return x * 2.0; },
      [&](nn::Module&, const Tensor& y, const dist::DeviceMesh&) { ++outputs; return y + 1.0; });
  EXPECT_TRUE(close(layer.weight, first));  // rank 0's weights everywhere
  const Tensor x = global_values({2, 3});
  Tensor y = layer(x);
  EXPECT_EQ(inputs, 1);
  EXPECT_EQ(outputs, 1);
  EXPECT_TRUE(close(y, linear(x * 2.0, layer.weight, layer.bias) + 1.0));
  std::vector<std::string> seen;
  nn::Sequential seq(nn::Linear(2, 2), nn::ReLU());
  dist::distribute_module(seq, tp, [&](const std::string& name, nn::Module&, const dist::DeviceMesh&) {
    seen.push_back(name);
  });
  EXPECT_EQ(seen, (std::vector<std::string>{"", "0", "1"}));
}

TEST(DTensorParallel, WildcardPartsMatchAnyName) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  nn::Sequential blocks(nn::Sequential(nn::Linear(4, 8), nn::ReLU()), nn::Sequential(nn::Linear(4, 12), nn::ReLU()));
  dist::parallelize_module(blocks, tp, {{"*.0", dist::ColwiseParallel{}}});
  EXPECT_EQ(dynamic_cast<nn::Linear&>(blocks.get_submodule("0.0")).weight.shape(), (Shape{2, 4}));
  EXPECT_EQ(dynamic_cast<nn::Linear&>(blocks.get_submodule("1.0")).weight.shape(), (Shape{3, 4}));
}

TEST(DTensorParallel, BadPlansRaise) {
  dist_testing::group();
  auto tp = dist::init_device_mesh("cpu", {4}, {"tp"});
  auto mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  Mlp m(8);
  auto raises = [](auto&& call, std::initializer_list<const char*> needles) {
    EXPECT_TRUE(testing::throws_with(call, needles));
  };
  raises([&] { dist::parallelize_module(m.net, tp, {{"1", dist::ColwiseParallel{}}}); }, {"'1' is a ReLU"});
  raises([&] { dist::parallelize_module(m.net, tp, {{"5", dist::ColwiseParallel{}}}); }, {"matches no submodule"});
  raises([&] { dist::parallelize_module(m.net, mesh, {{"0", dist::ColwiseParallel{}}}); }, {"1-D mesh"});
  // a plan that fails on one entry changes nothing (no layer half parallelized)
  raises([&] { dist::parallelize_module(m.net, tp, {{"0", dist::ColwiseParallel{}}, {"5", dist::RowwiseParallel{}}}); },
         {"matches no submodule"});
  EXPECT_EQ(m.fc(0).weight.shape(), (Shape{8, 6}));
  EXPECT_EQ(m.fc(0).form(), nullptr);
  dist::parallelize_module(m.net, tp, {{"0", dist::ColwiseParallel{}}});
  raises([&] { dist::parallelize_module(m.net, tp, {{"0", dist::RowwiseParallel{}}}); }, {"already has a form"});
}

}  // namespace
}  // namespace strata
