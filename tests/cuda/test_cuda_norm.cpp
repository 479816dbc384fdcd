// CUDA layer norm (and RMSNorm, group norm) and fused cross-entropy kernels against the CPU
// kernels on fresh random inputs: row lengths 1, 7, 257, 1023 and 4097 (both sides of the
// warp-per-row / block-per-row split), rows that leave a block partly empty, every float
// dtype, with and without weight and bias, ignored targets, class weights and label
// smoothing. The kernels are called directly through run_kernel (so the saved mean, rstd and
// logsumexp are compared too) and through nn::functional with autograd on non-contiguous
// inputs. Without a GPU every test is skipped with a message.
#include <string>
#include <vector>

#include "cuda/cuda_testing.h"

namespace st = strata;
namespace F = strata::nn::functional;
using st::DType;
using st::Tensor;
using st::cuda_testing::expect_close;
using st::cuda_testing::gpu;
using st::cuda_testing::host;
using st::cuda_testing::random;

namespace {

const std::vector<DType> kFloat = {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16};
const std::vector<int64_t> kRowLengths = {1, 7, 257, 1023, 4097};

// Tolerance, relative to max(1, |cpu value|): the GPU sums in another order (and in float
// where the CPU uses double for float32), and 16-bit results may round to a neighbour.
double tol(DType dt) {
  switch (dt) {
    case DType::Float64: return 1e-10;
    case DType::Float32: return 3e-5;
    case DType::Float16: return 4e-3;
    default: return 3e-2;
  }
}

std::string name(const char* op, DType dt, int64_t rows, int64_t n) {
  return std::string(op) + " " + std::string(st::dtype_name(dt)) + " (" + std::to_string(rows) + ", " +
         std::to_string(n) + ")";
}

Tensor stats_like(int64_t rows, DType dt, st::Device dev) {
  return st::empty({rows}, st::TensorOptions(dt == st::kFloat64 ? st::kFloat64 : st::kFloat32, dev));
}

// Runs `op` on the CPU tensors and on their GPU copies; outputs are allocated like `outs`
// (undefined ones stay undefined) and compared.
void compare_kernel(st::OpId op, DType dt, const std::vector<Tensor>& ins, const std::vector<Tensor>& outs,
                    const void* params, const std::string& what) {
  std::vector<Tensor> gin, cout_, gout;
  for (const Tensor& t : ins) gin.push_back(t.defined() ? gpu(t) : Tensor());
  for (const Tensor& t : outs) {
    cout_.push_back(t.defined() ? st::empty(t.shape(), st::TensorOptions(t.dtype())) : Tensor());
    gout.push_back(t.defined() ? st::empty(t.shape(), st::TensorOptions(t.dtype(), st::Device::cuda())) : Tensor());
  }
  st::run_kernel(op, dt, st::KernelCall{ins, cout_, params});
  st::run_kernel(op, dt, st::KernelCall{gin, gout, params});
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].defined()) expect_close(cout_[k], gout[k], what + " output " + std::to_string(k), tol(dt));
}

}  // namespace

TEST(CudaNorm, LayerNormKernels) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kFloat)
    for (int64_t n : kRowLengths)
      for (int64_t rows : {int64_t(1), int64_t(19)})
        for (int affine = 0; affine < 3; ++affine)  // weight and bias, weight only, neither
          for (bool rms : {false, true}) {
            const std::string what = name(rms ? "rms_norm" : "layer_norm", dt, rows, n) + " affine " +
                                     std::to_string(affine);
            Tensor x = random({rows, n}, dt, -2, 3);  // an offset mean tests the centring
            Tensor w = affine < 2 ? random({n}, dt, 0.5, 1.5) : Tensor();
            Tensor b = affine == 0 ? random({n}, dt) : Tensor();
            const st::nn::LayerNormParams p{1e-5, rms};
            Tensor y = st::empty({rows, n}, dt), mean = stats_like(rows, dt, st::kCPU), rstd = mean;
            compare_kernel(st::OpId::layer_norm, dt, {x, w, b}, {y, mean, rstd}, &p, what);
            // backward from the CPU statistics, so both sides see the same inputs
            Tensor outs[3] = {y, mean, stats_like(rows, dt, st::kCPU)};
            st::run_kernel(st::OpId::layer_norm, dt, st::KernelCall{std::vector<Tensor>{x, w, b}, outs, &p});
            Tensor g = random({rows, n}, dt);
            Tensor gw = w.defined() ? st::empty({n}, dt) : Tensor(), gb = affine == 0 ? st::empty({n}, dt) : Tensor();
            compare_kernel(st::OpId::layer_norm_backward, dt, {g, x, outs[1], outs[2], w}, {y, gw, gb}, &p,
                           what + " backward");
          }
}

// Many rows: the weight and bias gradients' first stage splits them into many chunks.
TEST(CudaNorm, LayerNormParameterGradientsOverManyRows) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : {st::kFloat32, st::kFloat64})
    for (int64_t n : {33, 1500}) {
      const int64_t rows = 5003;
      const st::nn::LayerNormParams p{1e-5, false};
      Tensor x = random({rows, n}, dt), w = random({n}, dt, 0.5, 1.5), g = random({rows, n}, dt);
      Tensor outs[3] = {st::empty({rows, n}, dt), stats_like(rows, dt, st::kCPU), stats_like(rows, dt, st::kCPU)};
      st::run_kernel(st::OpId::layer_norm, dt, st::KernelCall{std::vector<Tensor>{x, w, Tensor()}, outs, &p});
      compare_kernel(st::OpId::layer_norm_backward, dt, {g, x, outs[1], outs[2], w},
                     {outs[0], st::empty({n}, dt), st::empty({n}, dt)}, &p, name("layer_norm_backward", dt, rows, n));
      // deterministic: the same bits twice
      Tensor gx = gpu(g), xx = gpu(x), mm = gpu(outs[1]), rr = gpu(outs[2]), ww = gpu(w);
      std::vector<Tensor> first, second;
      for (auto* res : {&first, &second}) {
        Tensor o[3] = {st::empty({rows, n}, st::TensorOptions(dt, st::Device::cuda())),
                       st::empty({n}, st::TensorOptions(dt, st::Device::cuda())),
                       st::empty({n}, st::TensorOptions(dt, st::Device::cuda()))};
        st::run_kernel(st::OpId::layer_norm_backward, dt,
                       st::KernelCall{std::vector<Tensor>{gx, xx, mm, rr, ww}, o, &p});
        res->assign(o, o + 3);
      }
      for (int k = 0; k < 3; ++k) EXPECT_TRUE(st::equal(host(first[k]), host(second[k]))) << "output " << k;
    }
}

TEST(CudaNorm, NormalizationLayersWithAutograd) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kFloat)
    for (int64_t n : {7, 1023, 4097}) {
      // a transposed (non-contiguous) input of shape (3, 5, n)
      Tensor base = random({3, n, 5}, dt, -1, 2);
      Tensor w = random({n}, dt, 0.5, 1.5), b = random({n}, dt);
      auto run = [&](bool on_gpu, int which) {
        Tensor x = (on_gpu ? gpu(base) : base).transpose(1, 2).detach().requires_grad_();
        Tensor wd = (on_gpu ? gpu(w) : w).detach().requires_grad_(), bd = (on_gpu ? gpu(b) : b).detach().requires_grad_();
        Tensor y = which == 0   ? F::layer_norm(x, {n}, wd, bd, 1e-5)
                   : which == 1 ? F::rms_norm(x, {n}, wd, 1e-6)
                                : F::layer_norm(x, {5, n}, Tensor(), Tensor(), 1e-5);
        Tensor up = on_gpu ? gpu(base.transpose(1, 2).contiguous()) : base.transpose(1, 2).contiguous();
        y.backward(up);
        return std::vector<Tensor>{y.detach(), x.grad(), wd.grad(), bd.grad()};
      };
      for (int which = 0; which < 3; ++which) {
        const auto c = run(false, which), g = run(true, which);
        const std::string what = name(which == 0 ? "layer_norm" : which == 1 ? "rms_norm" : "layer_norm 2-d", dt, 15, n);
        for (size_t k = 0; k < c.size(); ++k) {
          ASSERT_EQ(c[k].defined(), g[k].defined()) << what << " output " << k;
          if (c[k].defined()) expect_close(c[k], g[k], what + " output " + std::to_string(k), tol(dt));
        }
      }
    }
}

TEST(CudaNorm, CrossEntropyKernels) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kFloat)
    for (int64_t c : kRowLengths)
      for (bool weighted : {false, true})
        for (double eps : {0.0, 0.1}) {
          const int64_t rows = 19;
          const std::string what = name("cross_entropy_fused", dt, rows, c) + (weighted ? " weighted" : "") +
                                   " eps " + std::to_string(eps);
          Tensor x = random({rows, c}, dt, -4, 4);
          std::vector<int64_t> tv;
          for (int64_t i = 0; i < rows; ++i) tv.push_back(i % 4 == 1 ? -100 : (i * 131 + 7) % c);
          Tensor t = st::from_vector<int64_t>(tv, st::Shape{rows});
          Tensor w = weighted ? random({c}, dt, 0.2, 2) : Tensor();
          const double total = weighted ? st::sum(w.to(st::kFloat64)).item<double>() : static_cast<double>(c);
          const st::nn::CrossEntropyParams p{-100, eps, total};
          Tensor loss = st::empty({rows}, dt), lse = stats_like(rows, dt, st::kCPU);
          compare_kernel(st::OpId::cross_entropy_fused, dt, {x, t, w}, {loss, lse}, &p, what);
          Tensor outs[2] = {loss, lse};
          st::run_kernel(st::OpId::cross_entropy_fused, dt, st::KernelCall{std::vector<Tensor>{x, t, w}, outs, &p});
          for (bool per_row : {false, true}) {
            Tensor g = per_row ? random({rows}, dt) : st::full({}, 0.3, dt);
            compare_kernel(st::OpId::cross_entropy_fused_backward, dt, {g, x, t, lse, w}, {st::empty({rows, c}, dt)},
                           &p, what + (per_row ? " backward (N)" : " backward 0-d"));
          }
        }
}

TEST(CudaNorm, CrossEntropyWithAutograd) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kFloat)
    for (int64_t c : {7, 1023, 4097})
      for (std::string red : {"mean", "sum", "none"}) {
        const int64_t rows = 37;
        Tensor base = random({c, rows}, dt, -3, 3);  // transposed below: non-contiguous logits
        std::vector<int64_t> tv;
        for (int64_t i = 0; i < rows; ++i) tv.push_back(i % 6 == 5 ? -100 : (i * 17) % c);
        Tensor t = st::from_vector<int64_t>(tv, st::Shape{rows});
        Tensor w = random({c}, st::kFloat32, 0.5, 1.5);
        const F::CrossEntropyOptions o{w, -100, red, 0.05};
        auto run = [&](bool on_gpu) {
          Tensor x = (on_gpu ? gpu(base) : base).t().detach().requires_grad_();
          F::CrossEntropyOptions oo = o;
          if (on_gpu) oo.weight = gpu(w);
          Tensor loss = F::cross_entropy(x, on_gpu ? gpu(t) : t, oo);
          loss.sum().backward();
          return std::vector<Tensor>{loss.detach(), x.grad()};
        };
        const auto cpu = run(false), cuda = run(true);
        const std::string what = name("cross_entropy", dt, rows, c) + " " + red;
        expect_close(cpu[0], cuda[0], what + " loss", tol(dt));
        expect_close(cpu[1], cuda[1], what + " grad", tol(dt));
      }
}
