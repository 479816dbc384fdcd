// The NCCL process group (label cuda; skipped without a GPU or a build without NCCL), under
// mpirun with one rank per GPU: each collective on CUDA tensors, in several dtypes and
// layouts, gives what the MPI group (tested against closed forms in test_collectives.cpp) gives
// on the same values on the CPU; DDP on a CUDA model keeps training like its CPU twin, and so
// does ZeroRedundancyOptimizer (its broadcasts, error agreement and state exchange on NCCL), and
// FullyShardedDataParallel (its gathers, reduce-scatters, clipping and state dicts), and DDP's
// communication hooks.
#include <numeric>

#include "dist/dist_testing.h"

namespace strata {
namespace {

using dist::ReduceOp;
using testing::Layout;
using testing::values;

std::shared_ptr<dist::ProcessGroup> nccl_group() {
  static std::shared_ptr<dist::ProcessGroup> group;
  if (!group) group = dist::new_nccl_group(dist_testing::group()->rank() % cuda::device_count());
  return group;
}

#define SKIP_WITHOUT_NCCL()                                                              \
  if (!dist::is_available("nccl") || cuda::device_count() == 0) GTEST_SKIP() << "no NCCL or no GPU"; \
  if (cuda::device_count() < dist_testing::group()->size()) GTEST_SKIP() << "fewer GPUs than ranks"

// Rank-dependent values of `d` laid out as `layout` on `device`.
Tensor inputs(int rank, DType d, Layout layout, Device device) {
  Tensor grid = arange(24, TensorOptions(kFloat64)).view({4, 6}) + 3.0 * rank;
  Tensor v = remainder(grid, full({1}, 7.0, kFloat64)) - 2.0;
  if (d == kBool || d == kUInt8) v = v.abs();
  return testing::with_layout(v.to(d).to(device), layout);
}

TEST(Nccl, CollectivesMatchTheMpiGroup) {
  SKIP_WITHOUT_NCCL();
  auto cpu = dist_testing::group();
  auto gpu = nccl_group();
  const int r = cpu->rank(), n = cpu->size();
  const Device dev = Device::cuda(r % cuda::device_count());
  for (DType d : {kBool, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64})
    for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
      SCOPED_TRACE(fmt::format("{} {}", d, testing::layout_name(layout)));
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
        Tensor a = inputs(r, d, Layout::Contiguous, kCPU), b = inputs(r, d, layout, dev);
        cpu->allreduce(a, op)->wait();
        gpu->allreduce(b, op)->wait();
        EXPECT_EQ(values(b), values(a));
      }
      Tensor a = inputs(r, d, Layout::Contiguous, kCPU), b = inputs(r, d, layout, dev);
      cpu->broadcast(a, n - 1)->wait();
      gpu->broadcast(b, n - 1)->wait();
      EXPECT_EQ(values(b), values(a));
      std::vector<Tensor> ga, gb;
      for (int k = 0; k < n; ++k) {
        ga.push_back(inputs(0, d, Layout::Contiguous, kCPU));
        gb.push_back(inputs(0, d, layout, dev));
      }
      cpu->allgather(ga, inputs(r, d, Layout::Contiguous, kCPU))->wait();
      gpu->allgather(gb, inputs(r, d, layout, dev))->wait();
      for (int k = 0; k < n; ++k) EXPECT_EQ(values(gb[k]), values(ga[k]));
      Tensor oa = inputs(0, d, Layout::Contiguous, kCPU), ob = inputs(0, d, layout, dev);
      cpu->reduce_scatter(oa, ga, ReduceOp::Max)->wait();
      gpu->reduce_scatter(ob, gb, ReduceOp::Max)->wait();
      EXPECT_EQ(values(ob), values(oa));
    }
  gpu->barrier()->wait();
  EXPECT_TRUE(testing::throws_with([&] { gpu->allreduce(zeros({2})); }, {"nccl", "cuda"}));
}

// reduce, gather, scatter and all-to-all (grouped ncclSend/ncclRecv) against the MPI group
TEST(Nccl, RootedCollectivesAndAllToAllMatchTheMpiGroup) {
  SKIP_WITHOUT_NCCL();
  auto cpu = dist_testing::group();
  auto gpu = nccl_group();
  const int r = cpu->rank(), n = cpu->size();
  const Device dev = Device::cuda(r % cuda::device_count());
  for (DType d : {kInt64, kFloat16, kBFloat16, kFloat32})
    for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
      SCOPED_TRACE(fmt::format("{} {}", d, testing::layout_name(layout)));
      auto cpu_in = [&](int k) { return inputs(k, d, Layout::Contiguous, kCPU); };
      auto gpu_in = [&](int k) { return inputs(k, d, layout, dev); };
      Tensor a = cpu_in(r), b = gpu_in(r);
      cpu->reduce(a, n - 1, ReduceOp::Sum)->wait();
      gpu->reduce(b, n - 1, ReduceOp::Sum)->wait();
      EXPECT_EQ(values(b), values(a));
      std::vector<Tensor> ga, gb, sa, sb, ta, tb;
      for (int k = 0; k < n; ++k) {
        if (r == 0) {  // the lists belong to the root
          ga.push_back(cpu_in(0));
          gb.push_back(gpu_in(0));
          sa.push_back(cpu_in(k));
          sb.push_back(gpu_in(k));
        }
        ta.push_back(cpu_in(0));
        tb.push_back(gpu_in(0));
      }
      cpu->gather(ga, cpu_in(r), 0)->wait();
      gpu->gather(gb, gpu_in(r), 0)->wait();
      for (size_t k = 0; k < ga.size(); ++k) EXPECT_EQ(values(gb[k]), values(ga[k]));
      Tensor oa = cpu_in(0), ob = gpu_in(0);
      cpu->scatter(oa, sa, 0)->wait();
      gpu->scatter(ob, sb, 0)->wait();
      EXPECT_EQ(values(ob), values(oa));
      std::vector<Tensor> ia, ib;
      for (int k = 0; k < n; ++k) {
        ia.push_back(cpu_in(r + k));
        ib.push_back(gpu_in(r + k));
      }
      cpu->alltoall(ta, ia)->wait();
      gpu->alltoall(tb, ib)->wait();
      for (int k = 0; k < n; ++k) EXPECT_EQ(values(tb[k]), values(ta[k]));
    }
}

// all_to_all_single with split sizes (one send and receive per peer, grouped) and all_to_all with
// different sizes per peer, against the MPI group on the same values; the interleaved pipeline
// schedule refuses NCCL
TEST(Nccl, UnevenAllToAllMatchesTheMpiGroupAndInterleavedPipelinesRaise) {
  SKIP_WITHOUT_NCCL();
  auto cpu = dist_testing::group();
  auto gpu = nccl_group();
  const int r = cpu->rank(), n = cpu->size();
  const Device dev = Device::cuda(r % cuda::device_count());
  std::vector<int64_t> in_splits, out_splits;
  std::vector<Tensor> la, lb, oa, ob;
  for (int k = 0; k < n; ++k) {
    in_splits.push_back((r + 2 * k) % 3 + 1);  // rows to rank k: at least one, so one rank exchanges some
    out_splits.push_back((k + 2 * r) % 3 + 1);
    la.push_back(full({(r + 2 * k) % 3 + 1}, 10.0 * r + k, TensorOptions(kFloat32)));
    lb.push_back(la.back().to(dev));
    oa.push_back(zeros({(k + 2 * r) % 3 + 1}, TensorOptions(kFloat32)));
    ob.push_back(oa.back().to(dev));
  }
  const int64_t in_rows = std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0});
  const int64_t out_rows = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
  Tensor a = arange(in_rows * 2, TensorOptions(kFloat64)).view({in_rows, 2}) + 100.0 * r;
  Tensor b = a.to(dev), ra = zeros({out_rows, 2}, TensorOptions(kFloat64)), rb = ra.to(dev);
  cpu->alltoall_base(ra, a, out_splits, in_splits)->wait();
  gpu->alltoall_base(rb, b, out_splits, in_splits)->wait();
  EXPECT_EQ(values(rb), values(ra));
  cpu->alltoall(oa, la)->wait();
  gpu->alltoall(ob, lb)->wait();
  for (int k = 0; k < n; ++k) EXPECT_EQ(values(ob[static_cast<size_t>(k)]), values(oa[static_cast<size_t>(k)]));
  nn::Linear stage(2, 2);
  EXPECT_TRUE(testing::throws_with(
      [&] { dist::ScheduleInterleaved1F1B({&stage}, {.chunks = 2, .process_group = gpu}); }, {"nccl"}));
}

TEST(Nccl, SendRecvRing) {
  SKIP_WITHOUT_NCCL();
  auto gpu = nccl_group();
  const int r = gpu->rank(), n = gpu->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const Device dev = Device::cuda(r % cuda::device_count());
  Tensor out = inputs(r, kFloat32, Layout::Transposed, dev), in = zeros({4, 6}, TensorOptions(kFloat32, dev));
  auto s = gpu->send(out, (r + 1) % n);
  gpu->recv(in, (r + n - 1) % n)->wait();
  s->wait();
  EXPECT_EQ(values(in), values(inputs((r + n - 1) % n, kFloat32, Layout::Contiguous, kCPU)));
}

TEST(Nccl, DdpOnCudaMatchesItsCpuTwin) {
  SKIP_WITHOUT_NCCL();
  const int r = dist_testing::group()->rank();
  const Device dev = Device::cuda(r % cuda::device_count());
  manual_seed(7 + static_cast<uint64_t>(r));
  nn::Linear cpu_net(6, 3);
  cpu_net.to(kFloat64);
  nn::Linear gpu_net(6, 3);
  gpu_net.to(kFloat64);
  gpu_net.load_state_dict(cpu_net.state_dict());
  gpu_net.to(dev);
  dist::DistributedDataParallel cpu_ddp(cpu_net, {.bucket_cap_mb = 1e-4});
  dist::DistributedDataParallel gpu_ddp(gpu_net, {.process_group = nccl_group(), .bucket_cap_mb = 1e-4});
  Tensor x = inputs(r, kFloat64, Layout::Contiguous, kCPU);
  cpu_ddp(x).square().sum().backward();
  gpu_ddp(x.to(dev)).square().sum().backward();
  EXPECT_TRUE(allclose(gpu_net.weight.grad().cpu(), cpu_net.weight.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(allclose(gpu_net.bias.grad().cpu(), cpu_net.bias.grad(), 1e-12, 1e-12));
}

// The communication hooks work through the process group on the bucket's device: on NCCL they
// give what they give on MPI for the CPU twin (PowerSGD's random Qs are drawn on the CPU).
TEST(Nccl, CommHooksOnCudaMatchTheirCpuTwin) {
  SKIP_WITHOUT_NCCL();
  namespace hooks = dist::ddp_comm_hooks;
  const int r = dist_testing::group()->rank();
  const Device dev = Device::cuda(r % cuda::device_count());
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "fp16_compress_hook" : "powerSGD_hook");
    manual_seed(9 + static_cast<uint64_t>(r));
    nn::Linear cpu_net(6, 4);
    cpu_net.to(kFloat64);
    nn::Linear gpu_net(6, 4);
    gpu_net.to(kFloat64);
    gpu_net.load_state_dict(cpu_net.state_dict());
    gpu_net.to(dev);
    dist::DistributedDataParallel cpu_ddp(cpu_net);
    dist::DistributedDataParallel gpu_ddp(gpu_net, {.process_group = nccl_group()});
    const hooks::PowerSGDOptions options{.start_powerSGD_iter = 1, .min_compression_rate = 1};
    if (which == 0) {
      cpu_ddp.register_comm_hook(nullptr, hooks::fp16_compress_hook);
      gpu_ddp.register_comm_hook(nullptr, hooks::fp16_compress_hook);
    } else {
      cpu_ddp.register_comm_hook(std::make_shared<hooks::PowerSGDState>(dist_testing::group(), options),
                                 hooks::powerSGD_hook);
      gpu_ddp.register_comm_hook(std::make_shared<hooks::PowerSGDState>(nccl_group(), options), hooks::powerSGD_hook);
    }
    for (int step = 0; step < 3; ++step) {
      Tensor x = inputs(r, kFloat64, Layout::Contiguous, kCPU) * (1.0 + step);
      cpu_ddp(x).square().sum().backward();
      gpu_ddp(x.to(dev)).square().sum().backward();
      EXPECT_TRUE(allclose(gpu_net.weight.grad().cpu(), cpu_net.weight.grad(), 1e-10, 1e-10)) << "step " << step;
      EXPECT_TRUE(allclose(gpu_net.bias.grad().cpu(), cpu_net.bias.grad(), 1e-10, 1e-10)) << "step " << step;
      cpu_net.zero_grad();
      gpu_net.zero_grad();
    }
  }
}

TEST(Nccl, ZeroOnCudaMatchesItsCpuTwin) {
  SKIP_WITHOUT_NCCL();
  const int r = dist_testing::group()->rank();
  const Device dev = Device::cuda(r % cuda::device_count());
  manual_seed(11);  // the same model on every rank
  nn::Sequential cpu_net(nn::Linear(6, 5), nn::Tanh(), nn::Linear(5, 3));
  cpu_net.to(kFloat64);
  nn::Sequential gpu_net(nn::Linear(6, 5), nn::Tanh(), nn::Linear(5, 3));
  gpu_net.to(kFloat64);
  gpu_net.load_state_dict(cpu_net.state_dict());
  gpu_net.to(dev);
  using Zero = dist::ZeroRedundancyOptimizer<optim::AdamW>;
  Zero cpu_opt(cpu_net.parameters(), {.lr = 0.01});
  Zero gpu_opt(gpu_net.parameters(), {.lr = 0.01}, {.process_group = nccl_group(), .broadcast_bucket_mb = 1e-4});
  Tensor x = inputs(0, kFloat64, Layout::Contiguous, kCPU);  // the same batch on every rank
  for (int step = 0; step < 3; ++step) {
    cpu_net(x).square().sum().backward();
    gpu_net(x.to(dev)).square().sum().backward();
    cpu_opt.step();
    gpu_opt.step();
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
  }
  auto got = gpu_net.parameters(), want = cpu_net.parameters();
  for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(allclose(got[k].cpu(), want[k], 1e-12, 1e-12)) << k;
  cpu_opt.consolidate_state_dict(0);
  gpu_opt.consolidate_state_dict(0);
  if (r != 0) return;
  const optim::StateDict g = gpu_opt.state_dict(), c = cpu_opt.state_dict();
  EXPECT_EQ(g.scalars, c.scalars);
  ASSERT_EQ(g.tensors.size(), c.tensors.size());
  for (const auto& [key, t] : c.tensors) EXPECT_TRUE(allclose(g.tensors.at(key).cpu(), t, 1e-12, 1e-12)) << key;
}

TEST(Nccl, FsdpOnCudaMatchesItsCpuTwin) {
  SKIP_WITHOUT_NCCL();
  const int r = dist_testing::group()->rank();
  const Device dev = Device::cuda(r % cuda::device_count());
  manual_seed(13);
  nn::Sequential cpu_net(nn::Linear(6, 5), nn::Tanh(), nn::Linear(5, 3));
  cpu_net.to(kFloat64);
  nn::Sequential gpu_net(nn::Linear(6, 5), nn::Tanh(), nn::Linear(5, 3));
  gpu_net.to(kFloat64);
  gpu_net.load_state_dict(cpu_net.state_dict());
  gpu_net.to(dev);
  const auto policy = dist::module_wrap_policy<nn::Linear>();
  dist::FullyShardedDataParallel cpu_fsdp(cpu_net, {.auto_wrap_policy = policy});
  dist::FullyShardedDataParallel gpu_fsdp(gpu_net, {.process_group = nccl_group(), .auto_wrap_policy = policy});
  optim::AdamW cpu_opt(cpu_fsdp.parameters(), {.lr = 0.01}), gpu_opt(gpu_fsdp.parameters(), {.lr = 0.01});
  Tensor x = inputs(r, kFloat64, Layout::Contiguous, kCPU);
  for (int step = 0; step < 3; ++step) {
    cpu_fsdp(x).square().sum().backward();
    gpu_fsdp(x.to(dev)).square().sum().backward();
    EXPECT_NEAR(gpu_fsdp.clip_grad_norm_(1.0), cpu_fsdp.clip_grad_norm_(1.0), 1e-9);
    cpu_opt.step();
    gpu_opt.step();
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
  }
  const nn::StateDict g = gpu_fsdp.full_state_dict(false), c = cpu_fsdp.full_state_dict(false);
  for (const auto& [key, t] : c) EXPECT_TRUE(allclose(g.at(key).cpu(), t, 1e-12, 1e-12)) << key;
  const optim::StateDict go = gpu_fsdp.full_optim_state_dict(gpu_opt, false);
  const optim::StateDict co = cpu_fsdp.full_optim_state_dict(cpu_opt, false);
  EXPECT_EQ(go.scalars, co.scalars);
  for (const auto& [key, t] : co.tensors) EXPECT_TRUE(allclose(go.tensors.at(key).cpu(), t, 1e-12, 1e-12)) << key;
}

}  // namespace
}  // namespace strata
