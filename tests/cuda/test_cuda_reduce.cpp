// CUDA reductions, softmax and scans against the CPU kernels on fresh random inputs: every op
// and dtype the CPU registers, rows of 1, 7, 1023 and 65537 elements, first / middle / last /
// all dims with and without keepdim, transposed and sliced views, reductions split across
// blocks, the NaN and infinity rules, zero-size dims, and reductions and scans past 2^31
// elements. Without a GPU every test is skipped with a message (CTest reports them skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "cuda/cuda_testing.h"

namespace st = strata;
using st::DType;
using st::Tensor;
using st::cuda_testing::gpu;
using st::cuda_testing::host;
using st::cuda_testing::random;

namespace {

const std::vector<DType> kFloat = {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16};
const std::vector<DType> kAll = {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16, st::kInt64,
                                 st::kInt32,   st::kInt8,    st::kUInt8,   st::kBool};
const std::vector<int64_t> kRowSizes = {1, 7, 1023, 65537};
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

std::string name_of(DType dt) { return std::string(st::dtype_name(dt)); }

double rel_tol(DType dt) {
  switch (dt) {
    case DType::Float32: return 1e-5;
    case DType::Float64: return 1e-12;
    case DType::Float16: return 2e-3;
    case DType::BFloat16: return 1.6e-2;
    default: return 0;
  }
}

// cuda_testing::expect_close at rel_tol of the result's dtype, plus `atol` (integers and bool
// exact).
void expect_close(const Tensor& cpu, const Tensor& cuda, const std::string& what, double atol = 0) {
  st::cuda_testing::expect_close(cpu, cuda, what, rel_tol(cpu.dtype()), atol);
}

// A float64 CPU tensor of `shape` with values from `f(i)` (flat index), converted to `dt`.
Tensor from_fn(const st::Shape& shape, DType dt, const std::function<double(int64_t)>& f) {
  Tensor t = st::empty(shape, st::kFloat64);
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f(i);
  return t.to(dt);
}

// Input layouts: a tensor and the dims lists to reduce it over. Views are taken on each
// device, so the CUDA kernels see the strides.
struct Case {
  std::string label;
  Tensor x;  // CPU tensor, contiguous
  std::function<Tensor(const Tensor&)> view;
  std::vector<std::vector<int64_t>> dims;
};

std::vector<Case> reduce_cases(DType dt, double lo, double hi) {
  auto same = [](const Tensor& t) { return t; };
  std::vector<Case> cases;
  for (int64_t n : kRowSizes) {
    cases.push_back({"(3, " + std::to_string(n) + ")", random({3, n}, dt, lo, hi), same, {{1}, {0}, {}}});
    cases.push_back({"(" + std::to_string(n) + ", 3)", random({n, 3}, dt, lo, hi), same, {{0}, {1}}});
  }
  cases.push_back({"(5, 6, 7)", random({5, 6, 7}, dt, lo, hi), same, {{0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}}});
  cases.push_back({"(4, 9, 5, 3)", random({4, 9, 5, 3}, dt, lo, hi), same, {{0, 3}, {1, 3}, {0, 2}}});
  cases.push_back({"transposed (33, 31)", random({33, 31}, dt, lo, hi), [](const Tensor& t) { return t.t(); },
                   {{0}, {1}, {}}});
  cases.push_back({"sliced step 3", random({33, 31}, dt, lo, hi),
                   [](const Tensor& t) { return t.slice(1, 1, 31, 3); }, {{0}, {1}, {}}});
  // long reductions, cut across blocks: inner rows, outer columns, and everything
  cases.push_back({"(2, 100003)", random({2, 100003}, dt, lo, hi), same, {{1}, {}}});
  cases.push_back({"(70001, 5)", random({70001, 5}, dt, lo, hi), same, {{0}}});
  return cases;
}

using ReduceFn = std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>;

struct ReduceRow {
  std::string name;
  ReduceFn f;
  std::vector<DType> dtypes;
  double lo, hi;
  bool sums;  // adds up many values: 16-bit results get an absolute slack per element
};

void check_reduce(const ReduceRow& row, DType dt) {
  for (const Case& c : reduce_cases(dt, row.lo, row.hi)) {
    Tensor xc = c.view(c.x), xg = c.view(gpu(c.x));
    for (const auto& dims : c.dims) {
      for (bool keep : {false, true}) {
        std::string what = row.name + " " + name_of(dt) + " " + c.label + " dims " + ::testing::PrintToString(dims) +
                           (keep ? " keepdim" : "");
        Tensor ref = row.f(xc, dims, keep);
        const double per = static_cast<double>(xc.numel()) / static_cast<double>(std::max<int64_t>(1, ref.numel()));
        const bool half = dt == st::kFloat16 || dt == st::kBFloat16;
        // The CPU adds float32 sums in float lanes (Note [Float lanes] in kernels/cpu/reduce.h):
        // about 5e-5 off float64 over 65537 values in [-1, 1], more than 1e-5 when they cancel.
        const bool float_lanes = row.name == "sum" && dt == st::kFloat32;
        expect_close(ref, row.f(xg, dims, keep), what, row.sums && half ? 1e-6 * per : float_lanes ? 1e-8 * per : 0);
      }
    }
  }
}

std::vector<ReduceRow> reduce_rows() {
  using V = const std::vector<int64_t>&;
  std::vector<ReduceRow> rows = {
      {"sum", [](const Tensor& x, V d, bool k) { return st::sum(x, d, k); }, kAll, -1, 1, true},
      {"mean", [](const Tensor& x, V d, bool k) { return st::mean(x, d, k); }, kFloat, -1, 1, true},
      {"prod", [](const Tensor& x, V d, bool k) { return st::prod(x, d, k); }, kAll, 0.95, 1.05, false},
      {"amax", [](const Tensor& x, V d, bool k) { return st::amax(x, d, k); }, kAll, -1, 1, false},
      {"amin", [](const Tensor& x, V d, bool k) { return st::amin(x, d, k); }, kAll, -1, 1, false},
      {"var", [](const Tensor& x, V d, bool k) { return st::var(x, d, 1, k); }, kFloat, -1, 1, true},
      {"var correction 0", [](const Tensor& x, V d, bool k) { return st::var(x, d, 0, k); }, kFloat, 2, 3, true},
      {"std", [](const Tensor& x, V d, bool k) { return st::std(x, d, 1, k); }, kFloat, -1, 1, true},
      {"logsumexp", [](const Tensor& x, V d, bool k) { return st::logsumexp(x, d, k); }, kFloat, -5, 5, true},
  };
  for (double p : {2.0, 1.0, 0.0, 3.0, 0.5, kInf, -kInf})
    rows.push_back({"norm p=" + std::to_string(p), [p](const Tensor& x, V d, bool k) { return st::norm(x, p, d, k); },
                    kFloat, -1, 1, true});
  return rows;
}

}  // namespace

TEST(CudaReduce, EveryOpAndDtype) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (const ReduceRow& row : reduce_rows())
    for (DType dt : row.dtypes) check_reduce(row, dt);
}

TEST(CudaReduce, ArgMaxMinAndMaxWithIndices) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kAll) {
    for (const Case& c : reduce_cases(dt, -1, 1)) {
      Tensor xc = c.view(c.x), xg = c.view(gpu(c.x));
      const std::string at = name_of(dt) + " " + c.label;
      expect_close(st::argmax(xc), st::argmax(xg), "argmax flat " + at);
      expect_close(st::argmin(xc), st::argmin(xg), "argmin flat " + at);
      for (int64_t d = 0; d < xc.dim(); ++d) {
        for (bool keep : {false, true}) {
          const std::string what = at + " dim " + std::to_string(d) + (keep ? " keepdim" : "");
          expect_close(st::argmax(xc, d, keep), st::argmax(xg, d, keep), "argmax " + what);
          expect_close(st::argmin(xc, d, keep), st::argmin(xg, d, keep), "argmin " + what);
          auto mc = st::max(xc, d, keep), mg = st::max(xg, d, keep);
          expect_close(mc.values, mg.values, "max values " + what);
          expect_close(mc.indices, mg.indices, "max indices " + what);
          auto nc = st::min(xc, d, keep), ng = st::min(xg, d, keep);
          expect_close(nc.values, ng.values, "min values " + what);
          expect_close(nc.indices, ng.indices, "min indices " + what);
        }
      }
    }
  }
}

namespace {

// Runs f on the CPU tensor and on its GPU copy (the view taken on each device) along every dim.
void check_along_dims(const std::string& name, const std::function<Tensor(const Tensor&, int64_t)>& f, DType dt,
                      double lo, double hi, double atol = 0) {
  auto check = [&](const std::string& label, const Tensor& x, const std::function<Tensor(const Tensor&)>& view) {
    Tensor xc = view(x), xg = view(gpu(x));
    for (int64_t d = 0; d < xc.dim(); ++d)
      expect_close(f(xc, d), f(xg, d), name + " " + name_of(dt) + " " + label + " dim " + std::to_string(d), atol);
  };
  auto same = [](const Tensor& t) { return t; };
  for (int64_t n : kRowSizes) {
    check("(3, " + std::to_string(n) + ")", random({3, n}, dt, lo, hi), same);
    check("(" + std::to_string(n) + ", 3)", random({n, 3}, dt, lo, hi), same);
  }
  check("(5, 6, 7)", random({5, 6, 7}, dt, lo, hi), same);
  check("(2, 3001, 40)", random({2, 3001, 40}, dt, lo, hi), same);
  check("(200, 300)", random({200, 300}, dt, lo, hi), same);
  check("transposed", random({33, 31}, dt, lo, hi), [](const Tensor& t) { return t.t(); });
  check("sliced", random({33, 31}, dt, lo, hi), [](const Tensor& t) { return t.slice(1, 1, 31, 3); });
}

}  // namespace

TEST(CudaReduce, SoftmaxAndLogSoftmax) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kFloat) {
    check_along_dims("softmax", [](const Tensor& x, int64_t d) { return st::softmax(x, d); }, dt, -5, 5);
    check_along_dims("log_softmax", [](const Tensor& x, int64_t d) { return st::log_softmax(x, d); }, dt, -5, 5);
  }
}

// The fused gradient kernels, through autograd, with g = x / 4 (exact on both devices), along
// every dim of the shapes above. Each device differentiates its own y, and in 16-bit types an
// ulp of y moves the gradient by more than an ulp of it: y (g - sum g y) cancels, and exp(y)
// of a log-probability near -11 carries y's ulp of 2^-7 as a 0.4% error; hence an absolute
// tolerance of a few of the dtype's ulps at 1 there.
TEST(CudaReduce, SoftmaxGradients) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (bool log : {false, true})
    for (DType dt : kFloat) {
      auto grad = [log](const Tensor& x, int64_t d) {
        Tensor leaf = x.detach().requires_grad_();
        Tensor y = log ? st::log_softmax(leaf, d) : st::softmax(leaf, d);
        return st::autograd::grad({y}, {leaf}, {x * 0.25})[0];
      };
      const double atol = dt == st::kFloat16 || dt == st::kBFloat16 ? 8 * rel_tol(dt) : 0;
      check_along_dims(log ? "log_softmax gradient" : "softmax gradient", grad, dt, -3, 3, atol);
    }
}

// scaled_dot_product_attention's causal mask (fused into the softmax) and its gradients,
// square and not, against the CPU.
TEST(CudaReduce, CausalAttention) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  namespace F = st::nn::functional;
  for (auto [L, S] : {std::pair<int64_t, int64_t>{5, 5}, {7, 3}, {3, 9}, {256, 256}})
    for (DType dt : kFloat) {
      const std::string at = " " + name_of(dt) + " L " + std::to_string(L) + " S " + std::to_string(S);
      Tensor q = random({2, 3, L, 16}, dt), k = random({2, 3, S, 16}, dt), v = random({2, 3, S, 8}, dt);
      Tensor go = random({2, 3, L, 8}, dt);
      std::vector<Tensor> cpu_in = {q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_()};
      std::vector<Tensor> gpu_in = {gpu(q).requires_grad_(), gpu(k).requires_grad_(), gpu(v).requires_grad_()};
      Tensor yc = F::scaled_dot_product_attention(cpu_in[0], cpu_in[1], cpu_in[2], Tensor(), 0, true);
      Tensor yg = F::scaled_dot_product_attention(gpu_in[0], gpu_in[1], gpu_in[2], Tensor(), 0, true);
      // 16-bit scores and weights round between the products, differently in each order
      const double atol = dt == st::kFloat16 || dt == st::kBFloat16 ? 8 * rel_tol(dt) : 0;
      expect_close(yc, yg, "causal attention" + at, atol);
      std::vector<Tensor> gc = st::autograd::grad({yc}, cpu_in, {go});
      std::vector<Tensor> gg = st::autograd::grad({yg}, gpu_in, {gpu(go)});
      for (size_t i = 0; i < 3; ++i)
        expect_close(gc[i], gg[i], "causal attention gradient " + std::to_string(i) + at, atol);
    }
}

TEST(CudaReduce, CumsumAndCumprod) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kAll) {
    // a float64 scan over 65537 elements rounds its partial sums (up to a few hundred) in a
    // different order on each device: about n * eps * |partial| apart, past rel_tol's 1e-12
    const double atol = dt == st::kFloat64 ? 1e-10 : 0;
    check_along_dims("cumsum", [](const Tensor& x, int64_t d) { return st::cumsum(x, d); }, dt, -1, 1, atol);
    check_along_dims("cumprod", [](const Tensor& x, int64_t d) { return st::cumprod(x, d); }, dt, 0.95, 1.05, atol);
  }
}

TEST(CudaReduce, NanAndInfinityRules) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  // row 0: two NaNs; row 1: +inf; row 2: all -inf; row 3: one -inf; row 4: finite
  auto value = [](int64_t i) {
    const int64_t r = i / 37, c = i % 37;
    if (r == 0 && (c == 5 || c == 20)) return kNaN;
    if (r == 1 && c == 3) return kInf;
    if (r == 2 || (r == 3 && c == 10)) return -kInf;
    return std::sin(static_cast<double>(i));
  };
  for (DType dt : kFloat) {
    Tensor x = from_fn({5, 37}, dt, value);
    for (const Tensor& xc : {x, x.t().contiguous()}) {
      Tensor xg = gpu(xc);
      const int64_t d = xc.shape()[0] == 5 ? 1 : 0;  // the 37-long dim
      const std::string at = " " + name_of(dt) + " dim " + std::to_string(d);
      for (const ReduceRow& row : reduce_rows())
        expect_close(row.f(xc, {d}, false), row.f(xg, {d}, false), row.name + at);
      expect_close(st::argmax(xc, d), st::argmax(xg, d), "argmax" + at);
      expect_close(st::argmin(xc, d), st::argmin(xg, d), "argmin" + at);
      expect_close(st::argmax(xc), st::argmax(xg), "argmax flat" + at);
      expect_close(st::softmax(xc, d), st::softmax(xg, d), "softmax" + at);
      expect_close(st::log_softmax(xc, d), st::log_softmax(xg, d), "log_softmax" + at);
      expect_close(st::cumsum(xc, d), st::cumsum(xg, d), "cumsum" + at);
      expect_close(st::cumprod(xc, d), st::cumprod(xg, d), "cumprod" + at);
    }
  }
}

TEST(CudaReduce, ZeroSizeDims) {
  SKIP_WITHOUT_GPU();
  for (DType dt : kAll) {
    const std::string at = " " + name_of(dt);
    Tensor e = st::zeros({3, 0}, dt), eg = gpu(e);
    expect_close(st::sum(e, {1}), st::sum(eg, {1}), "sum of nothing" + at);
    expect_close(st::prod(e, {1}, true), st::prod(eg, {1}, true), "prod of nothing" + at);
    expect_close(st::sum(e), st::sum(eg), "sum of an empty tensor" + at);
    expect_close(st::sum(e, {0}), st::sum(eg, {0}), "sum into an empty output" + at);
    expect_close(st::cumsum(e, 1), st::cumsum(eg, 1), "cumsum of an empty tensor" + at);
    EXPECT_THROW(st::amax(eg, {1}), st::Error) << at;
    EXPECT_THROW(st::argmax(eg, 1), st::Error) << at;
    if (!st::is_floating(dt)) continue;
    expect_close(st::mean(e, {1}), st::mean(eg, {1}), "mean of nothing" + at);
    expect_close(st::var(e, {1}), st::var(eg, {1}), "var of nothing" + at);
    expect_close(st::logsumexp(e, {1}), st::logsumexp(eg, {1}), "logsumexp of nothing" + at);
    expect_close(st::norm(e, 2.0, {1}), st::norm(eg, 2.0, {1}), "norm of nothing" + at);
    expect_close(st::softmax(e, 1), st::softmax(eg, 1), "softmax of an empty tensor" + at);
  }
}

TEST(CudaReduce, RepeatedRunsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  Tensor x = gpu(random({3, 1 << 22}, st::kFloat32));
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{}, std::vector<int64_t>{1}}) {
    Tensor a = host(st::sum(x, dims)), b = host(st::sum(x, dims));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes()));
    Tensor c = host(st::var(x, dims)), d = host(st::var(x, dims));
    EXPECT_EQ(0, std::memcmp(c.data(), d.data(), c.nbytes()));
  }
}

// 64-bit indexing: inputs of more than 2^31 elements, made on the device.
TEST(CudaReduce, PastTwoToThe31Elements) {
  SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t(1) << 31) + 7;
  {
    Tensor x = st::ones({n}, st::TensorOptions(st::kInt8, st::Device::cuda()));
    EXPECT_EQ(host(st::sum(x)).item<int64_t>(), n);
    EXPECT_EQ(host(st::amax(x)).item<int64_t>(), 1);
  }
  {
    const int64_t rows = (int64_t(1) << 20) + 3, cols = 2048;  // outer layout past 2^31
    Tensor y = st::ones({rows, cols}, st::TensorOptions(st::kInt8, st::Device::cuda()));
    Tensor s0 = st::sum(y, {0}), s1 = st::sum(y, {1});
    EXPECT_EQ(s0.shape(), st::Shape({cols}));
    EXPECT_EQ(host(st::amin(s0)).item<int64_t>(), rows);
    EXPECT_EQ(host(st::amax(s0)).item<int64_t>(), rows);
    EXPECT_EQ(s1.shape(), st::Shape({rows}));
    EXPECT_EQ(host(st::amin(s1)).item<int64_t>(), cols);
    EXPECT_EQ(host(st::amax(s1)).item<int64_t>(), cols);
  }
  {
    Tensor ones = st::ones({n}, st::TensorOptions(st::kInt64, st::Device::cuda()));
    Tensor c = st::cumsum(ones, 0);
    Tensor expect = st::arange(1, n + 1, 1, st::TensorOptions(st::kInt64, st::Device::cuda()));
    EXPECT_EQ(host(st::sum(c == expect)).item<int64_t>(), n);
  }
}
