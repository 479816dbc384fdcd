// CUDA fused attention (kernels/cuda/attention.cu) against the CPU kernels (kernels/cpu/
// attention.h, themselves tested against float64 references in tests/nn/test_attention_fused.cpp)
// on fresh random inputs: float32, float16 and bfloat16; head dims 8, 32, 64, 100 and 128 (each
// padded size, and one that is not a multiple of 16); query and key counts around the 64-row
// tiles, more queries than keys and fewer; with and without the causal mask; the saved
// logsumexp and all three gradients. Then through scaled_dot_product_attention with autograd on
// strided heads as a GPT makes them, more problems than a grid dim holds, repeatability, and
// which inputs the CUDA path leaves to the composed ops, scores in the tens, and dropout; every
// tensor strided as a projection's heads, and keys shared by the heads.
// Without a GPU every test is skipped.
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/cuda_testing.h"
#include "nn/attention_internal.h"

namespace st = strata;
namespace F = strata::nn::functional;
using st::DType;
using st::Tensor;
using st::cuda_testing::expect_close;
using st::cuda_testing::gpu;
using st::cuda_testing::host;
using st::cuda_testing::random;

namespace {

// Relative to max(1, |cpu value|): both sides compute in float, in another order; 16-bit
// results may round to a neighbour.
double tol(DType dt) { return dt == st::kFloat32 ? 5e-5 : dt == st::kFloat16 ? 4e-3 : 3e-2; }

// Switches CUDA's fused attention on for a scope (it is off by default).
struct CudaFused : F::FusedAttentionGuard {
  CudaFused() : F::FusedAttentionGuard(st::DeviceType::CUDA, true) {}
};

std::string node_of(const Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : ""; }

// A (2, 3, rows, D) tensor of random values on the CPU: contiguous, or with the heads inside
// the rows, as (2, rows, 3, D) transposed.
Tensor heads_tensor(int64_t rows, int64_t D, DType dt, bool strided, double lo = -1, double hi = 1) {
  return strided ? random({2, rows, 3, D}, dt, lo, hi).transpose(1, 2) : random({2, 3, rows, D}, dt, lo, hi);
}

// x on the GPU, laid out as x is (contiguous, or the transpose of a contiguous (2, rows, 3, D)).
Tensor gpu_like(const Tensor& x) { return x.is_contiguous() ? gpu(x) : gpu(x.transpose(1, 2)).transpose(1, 2); }

// One problem size through both kernels on both devices; q_range spreads the scores. strided:
// every tensor, inputs and outputs, keeps its heads inside its rows.
void compare_kernels(DType dt, int64_t D, int64_t L, int64_t S, bool causal, double q_range, double dropout = 0,
                     bool strided = false) {
  const std::string what = std::string(st::dtype_name(dt)) + " D " + std::to_string(D) + " L " +
                           std::to_string(L) + " S " + std::to_string(S) + (causal ? " causal" : "") +
                           " q in +-" + std::to_string(q_range) + " dropout " + std::to_string(dropout) +
                           (strided ? " strided" : "");
  // head dims past 64 take 150.5 KiB of shared memory a block (WhichPath): not on every GPU
  if (D > 64 && st::cuda::get_device_properties(0).shared_memory_per_block_optin < 154112) {
    std::printf("[   NOTE   ] %s: more shared memory than this GPU gives a block, not compared\n", what.c_str());
    return;
  }
  Tensor q = heads_tensor(L, D, dt, strided, -q_range, q_range), k = heads_tensor(S, D, dt, strided, -2, 2);
  Tensor v = heads_tensor(S, D, dt, strided), go = heads_tensor(L, D, dt, strided);
  // an offset past 2^32 blocks and element counts not a multiple of 4 test the draw's indexing
  const st::nn::detail::AttentionParams p{1 / std::sqrt(double(D)), causal, dropout, 1234, (uint64_t(1) << 32) + 3};
  auto fresh = [](const Tensor& like, st::Device dev) {
    Tensor t = st::empty(like.shape(), st::TensorOptions(like.dtype(), dev));
    return like.is_contiguous() ? t : t.as_strided(like.shape(), like.strides());
  };
  Tensor lse_like = st::empty({6, L}, st::TensorOptions(st::kFloat32));
  std::vector<Tensor> c_out = {fresh(go, st::kCPU), fresh(lse_like, st::kCPU)};
  std::vector<Tensor> g_out = {fresh(go, st::Device::cuda()), fresh(lse_like, st::Device::cuda())};
  const std::vector<Tensor> c_in = {q, k, v}, g_in = {gpu_like(q), gpu_like(k), gpu_like(v)};
  st::run_kernel(st::OpId::attention, dt, st::KernelCall{c_in, c_out, &p});
  st::run_kernel(st::OpId::attention, dt, st::KernelCall{g_in, g_out, &p});
  expect_close(c_out[0], g_out[0], what + " o", tol(dt));
  expect_close(c_out[1], g_out[1], what + " lse", 2e-5);
  // the backward from the same saved output and logsumexp on both sides
  std::vector<Tensor> c_grad = {fresh(q, st::kCPU), fresh(k, st::kCPU), fresh(v, st::kCPU)};
  std::vector<Tensor> g_grad = {fresh(q, st::Device::cuda()), fresh(k, st::Device::cuda()),
                                fresh(v, st::Device::cuda())};
  const std::vector<Tensor> c_bin = {q, k, v, c_out[0], go, c_out[1]};
  const std::vector<Tensor> g_bin = {g_in[0], g_in[1], g_in[2], gpu_like(c_out[0]), gpu_like(go), gpu(c_out[1])};
  st::run_kernel(st::OpId::attention_backward, dt, st::KernelCall{c_bin, c_grad, &p});
  st::run_kernel(st::OpId::attention_backward, dt, st::KernelCall{g_bin, g_grad, &p});
  expect_close(c_grad[0], g_grad[0], what + " dq", 2 * tol(dt));
  expect_close(c_grad[1], g_grad[1], what + " dk", 2 * tol(dt));
  expect_close(c_grad[2], g_grad[2], what + " dv", 2 * tol(dt));
}

}  // namespace

TEST(CudaAttention, KernelsMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  struct Size {
    int64_t L, S;
  };
  for (DType dt : {st::kFloat32, st::kFloat16, st::kBFloat16})
    for (int64_t D : {8, 32, 64, 100, 128})
      for (Size z : {Size{1, 1}, {5, 5}, {64, 64}, {65, 130}, {130, 65}, {257, 257}})
        for (bool causal : {false, true}) compare_kernels(dt, D, z.L, z.S, causal, 2);
}

// Every tensor strided as the heads of one projection are: rows 3 D apart, heads D apart.
TEST(CudaAttention, StridedKernelsMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : {st::kFloat32, st::kBFloat16})
    for (bool causal : {false, true}) {
      compare_kernels(dt, 64, 130, 130, causal, 2, 0, true);
      compare_kernels(dt, 40, 70, 150, causal, 2, 0.2, true);
    }
}

// Dropout: the same weights dropped on both devices (the composed path's draw, checked on the
// CPU in tests/nn/test_attention_fused.cpp).
TEST(CudaAttention, DropoutMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : {st::kFloat32, st::kBFloat16})
    for (bool causal : {false, true}) {
      compare_kernels(dt, 64, 130, 67, causal, 2, 0.3);
      compare_kernels(dt, 100, 5, 201, causal, 2, 0.6);
    }
}

// Scores in the tens: the running maximum moves by large steps from tile to tile.
TEST(CudaAttention, LargeScores) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : {st::kFloat32, st::kBFloat16})
    for (bool causal : {false, true}) compare_kernels(dt, 64, 130, 200, causal, 20);
}

// As a GPT calls it: heads are strided views of one projection, the output is transposed back.
TEST(CudaAttention, AutogradOnStridedHeadsMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  CudaFused fused;
  const int64_t B = 2, T = 150, H = 4, hd = 64;
  for (DType dt : {st::kFloat32, st::kBFloat16})
    for (double dropout : {0.0, 0.2}) {
      Tensor qkv = random({B, T, 3 * H * hd}, dt), g = random({B, T, H * hd}, dt);
      auto run = [&](const Tensor& x, const Tensor& gy) {
        Tensor leaf = x.detach().clone().requires_grad_();
        auto parts = st::split(leaf, H * hd, 2);
        auto heads = [&](int i) { return parts[size_t(i)].view({B, T, H, hd}).transpose(1, 2); };
        st::Generator draw(3);  // the same weights dropped on both devices
        Tensor y = F::scaled_dot_product_attention(heads(0), heads(1), heads(2), Tensor(), dropout, true, std::nullopt,
                                                   &draw);
        EXPECT_EQ(node_of(y), "attention") << y.device();
        y.transpose(1, 2).reshape({B, T, H * hd}).backward(gy);
        return std::pair{y.detach(), leaf.grad()};
      };
      auto [cy, cg] = run(qkv, g);
      auto [gy, gg] = run(gpu(qkv), gpu(g));
      const std::string what = std::string(st::dtype_name(dt)) + " dropout " + std::to_string(dropout);
      expect_close(cy, gy, what + " output", tol(dt));
      expect_close(cg, gg, what + " gradient of qkv", 2 * tol(dt));
    }
}

// Keys and values shared by the heads (batch dims that broadcast, read through stride-0 views),
// their gradients summed over the heads.
TEST(CudaAttention, SharedKeysMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  CudaFused fused;
  Tensor q = random({2, 4, 70, 32}, st::kFloat32), k = random({2, 1, 90, 32}, st::kFloat32);
  Tensor v = random({2, 1, 90, 32}, st::kFloat32), g = random({2, 4, 70, 32}, st::kFloat32);
  auto run = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv, const Tensor& gg) {
    Tensor a = qq.detach().requires_grad_(), b = kk.detach().requires_grad_(), c = vv.detach().requires_grad_();
    Tensor y = F::scaled_dot_product_attention(a, b, c, Tensor(), 0, true);
    EXPECT_EQ(node_of(y), "attention") << y.device();
    std::vector<Tensor> out = st::autograd::grad({y}, {a, b, c}, {gg});
    out.insert(out.begin(), y.detach());
    return out;
  };
  std::vector<Tensor> c = run(q, k, v, g), d = run(gpu(q), gpu(k), gpu(v), gpu(g));
  for (size_t i = 0; i < c.size(); ++i) expect_close(c[i], d[i], "result " + std::to_string(i), 2 * tol(st::kFloat32));
}

// More problems than gridDim.y could hold (they ride in x), and the backward gives the same
// bits twice (no atomics).
TEST(CudaAttention, ManyProblemsAndRepeatable) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  CudaFused fused;
  Tensor q = random({70000, 3, 16}, st::kFloat32), k = random({70000, 5, 16}, st::kFloat32);
  Tensor v = random({70000, 5, 16}, st::kFloat32), g = random({70000, 3, 16}, st::kFloat32);
  auto grads = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv, const Tensor& gg) {
    Tensor a = qq.detach().requires_grad_(), b = kk.detach().requires_grad_(), c = vv.detach().requires_grad_();
    Tensor y = F::scaled_dot_product_attention(a, b, c);
    std::vector<Tensor> out = st::autograd::grad({y}, {a, b, c}, {gg});
    out.insert(out.begin(), y.detach());
    return out;
  };
  std::vector<Tensor> c = grads(q, k, v, g), g1 = grads(gpu(q), gpu(k), gpu(v), gpu(g));
  std::vector<Tensor> g2 = grads(gpu(q), gpu(k), gpu(v), gpu(g));
  for (size_t i = 0; i < c.size(); ++i) {
    expect_close(c[i], g1[i], "result " + std::to_string(i), tol(st::kFloat32));
    expect_close(host(g1[i]), g2[i], "repeat " + std::to_string(i), 0);
  }
}

TEST(CudaAttention, WhichPath) {
  SKIP_WITHOUT_GPU();
  auto t = [](st::Shape s, DType dt = st::kFloat32) { return gpu(random(s, dt)).requires_grad_(); };
  EXPECT_FALSE(F::fused_attention_enabled(st::DeviceType::CUDA));  // until a GPU run has checked it
  EXPECT_NE(node_of(F::scaled_dot_product_attention(t({2, 4, 8}), t({2, 6, 8}), t({2, 6, 8}))), "attention");
  CudaFused fused;
  EXPECT_EQ(node_of(F::scaled_dot_product_attention(t({2, 4, 8}), t({2, 6, 8}), t({2, 6, 8}))), "attention");
  // a value dim unlike the key dim, a head dim past 128, float64: the composed ops
  EXPECT_NE(node_of(F::scaled_dot_product_attention(t({2, 4, 8}), t({2, 6, 8}), t({2, 6, 4}))), "attention");
  EXPECT_NE(node_of(F::scaled_dot_product_attention(t({1, 4, 130}), t({1, 6, 130}), t({1, 6, 130}))), "attention");
  Tensor d = t({1, 4, 8}, st::kFloat64);
  EXPECT_NE(node_of(F::scaled_dot_product_attention(d, d, d)), "attention");
  // head dims 65 to 128 take 150.5 KiB of shared memory a block (the backward's; the forward
  // takes 116 KiB): the fused kernels only where a block may opt in to that much (Hopper, A100),
  // the composed ops elsewhere (99 KiB on compute capability 8.6 and 8.9) rather than a failed launch
  const bool fits = st::cuda::get_device_properties(0).shared_memory_per_block_optin >= 154112;
  const Tensor h = t({1, 4, 128});
  EXPECT_EQ(node_of(F::scaled_dot_product_attention(h, h, h)) == "attention", fits);
}
