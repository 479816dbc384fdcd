// Mixed precision on a GPU: float16 autocast of the listed ops on CUDA tensors against the same
// ops on the CPU under float16 autocast, the float32 parameter gradients of a small model, and
// the grad scaler's inf/NaN detection and unscaling on device gradients.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include <strata/strata.hpp>

#include "cuda/cuda_testing.h"

using namespace strata;
using namespace strata::cuda_testing;
namespace F = strata::nn::functional;

TEST(CudaAmp, Float16AutocastMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const Tensor x = random({6, 16}, kFloat32), w = random({8, 16}, kFloat32), b = random({8}, kFloat32);
  const Tensor img = random({2, 3, 8, 8}, kFloat32), k = random({4, 3, 3, 3}, kFloat32);
  const Tensor q = random({2, 5, 8}, kFloat32), kk = random({2, 7, 8}, kFloat32), v = random({2, 7, 8}, kFloat32);
  auto run = [&](Device d, std::vector<Tensor>& out) {
    amp::AutocastGuard autocast(d.type, kFloat16);
    out.push_back(linear(x.to(d), w.to(d), b.to(d)));
    out.push_back(matmul(x.to(d), w.to(d).t()));
    out.push_back(F::conv2d(img.to(d), k.to(d), Tensor(), {.padding = 1}));
    out.push_back(F::scaled_dot_product_attention(q.to(d), kk.to(d), v.to(d)));
    out.push_back(softmax(out[0], -1));
    out.push_back(F::cross_entropy(out[0], full({6}, 3, TensorOptions(kInt64, d))));
  };
  std::vector<Tensor> cpu, gpu_out;
  run(kCPU, cpu);
  run(Device::cuda(), gpu_out);
  const char* names[] = {"linear", "matmul", "conv2d", "attention", "softmax", "cross_entropy"};
  const DType want[] = {kFloat16, kFloat16, kFloat16, kFloat16, kFloat32, kFloat32};
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(gpu_out[i].dtype(), want[i]) << names[i];
    expect_close(cpu[i], gpu_out[i], names[i], 1e-2, 1e-2);
  }
}

TEST(CudaAmp, Float32ParametersGetFloat32GradientsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  manual_seed(1);
  nn::Linear cpu_lin(16, 8), gpu_lin(16, 8);
  gpu_lin.weight.set_data(cpu_lin.weight.detach().to(Device::cuda()));
  gpu_lin.bias.set_data(cpu_lin.bias.detach().to(Device::cuda()));
  const Tensor x = random({4, 16}, kFloat32);
  for (auto [lin, d] : {std::pair<nn::Linear*, Device>{&cpu_lin, kCPU}, {&gpu_lin, Device::cuda()}}) {
    Tensor loss;
    {
      amp::AutocastGuard autocast(d.type, kFloat16);
      loss = F::mse_loss((*lin)(x.to(d)), zeros({4, 8}, TensorOptions(kFloat32, d)));
    }
    loss.backward();
  }
  EXPECT_EQ(gpu_lin.weight.grad().dtype(), kFloat32);
  expect_close(cpu_lin.weight.grad(), gpu_lin.weight.grad(), "weight grad", 1e-2, 1e-3);
  expect_close(cpu_lin.bias.grad(), gpu_lin.bias.grad(), "bias grad", 1e-2, 1e-3);
}

TEST(CudaAmp, GradScalerFindsInfAndNanOnDeviceGradients) {
  SKIP_WITHOUT_GPU();
  const Tensor p = full({1000}, 1.0, TensorOptions(kFloat32, Device::cuda())).requires_grad_();
  optim::SGD opt({p}, {.lr = 1.0});
  amp::GradScaler scaler({.init_scale = 256, .growth_interval = 2});
  for (double bad : {0.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    SCOPED_TRACE(bad);
    Tensor coef = full({1000}, 0.5, TensorOptions(kFloat32, Device::cuda()));
    if (bad != 0.0) coef = where(arange(1000, TensorOptions(kInt64, Device::cuda())) == 777, bad, coef);
    const double scale_before = scaler.get_scale();
    opt.zero_grad();
    Tensor loss = scaler.scale(sum(p * coef));
    EXPECT_TRUE(loss.is_cuda());
    loss.backward();
    const Tensor before = host(p.detach());
    const bool stepped = scaler.step(opt);
    scaler.update();
    EXPECT_EQ(stepped, bad == 0.0);
    if (bad == 0.0) {
      expect_close(full({1000}, 0.5), p.grad(), "unscaled grad", 0, 0);
      expect_close(full({1000}, 0.5), p.detach(), "stepped parameter", 0, 0);
    } else {
      expect_close(before, p.detach(), "skipped parameter", 0, 0);
      EXPECT_EQ(scaler.get_scale(), scale_before * 0.5);
    }
  }
}
