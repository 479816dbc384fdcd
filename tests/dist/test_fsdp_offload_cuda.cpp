// FullyShardedDataParallel's CPU offload on a GPU (label cuda; skipped without a GPU or a build
// without NCCL; one process, a one-rank NCCL group): a float64 model on the GPU with its shards,
// their gradients and the AdamW state on the CPU trains as the plain model on the CPU, with each
// strategy and with bfloat16 compute.
#include "dist/fsdp_testing.h"

namespace strata {
namespace {

using namespace fsdp_testing;

nn::StateDict on_cpu(const nn::StateDict& dict) {
  nn::StateDict out;
  for (const auto& [k, t] : dict) out[k] = t.cpu();
  return out;
}

TEST(FsdpCpuOffloadCuda, ShardsOnTheCpuTrainAModuleOnTheGpuAsThePlainModel) {
  if (!dist::is_available("nccl") || cuda::device_count() == 0) GTEST_SKIP() << "no NCCL or no GPU";
  dist_testing::group();  // MPI, which bootstraps NCCL
  const Device gpu = Device::cuda(0);
  auto group = dist::new_nccl_group(0);
  for (ShardingStrategy s : all_strategies()) {
    auto net = make_net(300), ref = make_net(300);
    net->to(gpu);
    dist::FSDPOptions options = blocks(s);
    options.process_group = group;
    options.cpu_offload = {.offload_params = true};
    FSDP fsdp(*net, options);
    for (const Tensor& shard : fsdp.parameters()) EXPECT_TRUE(shard.device().is_cpu());
    optim::AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.1};
    optim::AdamW opt(fsdp.parameters(), adamw), ref_opt(ref->parameters(), adamw);
    bool on_gpu_in_forward = false;
    net->b1.register_forward_pre_hook(
        [&](nn::Module&, const Tensor&) { on_gpu_in_forward = net->b1.fc.weight.device() == gpu; });
    for (int step = 0; step < 3; ++step) {
      Batch b = batch(step);
      F::mse_loss(fsdp(b.x.to(gpu)), b.y.to(gpu)).backward();
      for (const Tensor& shard : fsdp.parameters()) EXPECT_TRUE(shard.grad().device().is_cpu());
      opt.step();
      opt.zero_grad();
      reference_step(*ref, ref_opt, step);
    }
    EXPECT_TRUE(on_gpu_in_forward);
    expect_close_dicts(on_cpu(fsdp.full_state_dict()), ref->state_dict(), 1e-10);
    const optim::StateDict full = fsdp.full_optim_state_dict(opt);
    for (const auto& [key, t] : ref_opt.state_dict().tensors)
      EXPECT_TRUE(allclose(full.tensors.at(key).cpu(), t, 1e-9, 1e-12)) << key;
    EXPECT_NEAR(fsdp.clip_grad_norm_(1e9), 0.0, 0.0);  // no gradient after zero_grad
  }
  // bfloat16 compute: the cast copy is what goes to the GPU; the float32 masters stay on the CPU
  auto net = make_net(301);
  net->to(gpu).to(kFloat32);
  dist::FSDPOptions options = blocks(ShardingStrategy::FullShard);
  options.process_group = group;
  options.cpu_offload = {.offload_params = true};
  options.mixed_precision = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32};
  FSDP fsdp(*net, options);
  Batch b = batch(0);
  const Tensor out = fsdp(b.x.to(gpu));
  EXPECT_EQ(out.dtype(), kBFloat16);
  EXPECT_TRUE(out.is_cuda());
  F::mse_loss(out.to(kFloat32), b.y.to(gpu).to(kFloat32)).backward();
  for (const Tensor& shard : fsdp.parameters()) {
    EXPECT_EQ(shard.dtype(), kFloat32);
    EXPECT_TRUE(shard.grad().defined() && shard.grad().device().is_cpu());
  }
}

}  // namespace
}  // namespace strata
