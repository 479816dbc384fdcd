// The native 3-d pooling kernels on CUDA against the CPU kernels on fresh random inputs: every
// dtype (bfloat16 and float16 computed in float), odd sizes, stride, padding, dilation,
// ceil_mode, count_include_pad and divisor_override, adaptive windows, non-contiguous inputs,
// max pooling's indices with ties, and the input gradients (gathered on CUDA, scattered on the
// CPU). Skipped without a GPU.
#include <gtest/gtest.h>

#include <functional>
#include <string>

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

// f on the CPU and on CUDA from the same values x (viewed by `view`): output, the indices when
// f returns them, and the input gradient under one random cotangent.
void check(const std::string& what, DType dt, const Tensor& x, const std::function<Tensor(const Tensor&)>& view,
           const std::function<F::MaxPoolResult(const Tensor&)>& f) {
  SCOPED_TRACE(what + " " + std::string(st::dtype_name(dt)));
  Tensor on_cpu = x.to(dt).detach().requires_grad_(), on_gpu = gpu(x.to(dt)).detach().requires_grad_();
  const F::MaxPoolResult a = f(view(on_cpu)), b = f(view(on_gpu));
  expect_close(a.output, b.output, "output", cpu_cuda_tol(dt));
  if (a.indices.defined()) expect_close(a.indices, b.indices, "indices", 0);
  const Tensor cot = random(a.output.shape(), dt);
  (a.output * cot).sum().backward();
  (b.output * gpu(cot)).sum().backward();
  expect_close(on_cpu.grad(), on_gpu.grad(), "gradient", cpu_cuda_tol(dt));
}

F::MaxPoolResult plain(const Tensor& y) { return {y, Tensor()}; }

}  // namespace

TEST(CudaPool3d, NativeKernelsMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  using View = std::function<Tensor(const Tensor&)>;
  const View same = [](const Tensor& t) { return t; };
  const View strided = [](const Tensor& t) { return t.transpose(0, 1).narrow(3, 1, 5); };
  for (DType dt : {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16})
    for (const View& view : {same, strided}) {
      const Tensor x = random({3, 2, 7, 6, 9}, dt);
      // ties: values rounded to a few levels
      const Tensor ties = st::round(random({3, 2, 7, 6, 9}, st::kFloat64) * 2);
      for (const Tensor& in : {x, ties}) {
        const F::MaxPool3dArgs ma{Size3{2, 1, 2}, {1, 1, 0}, {1, 2, 1}, true};
        check("max_pool3d", dt, in, view,
              [&](const Tensor& t) { return F::max_pool3d_with_indices(t, {3, 2, 2}, ma); });
        check("adaptive_max_pool3d", dt, in, view,
              [&](const Tensor& t) { return F::adaptive_max_pool3d_with_indices(t, {3, 4, 5}); });
      }
      for (bool include_pad : {true, false})
        for (std::optional<int64_t> divisor : {std::optional<int64_t>(), std::optional<int64_t>(5)}) {
          const F::AvgPool3dArgs aa{Size3{2, 2, 1}, {1, 1, 1}, true, include_pad, divisor};
          check("avg_pool3d", dt, x, view, [&](const Tensor& t) { return plain(F::avg_pool3d(t, 3, aa)); });
        }
      check("adaptive_avg_pool3d", dt, x, view,
            [&](const Tensor& t) { return plain(F::adaptive_avg_pool3d(t, {4, 3, 5})); });
    }
}
