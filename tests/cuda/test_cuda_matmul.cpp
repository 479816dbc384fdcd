// CUDA matmul and linear (cuBLASLt, kernels/cuda/gemm.h) against float64 CPU references on
// fresh random inputs: every dtype (f32 with TF32 off and on, f64, f16, bf16), odd shapes
// from 1 to 1000+, transposed, offset (misaligned) and step-sliced operands, batched products
// with broadcast batch dims, zero-size dims (k = 0 gives zeros, or the bias), linear's bias
// and GELU epilogues, large K with exact f32 accumulation, a result past 2^31 elements, user
// streams and threads, autograd through linear and einsum, and bad input. Without a GPU every
// test is skipped with a message.
#include <array>
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_testing.h"
#include "testing.h"

using namespace strata;
using strata::cuda_testing::gpu;
using strata::cuda_testing::host;
using strata::cuda_testing::random;
using strata::testing::values;

namespace {

// The exact (float64) result and, per element, the sum of |terms| that scales its rounding.
struct Ref {
  std::vector<double> value, bound;
  Shape shape;
};

Ref matmul_reference(const Tensor& a, const Tensor& b) {
  const Tensor a64 = host(a).to(kFloat64), b64 = host(b).to(kFloat64);
  const Tensor c = matmul(a64, b64);
  return {values(c), values(matmul(abs(a64), abs(b64))), c.shape()};
}

Ref linear_reference(const Tensor& x, const Tensor& w, const Tensor& b, bool gelu) {
  const Tensor x64 = host(x).to(kFloat64), w64 = host(w).to(kFloat64);
  const Tensor b64 = b.defined() ? host(b).to(kFloat64) : Tensor();
  Tensor y = linear(x64, w64, b64);
  if (gelu) y = strata::gelu(y, "tanh");
  Ref r{values(y), values(linear(abs(x64), abs(w64), b.defined() ? abs(b64) : Tensor())), y.shape()};
  for (double& v : r.bound) v += 1;  // GELU's and the output's own rounding
  return r;
}

// Rounding allowed per unit of bound: the k-term accumulation's and the output's.
double tolerance(DType t, int64_t k, bool tf32 = false) {
  const double kk = static_cast<double>(std::max<int64_t>(k, 1));
  switch (t) {
    case kFloat64: return 4 * kk * 1.1e-16;
    case kFloat32: return 4 * kk * 6e-8 + (tf32 ? 2e-3 : 0);  // TF32 keeps 10 mantissa bits of each input
    case kFloat16: return 2 * (kk * 6e-8 + 4.9e-4);
    case kBFloat16: return 2 * (kk * 6e-8 + 3.9e-3);
    default: return 0;
  }
}

::testing::AssertionResult close_to(const Tensor& got, const Ref& want, double tol) {
  if (!got.device().is_cuda()) return ::testing::AssertionFailure() << "result is on " << fmt::format("{}", got.device());
  if (got.shape() != want.shape)
    return ::testing::AssertionFailure() << "shape " << fmt::format("{} != {}", got.shape(), want.shape);
  const std::vector<double> g = values(got);
  // a result among the subnormals rounds to their spacing, whatever its size (float16's is 2^-24)
  const double floor = got.dtype() == kFloat16 ? std::ldexp(1.0, -25) : 1e-300;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - want.value[i]) <= tol * want.bound[i] + floor))
      return ::testing::AssertionFailure() << "element " << i << ": cuda " << g[i] << ", float64 " << want.value[i]
                                           << " (tolerance " << tol * want.bound[i] << ")";
  return ::testing::AssertionSuccess();
}

// How an operand reaches the GEMM: as it is, stored transposed (read in place as a
// transpose), a window of a wider buffer (unit-stride rows, a larger leading dim and an
// address one element off alignment), or every other column (irregular: copied first).
enum class View { Contiguous, Transposed, Offset, Strided };
const View kViews[] = {View::Contiguous, View::Transposed, View::Offset, View::Strided};
const char* view_name(View v) {
  switch (v) {
    case View::Contiguous: return "contiguous";
    case View::Transposed: return "transposed";
    case View::Offset: return "offset";
    case View::Strided: return "strided";
  }
  return "?";
}

// t's values on the GPU, laid out as `v` (over its last two dims; a vector only as Offset, a
// bias one element off the 16-byte alignment cuBLASLt's bias epilogue reads with).
Tensor on_gpu(const Tensor& t, View v) {
  if (v == View::Contiguous || (t.dim() < 2 && v != View::Offset)) return gpu(t);
  if (v == View::Transposed) return gpu(t.transpose(-1, -2).contiguous()).transpose(-1, -2);
  Shape big = t.shape();
  const int64_t cols = big.back();
  big.back() = v == View::Offset ? cols + 3 : 2 * cols;
  Tensor buffer = zeros(big, TensorOptions(t.dtype(), Device::cuda()));
  Tensor view = v == View::Offset ? buffer.slice(-1, 1, cols + 1) : buffer.slice(-1, 0, 2 * cols, 2);
  view.copy_(gpu(t));
  return view;
}

const std::vector<DType> kTypes = {kFloat32, kFloat64, kFloat16, kBFloat16};

// Restores the TF32 switch when a test ends, whatever it set.
struct Tf32Scope {
  bool saved = cuda::allow_tf32();
  explicit Tf32Scope(bool on) { cuda::set_allow_tf32(on); }
  ~Tf32Scope() { cuda::set_allow_tf32(saved); }
};

}  // namespace

TEST(CudaMatmul, Tf32IsOffByDefaultAndSwitches) {
  EXPECT_FALSE(cuda::allow_tf32());  // also in a build without CUDA
  {
    Tf32Scope on(true);
    EXPECT_TRUE(cuda::allow_tf32());
  }
  EXPECT_FALSE(cuda::allow_tf32());
}

TEST(CudaMatmul, OddShapesEveryDtypeAndView) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1},   {7, 7, 7},      {33, 1, 7},       {1, 257, 33},
                                                      {257, 33, 1}, {7, 1000, 33}, {1031, 257, 65}, {64, 1, 1031}};
  for (DType t : kTypes)
    for (const auto& [m, k, n] : shapes) {
      const Tensor a = random({m, k}, t), b = random({k, n}, t);
      const Ref want = matmul_reference(a, b);
      for (View va : kViews)
        for (View vb : kViews) {
          SCOPED_TRACE(fmt::format("{} ({}, {}) x ({}, {}) {} x {}", t, m, k, k, n, view_name(va), view_name(vb)));
          ASSERT_TRUE(close_to(matmul(on_gpu(a, va), on_gpu(b, vb)), want, tolerance(t, k)));
        }
      if (t == kFloat32) {  // the same with TF32 tensor cores
        Tf32Scope tf32(true);
        for (View v : {View::Contiguous, View::Transposed}) {
          SCOPED_TRACE(fmt::format("tf32 ({}, {}) x ({}, {}) {}", m, k, k, n, view_name(v)));
          ASSERT_TRUE(close_to(matmul(on_gpu(a, v), on_gpu(b, v)), want, tolerance(t, k, true)));
        }
      }
    }
}

// With TF32 off, float32 inputs keep all 24 bits: 1 + 2^-12, which TF32's 11 bits round to 1,
// sums to 64 + 2^-6 exactly (every partial sum j (1 + 2^-12), j <= 64, fits in 24 bits).
TEST(CudaMatmul, Tf32OffKeepsFullFloat32Inputs) {
  SKIP_WITHOUT_GPU();
  Tf32Scope off(false);
  const Tensor a = full({64, 64}, 1.0 + std::ldexp(1.0, -12), TensorOptions(kFloat32, Device::cuda()));
  const Tensor b = ones({64, 64}, TensorOptions(kFloat32, Device::cuda()));
  for (double v : values(matmul(a, b))) ASSERT_EQ(v, 64.0 + std::ldexp(1.0, -6));
}

TEST(CudaMatmul, BatchedAndBroadcast) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  struct Case {
    Shape a, b;
  };
  const std::vector<Case> cases = {
      {{3, 7, 33}, {3, 33, 5}},     {{2, 1, 7, 5}, {1, 3, 5, 6}}, {{4, 33, 17}, {17, 9}},  // one (132, 17) product
      {{7, 33}, {3, 33, 5}},        {{5, 1, 257}, {5, 257, 1}},   {{2, 3, 4, 5}, {3, 5, 4}},
      {{6, 1, 33}, {33}},           {{33}, {6, 33, 2}},           {{2, 1, 40, 50}, {3, 50, 40}},
      {{70000, 2, 3}, {70000, 3, 2}},  // more batches than a grid dim holds
  };
  for (DType t : kTypes)
    for (const Case& c : cases) {
      const Tensor a = random(c.a, t), b = random(c.b, t);
      const Ref want = matmul_reference(a, b);
      for (View v : {View::Contiguous, View::Transposed, View::Strided}) {
        SCOPED_TRACE(fmt::format("{} {} x {} {}", t, c.a, c.b, view_name(v)));
        ASSERT_TRUE(close_to(matmul(on_gpu(a, v), on_gpu(b, v)), want, tolerance(t, c.a.back())));
      }
    }
  // attention-style permuted operands, and an operand expanded over the batch (stride 0)
  const Tensor q = random({2, 24, 3, 16}, kFloat16), kt = random({2, 24, 3, 16}, kFloat16);
  const Tensor qp = gpu(q).permute({0, 2, 1, 3}), kp = gpu(kt).permute({0, 2, 3, 1});  // (B, H, T, D), (B, H, D, T)
  EXPECT_TRUE(close_to(matmul(qp, kp), matmul_reference(q.permute({0, 2, 1, 3}), kt.permute({0, 2, 3, 1})),
                       tolerance(kFloat16, 16)));
  const Tensor shared = random({1, 7, 5}, kBFloat16), ys = random({4, 5, 9}, kBFloat16);
  EXPECT_TRUE(close_to(bmm(gpu(shared).expand({4, 7, 5}), gpu(ys)),
                       matmul_reference(shared.expand({4, 7, 5}), ys), tolerance(kBFloat16, 5)));
  const Tensor x = random({3, 7, 33}, kFloat64), y = random({3, 33, 5}, kFloat64);
  EXPECT_TRUE(close_to(bmm(gpu(x), gpu(y)), matmul_reference(x, y), tolerance(kFloat64, 33)));
  EXPECT_TRUE(close_to(mm(gpu(x[0]), gpu(y[1])), matmul_reference(x[0], y[1]), tolerance(kFloat64, 33)));
}

TEST(CudaMatmul, ZeroSizeDims) {
  SKIP_WITHOUT_GPU();
  for (DType t : kTypes) {
    const TensorOptions o(t, Device::cuda());
    Tensor c = matmul(ones({4, 0}, o), ones({0, 3}, o));  // k == 0: zeros
    EXPECT_EQ(c.shape(), (Shape{4, 3}));
    EXPECT_EQ(values(c), std::vector<double>(12, 0));
    EXPECT_EQ(values(bmm(ones({2, 3, 0}, o), ones({2, 0, 2}, o))), std::vector<double>(12, 0));
    EXPECT_EQ(matmul(ones({0, 5}, o), ones({5, 3}, o)).shape(), (Shape{0, 3}));
    EXPECT_EQ(matmul(ones({0, 4, 5}, o), ones({5, 2}, o)).shape(), (Shape{0, 4, 2}));
    EXPECT_EQ(matmul(ones({3, 4, 0}, o), ones({0, 2}, o)).shape(), (Shape{3, 4, 2}));
    EXPECT_EQ(matmul(ones({0}, o), ones({0}, o)).item<double>(), 0);
    // linear with k == 0 leaves the bias, and its GELU
    const Tensor bias = full({3}, 0.5, o);
    EXPECT_EQ(values(linear(ones({2, 0}, o), ones({3, 0}, o), bias)), std::vector<double>(6, 0.5));
    const std::vector<double> g = values(linear_gelu(ones({2, 0}, o), ones({3, 0}, o), bias));
    for (double v : g) EXPECT_NEAR(v, 0.5 * 0.5 * (1 + std::tanh(0.7978845608 * (0.5 + 0.044715 * 0.125))), 1e-2);
  }
}

TEST(CudaMatmul, LinearBiasAndGeluEpilogues) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  struct Case {
    Shape x;
    int64_t out;
  };
  const std::vector<Case> cases = {{{1, 1}, 1},       {{7, 33}, 5},    {{2, 3, 257}, 33}, {{1031, 65}, 257},
                                   {{5, 1000}, 7},    {{3, 64}, 1},    {{64}, 48},        {{4, 2, 7, 9}, 1031}};
  for (DType t : kTypes)
    for (const Case& c : cases) {
      const int64_t in = c.x.back();
      const Tensor x = random(c.x, t), w = random({c.out, in}, t), b = random({c.out}, t);
      for (bool bias : {true, false})
        for (bool gelu : {false, true}) {
          const Tensor bb = bias ? b : Tensor();
          const Ref want = linear_reference(x, w, bb, gelu);
          for (View vw : kViews) {
            SCOPED_TRACE(fmt::format("{} x {} out {} bias {} gelu {} weight and bias {}", t, c.x, c.out, bias, gelu,
                                     view_name(vw)));
            const Tensor gx = gpu(x), gw = on_gpu(w, vw), gb = bias ? on_gpu(b, vw) : Tensor();
            const Tensor y = gelu ? linear_gelu(gx, gw, gb) : linear(gx, gw, gb);
            ASSERT_TRUE(close_to(y, want, tolerance(t, in)));
            if (!gelu) ASSERT_TRUE(close_to(nn::functional::linear(gx, gw, gb), want, tolerance(t, in)));
          }
        }
    }
  // nn::Linear on the GPU
  nn::Linear fc(33, 17);
  const Tensor x = random({5, 33}, kFloat32);
  const Ref want = linear_reference(x, fc.weight, fc.bias, false);
  fc.to(Device::cuda());
  EXPECT_TRUE(close_to(fc(gpu(x)), want, tolerance(kFloat32, 33)));
}

// Sums of ones are integers, exact in float32 however the sum is split: any accumulation in
// the 16-bit output type would round them.
TEST(CudaMatmul, LargeKAccumulatesInFloat32) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  struct Case {
    DType t;
    int64_t k;
  };
  for (Case c : {Case{kBFloat16, 3 << 20}, Case{kFloat16, 61440}, Case{kFloat32, 3 << 20}}) {
    SCOPED_TRACE(fmt::format("{} k = {}", c.t, c.k));
    const TensorOptions o(c.t, Device::cuda());
    for (double v : values(matmul(ones({2, c.k}, o), ones({c.k, 3}, o)))) ASSERT_EQ(v, static_cast<double>(c.k));
    const double with_bias = full({1}, c.k + 1.0, c.t).item<double>();  // k + 1 rounded to the dtype
    for (double v : values(linear(ones({3, c.k}, o), ones({2, c.k}, o), ones({2}, o)))) ASSERT_EQ(v, with_bias);
  }
  const Tensor a = random({3, 1 << 20}, kFloat32), b = random({1 << 20, 5}, kFloat32);
  EXPECT_TRUE(close_to(matmul(gpu(a), gpu(b)), matmul_reference(a, b), tolerance(kFloat32, 1 << 20)));
}

// A (65539, 32769) float16 result holds more than 2^31 elements: the GEMM and the epilogue
// kernel index it with 64 bits. Checked on its first, last and a middle row.
TEST(CudaMatmul, ResultPast2To31Elements) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const int64_t m = 65539, n = 32769;
  const Tensor a = random({m, 1}, kFloat16), w = random({n, 1}, kFloat16), bias = random({n}, kFloat16);
  const Tensor ga = gpu(a), gw = gpu(w), gb = gpu(bias);
  const std::vector<double> va = values(a), vw = values(w), vb = values(bias);
  const Tensor y = linear(ga, gw, gb);  // (m, n) = a w^T + bias
  const Tensor z = linear(gpu(zeros({m, 0}, kFloat16)), gpu(zeros({n, 0}, kFloat16)), gb);  // k == 0: the bias
  for (int64_t row : {int64_t(0), m / 2 + 1, m - 1}) {
    const std::vector<double> got = values(y[row]), bias_only = values(z[row]);
    for (int64_t j = 0; j < n; ++j) {
      const double want = va[row] * vw[j] + vb[j];
      ASSERT_NEAR(got[j], want, 2e-3 * (std::fabs(va[row] * vw[j]) + std::fabs(vb[j])) + 1e-6) << row << ", " << j;
      ASSERT_EQ(bias_only[j], vb[j]) << row << ", " << j;
    }
  }
}

TEST(CudaMatmul, UserStreamsAndThreads) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  // a long k and small m, n: cuBLASLt splits k and sums the partials in the workspace with a
  // second kernel, which another thread's GEMM on the same stream must not overwrite between
  constexpr int64_t k = 2048;
  constexpr int kRuns = 40;
  const Tensor a = random({96, k}, kFloat32), b = random({k, 72}, kFloat32), bias = random({72}, kFloat32);
  const Ref want = matmul_reference(a, b);
  const Ref want_linear = linear_reference(a, b.t(), bias, false);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      cuda::set_device(0);
      // threads 0 and 1 share the default stream (each with its own workspace); 2 and 3 have
      // their own streams
      const cuda::Stream s = t < 2 ? cuda::Stream::default_stream(0) : cuda::Stream::create(0);
      cuda::StreamGuard guard(s);
      for (int i = 0; i < kRuns; ++i) {
        Tensor c = matmul(gpu(a), on_gpu(b, i % 2 ? View::Transposed : View::Contiguous));
        Tensor y = linear(gpu(a), gpu(b.t().contiguous()), gpu(bias));
        s.synchronize();
        ok[t] += close_to(c, want, tolerance(kFloat32, k)) && close_to(y, want_linear, tolerance(kFloat32, k));
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, std::vector<int>(4, kRuns));
}

TEST(CudaMatmul, LinearBackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  // the bias gradient is a column sum: checked where a CUDA sum kernel is registered
  const bool with_bias = ext::has_kernel(OpId::sum, DeviceType::CUDA, kFloat32);
  const Tensor x = random({2, 5, 33}, kFloat32), w = random({17, 33}, kFloat32), b = random({17}, kFloat32);
  const Tensor gy = random({2, 5, 17}, kFloat32);
  std::vector<Tensor> cpu_in = {x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()};
  std::vector<Tensor> gpu_in = {gpu(x).requires_grad_(), gpu(w).requires_grad_(), gpu(b).requires_grad_()};
  if (!with_bias) cpu_in.pop_back(), gpu_in.pop_back();
  auto run = [&](const std::vector<Tensor>& in, const Tensor& g) {
    Tensor y = linear(in[0], in[1], with_bias ? in[2] : Tensor());
    return autograd::grad({y}, in, {g});
  };
  const std::vector<Tensor> want = run(cpu_in, gy), got = run(gpu_in, gpu(gy));
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(fmt::format("gradient {}", i));
    const std::vector<double> g = values(got[i]), w64 = values(want[i]);
    ASSERT_EQ(g.size(), w64.size());
    EXPECT_TRUE(got[i].device().is_cuda());
    for (size_t j = 0; j < g.size(); ++j) ASSERT_NEAR(g[j], w64[j], 1e-4 * (1 + std::fabs(w64[j])));
  }
}

TEST(CudaMatmul, EinsumMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  cuda::set_allow_tf32(false);
  struct Case {
    const char* equation;
    std::vector<Shape> shapes;
  };
  const Case cases[] = {{"bhqd,bhkd->bhqk", {{2, 3, 17, 8}, {2, 3, 9, 8}}},
                        {"ii->i", {{7, 7}}},
                        {"ij,jk,kl->il", {{5, 6}, {6, 7}, {7, 3}}},
                        {"...ij,jk", {{2, 3, 4, 5}, {5, 6}}},
                        {"bij,bjk->ik", {{1, 3, 4}, {2, 4, 2}}}};
  for (DType dt : {kFloat32, kFloat64})
    for (const Case& c : cases) {
      SCOPED_TRACE(fmt::format("{} {}", c.equation, dtype_name(dt)));
      std::vector<Tensor> cpu_in, gpu_in;
      for (const Shape& s : c.shapes) {
        const Tensor x = random(s, dt);
        cpu_in.push_back(x.clone().requires_grad_());
        gpu_in.push_back(gpu(x).requires_grad_());
      }
      const Tensor yc = einsum(c.equation, cpu_in), yg = einsum(c.equation, gpu_in);
      ASSERT_TRUE(yg.device().is_cuda());
      const Tensor gy = random(yc.shape(), dt);
      const std::vector<Tensor> want = autograd::grad({yc}, cpu_in, {gy});
      const std::vector<Tensor> got = autograd::grad({yg}, gpu_in, {gpu(gy)});
      std::vector<std::pair<Tensor, Tensor>> pairs = {{yc, yg}};
      for (size_t i = 0; i < want.size(); ++i) pairs.push_back({want[i], got[i]});
      for (const auto& [a, b] : pairs) {
        const std::vector<double> va = values(a), vb = values(host(b));
        ASSERT_EQ(va.size(), vb.size());
        for (size_t j = 0; j < va.size(); ++j) ASSERT_NEAR(vb[j], va[j], 1e-4 * (1 + std::fabs(va[j])));
      }
    }
}

TEST(CudaMatmul, BadInput) {
  SKIP_WITHOUT_GPU();
  const Tensor g = ones({2, 3}, TensorOptions(kFloat32, Device::cuda()));
  EXPECT_THROW(matmul(g, ones({3, 2})), Error);  // devices differ
  EXPECT_THROW(linear(g, ones({4, 3})), Error);
  EXPECT_THROW(matmul(g, ones({4, 2}, TensorOptions(kFloat32, Device::cuda()))), Error);
  EXPECT_THROW(matmul(ones({2, 3}, TensorOptions(kInt32, Device::cuda())), ones({3, 2}, TensorOptions(kInt32, Device::cuda()))),
               Error);  // no integer GEMM on CUDA
  try {
    matmul(g, ones({3, 2}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[matmul]"), std::string::npos) << e.what();
  }
}
