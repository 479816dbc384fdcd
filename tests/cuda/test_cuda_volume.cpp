// The 3-d convolutions and pooling ops on CUDA against the CPU on fresh random inputs (odd sizes,
// strides, padding, dilation, groups, ceil_mode; float32, float64 and float16): outputs, max
// pooling's indices, and the gradients of the input, the weight and the bias; the native 3-d
// convolutions (cuDNN's Nd descriptors) against the CPU and the composed path, bfloat16 and
// strided inputs too. Skipped without a GPU.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "cuda/cuda_testing.h"

namespace st = strata;
namespace F = strata::nn::functional;
using st::DType;
using st::Tensor;
using st::cuda_testing::cpu_cuda_tol;
using st::cuda_testing::expect_close;
using st::cuda_testing::gpu;
using st::cuda_testing::random;
using Size3 = st::nn::Size3;

namespace {

// f on CPU and on CUDA: its output and the gradients of every input under one random cotangent.
void check(const std::string& what, DType dt, const std::vector<Tensor>& inputs,
           const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  SCOPED_TRACE(what + " " + std::string(st::dtype_name(dt)));
  std::vector<Tensor> cpu_in, gpu_in;
  for (const Tensor& t : inputs) {
    cpu_in.push_back(t.to(dt).detach().requires_grad_());
    gpu_in.push_back(gpu(t.to(dt)).detach().requires_grad_());
  }
  const Tensor y_cpu = f(cpu_in), y_gpu = f(gpu_in);
  expect_close(y_cpu, y_gpu, "output", cpu_cuda_tol(dt));
  const Tensor cot = random(y_cpu.shape(), dt);
  (y_cpu * cot).sum().backward();
  (y_gpu * gpu(cot)).sum().backward();
  for (size_t i = 0; i < inputs.size(); ++i)
    expect_close(cpu_in[i].grad(), gpu_in[i].grad(), "gradient " + std::to_string(i), cpu_cuda_tol(dt));
}

}  // namespace

TEST(CudaVolume, ConvAndPoolMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  for (DType dt : {st::kFloat32, st::kFloat64, st::kFloat16}) {
    const Tensor x = random({2, 4, 7, 6, 5}, dt), w = random({6, 2, 3, 2, 3}, dt), b = random({6}, dt);
    const F::Conv3dArgs ca{{2, 1, 1}, {1, 0, 1}, {1, 2, 1}, 2};
    check("conv3d", dt, {x, w, b}, [&](const std::vector<Tensor>& t) { return F::conv3d(t[0], t[1], t[2], ca); });
    const Tensor wt = random({4, 3, 2, 3, 2}, dt);
    const F::ConvTranspose3dArgs ta{{2, 1, 2}, {1, 1, 0}, {1, 0, 1}, 2, 1};
    check("conv_transpose3d", dt, {x, wt, b},
          [&](const std::vector<Tensor>& t) { return F::conv_transpose3d(t[0], t[1], t[2], ta); });
    const F::MaxPool3dArgs ma{Size3{2, 1, 2}, {1, 1, 0}, {1, 2, 1}, true};
    check("max_pool3d", dt, {x}, [&](const std::vector<Tensor>& t) { return F::max_pool3d(t[0], {3, 2, 2}, ma); });
    const F::MaxPoolResult on_cpu = F::max_pool3d_with_indices(x, {3, 2, 2}, ma);
    const F::MaxPoolResult on_gpu = F::max_pool3d_with_indices(gpu(x), {3, 2, 2}, ma);
    expect_close(on_cpu.indices, on_gpu.indices, "max_pool3d indices", 0);
    const F::AvgPool3dArgs aa{Size3{2, 2, 1}, 1, true, false, std::nullopt};
    check("avg_pool3d", dt, {x}, [&](const std::vector<Tensor>& t) { return F::avg_pool3d(t[0], 3, aa); });
    check("adaptive_avg_pool3d", dt, {x},
          [&](const std::vector<Tensor>& t) { return F::adaptive_avg_pool3d(t[0], {3, 4, 2}); });
    check("adaptive_max_pool3d", dt, {x},
          [&](const std::vector<Tensor>& t) { return F::adaptive_max_pool3d(t[0], {3, 4, 2}); });
  }
}

TEST(CudaVolume, NativeConvMatchesCpuAndComposed) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  struct Restore {
    ~Restore() { F::set_native_conv3d(st::DeviceType::CUDA, false); }
  } restore;
  F::set_native_conv3d(st::DeviceType::CUDA, true);
  for (DType dt : {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16}) {
    const Tensor x = random({2, 4, 7, 6, 5}, dt), w = random({6, 2, 3, 2, 3}, dt), b = random({6}, dt);
    const F::Conv3dArgs ca{{2, 1, 1}, {1, 0, 1}, {1, 2, 1}, 2};
    const auto conv = [&](const std::vector<Tensor>& t) { return F::conv3d(t[0], t[1], t[2], ca); };
    check("native conv3d", dt, {x, w, b}, conv);
    check("native conv3d, strided input", dt, {x.transpose(3, 4), w, b}, conv);
    // output_padding past the stride: the ops pad the gradient to the full output size
    const Tensor wt = random({4, 3, 3, 2, 2}, dt);
    const F::ConvTranspose3dArgs ta{{2, 1, 1}, {1, 0, 1}, {1, 1, 0}, 2, {1, 2, 1}};
    check("native conv_transpose3d", dt, {x, wt, b},
          [&](const std::vector<Tensor>& t) { return F::conv_transpose3d(t[0], t[1], t[2], ta); });
    const Tensor y = F::conv3d(gpu(x).requires_grad_(), gpu(w), gpu(b), ca);
    EXPECT_EQ(y.grad_fn()->name(), "conv3d");  // the native op ran
    F::set_native_conv3d(st::DeviceType::CUDA, false);
    expect_close(y.detach(), F::conv3d(gpu(x), gpu(w), gpu(b), ca), "native against composed", cpu_cuda_tol(dt));
    F::set_native_conv3d(st::DeviceType::CUDA, true);
  }
}

// A 3-d problem of depth 1 right after the 2-d problem of the same sizes: the algorithm found for
// the 4-d descriptors (Winograd, FFT: 2-d only) must not be reused for the 5-d ones.
TEST(CudaVolume, NativeConvDepthOneAfterConv2d) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  struct Restore {
    bool benchmark = st::cuda::benchmark_mode();
    ~Restore() {
      F::set_native_conv3d(st::DeviceType::CUDA, false);
      st::cuda::set_benchmark_mode(benchmark);
    }
  } restore;
  F::set_native_conv3d(st::DeviceType::CUDA, true);
  for (bool benchmark : {false, true}) {
    st::cuda::set_benchmark_mode(benchmark);
    const Tensor x = random({8, 32, 28, 28}, st::kFloat32), w = random({32, 32, 3, 3}, st::kFloat32);
    const Tensor y2 = F::conv2d(gpu(x), gpu(w), Tensor(), {.padding = 1});
    const Tensor y3 = F::conv3d(gpu(x).unsqueeze(2), gpu(w).unsqueeze(2), Tensor(), {.padding = {0, 1, 1}});
    expect_close(y2, y3.squeeze(2), benchmark ? "benchmark mode" : "heuristics", cpu_cuda_tol(st::kFloat32));
  }
}
