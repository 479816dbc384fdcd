// CUDA elementwise kernels against the CPU kernels on fresh random inputs: every unary,
// binary, activation-gradient, comparison and where kernel registered for CUDA, each dtype it
// supports, odd sizes,
// transposed and step-sliced views, broadcast inputs, and one case past 2^31 elements; the
// activations composed of elementwise ops, with their gradients.
// Without a GPU every test is skipped with a message (CTest reports them as skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <strata/strata.hpp>

#include "cuda/cuda_testing.h"

namespace st = strata;
namespace cuda = strata::cuda;
using st::DType;
using st::Tensor;
using st::cuda_testing::gpu;
using st::cuda_testing::random;

namespace {

const std::vector<DType> kFloat = {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16};
const std::vector<DType> kInt = {st::kInt64, st::kInt32, st::kInt8, st::kUInt8};
const std::vector<int64_t> kSizes = {1, 7, 1023, 65537};

// Tolerance of a result in `dt`: exact for integers and bool, relative for floats.
double rel_tol(DType dt) {
  switch (dt) {
    case DType::Float32: return 2e-6;
    case DType::Float64: return 1e-12;
    case DType::Float16: return 2e-3;   // about two ulps
    case DType::BFloat16: return 1.6e-2;
    default: return 0;
  }
}

// cuda_testing::expect_close at the tolerance of the result's dtype.
void expect_close(const Tensor& cpu, const Tensor& gpu, const std::string& what) {
  st::cuda_testing::expect_close(cpu, gpu, what, rel_tol(cpu.dtype()));
}

// Runs `f` on the CPU tensor and on its GPU copy for contiguous, transposed and step-sliced
// layouts (the views are taken on the device, so the kernels see the strides).
using Unary = std::function<Tensor(const Tensor&)>;
void check_unary(const std::string& name, const Unary& f, DType dt, double lo, double hi) {
  for (int64_t n : kSizes) {
    Tensor x = random({n}, dt, lo, hi);
    expect_close(f(x), f(gpu(x)), name + " n=" + std::to_string(n) + " " + std::string(st::dtype_name(dt)));
  }
  Tensor m = random({33, 31}, dt, lo, hi);
  expect_close(f(m.t()), f(gpu(m).t()), name + " transposed");
  expect_close(f(m.slice(1, 1, 31, 3)), f(gpu(m).slice(1, 1, 31, 3)), name + " sliced step 3");
}

struct UnaryRow {
  const char* name;
  Unary f;
  bool float_only;
  double lo, hi;
};

}  // namespace

TEST(CudaElementwise, Unary) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const std::vector<UnaryRow> rows = {
      {"exp", [](const Tensor& x) { return st::exp(x); }, true, -3, 3},
      {"log", [](const Tensor& x) { return st::log(x); }, true, 0.05, 5},
      {"sqrt", [](const Tensor& x) { return st::sqrt(x); }, true, 0, 5},
      {"rsqrt", [](const Tensor& x) { return st::rsqrt(x); }, true, 0.05, 5},
      {"sin", [](const Tensor& x) { return st::sin(x); }, true, -3, 3},
      {"cos", [](const Tensor& x) { return st::cos(x); }, true, -3, 3},
      {"tanh", [](const Tensor& x) { return st::tanh(x); }, true, -3, 3},
      {"sigmoid", [](const Tensor& x) { return st::sigmoid(x); }, true, -3, 3},
      {"gelu", [](const Tensor& x) { return st::gelu(x, "none"); }, true, -3, 3},
      {"gelu_tanh", [](const Tensor& x) { return st::gelu(x, "tanh"); }, true, -3, 3},
      {"silu", [](const Tensor& x) { return st::silu(x); }, true, -3, 3},
      {"reciprocal", [](const Tensor& x) { return st::reciprocal(x); }, true, 0.1, 3},
      {"leaky_relu", [](const Tensor& x) { return st::leaky_relu(x, 0.1); }, true, -3, 3},
      {"erf", [](const Tensor& x) { return st::erf(x); }, true, -3, 3},
      {"log1p", [](const Tensor& x) { return st::log1p(x); }, true, -0.5, 3},
      {"expm1", [](const Tensor& x) { return st::expm1(x); }, true, -3, 3},
      {"floor", [](const Tensor& x) { return st::floor(x); }, false, -3, 3},
      {"ceil", [](const Tensor& x) { return st::ceil(x); }, false, -3, 3},
      {"round", [](const Tensor& x) { return st::round(x); }, false, -3, 3},
      {"trunc", [](const Tensor& x) { return st::trunc(x); }, false, -3, 3},
      {"tan", [](const Tensor& x) { return st::tan(x); }, true, -1.2, 1.2},
      {"asin", [](const Tensor& x) { return st::asin(x); }, true, -0.95, 0.95},
      {"acos", [](const Tensor& x) { return st::acos(x); }, true, -0.95, 0.95},
      {"atan", [](const Tensor& x) { return st::atan(x); }, true, -5, 5},
      {"sinh", [](const Tensor& x) { return st::sinh(x); }, true, -4, 4},
      {"cosh", [](const Tensor& x) { return st::cosh(x); }, true, -4, 4},
      {"asinh", [](const Tensor& x) { return st::asinh(x); }, true, -5, 5},
      {"acosh", [](const Tensor& x) { return st::acosh(x); }, true, 1.1, 10},
      {"atanh", [](const Tensor& x) { return st::atanh(x); }, true, -0.9, 0.9},
      {"log2", [](const Tensor& x) { return st::log2(x); }, true, 0.1, 10},
      {"log10", [](const Tensor& x) { return st::log10(x); }, true, 0.1, 10},
      {"exp2", [](const Tensor& x) { return st::exp2(x); }, true, -5, 5},
      {"neg", [](const Tensor& x) { return st::neg(x); }, false, -3, 3},
      {"abs", [](const Tensor& x) { return st::abs(x); }, false, -3, 3},
      {"sign", [](const Tensor& x) { return st::sign(x); }, false, -3, 3},
      {"relu", [](const Tensor& x) { return st::relu(x); }, false, -3, 3},
      {"square", [](const Tensor& x) { return st::square(x); }, false, -3, 3},
      {"pow_scalar", [](const Tensor& x) { return st::pow(x, 3); }, false, -3, 3},
      {"clamp", [](const Tensor& x) { return st::clamp(x, -1, 2); }, false, -3, 3},
  };
  for (const auto& r : rows) {
    for (DType dt : kFloat) check_unary(r.name, r.f, dt, r.lo, r.hi);
    if (!r.float_only)
      for (DType dt : kInt) check_unary(r.name, r.f, dt, r.lo, r.hi);
  }
  for (DType dt : {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16, st::kInt64, st::kInt32, st::kInt8,
                   st::kUInt8, st::kBool})
    check_unary("logical_not", [](const Tensor& x) { return st::logical_not(x); }, dt, -1, 1);
}

namespace {

using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

void check_binary(const std::string& name, const Binary& f, DType dt, double lo, double hi) {
  for (int64_t n : kSizes) {
    Tensor a = random({n}, dt, lo, hi), b = random({n}, dt, lo, hi);
    expect_close(f(a, b), f(gpu(a), gpu(b)), name + " n=" + std::to_string(n) + " " + std::string(st::dtype_name(dt)));
  }
  Tensor a = random({7, 1, 5}, dt, lo, hi), b = random({1, 3, 5}, dt, lo, hi);  // broadcast to (7, 3, 5)
  expect_close(f(a, b), f(gpu(a), gpu(b)), name + " broadcast");
  Tensor m = random({33, 31}, dt, lo, hi), k = random({31, 33}, dt, lo, hi);
  expect_close(f(m.t(), k), f(gpu(m).t(), gpu(k)), name + " transposed");
  expect_close(f(m.slice(0, 0, 33, 2), k.t().slice(0, 0, 33, 2)),
               f(gpu(m).slice(0, 0, 33, 2), gpu(k).t().slice(0, 0, 33, 2)), name + " sliced step 2");
}

}  // namespace

TEST(CudaElementwise, Binary) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  struct Row {
    const char* name;
    Binary f;
    bool float_only;
    double lo, hi;
  };
  const std::vector<Row> rows = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, false, -3, 3},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, false, -3, 3},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, false, -3, 3},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, true, 0.5, 3},
      {"maximum", [](const Tensor& a, const Tensor& b) { return st::maximum(a, b); }, false, -3, 3},
      {"minimum", [](const Tensor& a, const Tensor& b) { return st::minimum(a, b); }, false, -3, 3},
      {"pow", [](const Tensor& a, const Tensor& b) { return st::pow(a, b); }, true, 0.5, 2},
      // integer divisors of 0 raise: they are made 1
      {"remainder", [](const Tensor& a, const Tensor& b) { return st::remainder(a * 7, st::where(b == 0, 1, b)); },
       false, -2, 2},
      {"fmod", [](const Tensor& a, const Tensor& b) { return st::fmod(a * 7, st::where(b == 0, 1, b)); }, false, -2,
       2},
      {"atan2", [](const Tensor& a, const Tensor& b) { return st::atan2(a, b - 1.25); }, true, 0.5, 2},
  };
  for (const auto& r : rows) {
    for (DType dt : kFloat) check_binary(r.name, r.f, dt, r.lo, r.hi);
    if (!r.float_only)
      for (DType dt : kInt) check_binary(r.name, r.f, dt, r.lo, r.hi);
  }
  // bool + bool is or, bool * bool is and
  check_binary("add bool", [](const Tensor& a, const Tensor& b) { return a + b; }, st::kBool, 0, 1);
  check_binary("mul bool", [](const Tensor& a, const Tensor& b) { return a * b; }, st::kBool, 0, 1);
  check_binary("maximum bool", [](const Tensor& a, const Tensor& b) { return st::maximum(a, b); }, st::kBool, 0, 1);
  check_binary("minimum bool", [](const Tensor& a, const Tensor& b) { return st::minimum(a, b); }, st::kBool, 0, 1);
}

// The fused activation gradients (relu_backward ... gelu_tanh_backward), reached through
// autograd: the gradient of each activation at x, with x itself as the upstream gradient.
TEST(CudaElementwise, ActivationGradients) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  using Act = Tensor (*)(const Tensor&);
  const std::vector<std::pair<const char*, Act>> acts = {
      {"relu", [](const Tensor& x) { return st::relu(x); }},
      {"tanh", [](const Tensor& x) { return st::tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return st::sigmoid(x); }},
      {"silu", [](const Tensor& x) { return st::silu(x); }},
      {"gelu", [](const Tensor& x) { return st::gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return st::gelu(x, "tanh"); }},
  };
  for (const auto& [name, act] : acts)
    for (DType dt : kFloat) {
      Unary grad = [act = act](const Tensor& x) {
        Tensor leaf = x.detach().requires_grad_();
        return st::autograd::grad({act(leaf)}, {leaf}, {x})[0];
      };
      check_unary(std::string(name) + "_backward", grad, dt, -4, 4);
    }
}

TEST(CudaElementwise, CompareLogicalWhere) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const std::vector<std::pair<const char*, Binary>> cmp = {
      {"eq", [](const Tensor& a, const Tensor& b) { return a == b; }},
      {"ne", [](const Tensor& a, const Tensor& b) { return a != b; }},
      {"lt", [](const Tensor& a, const Tensor& b) { return a < b; }},
      {"le", [](const Tensor& a, const Tensor& b) { return a <= b; }},
      {"gt", [](const Tensor& a, const Tensor& b) { return a > b; }},
      {"ge", [](const Tensor& a, const Tensor& b) { return a >= b; }},
  };
  std::vector<DType> all = kFloat;
  all.insert(all.end(), kInt.begin(), kInt.end());
  all.push_back(st::kBool);
  // small integers so that equal values actually occur
  for (const auto& [name, f] : cmp)
    for (DType dt : all) check_binary(name, f, dt, -3, 3);
  check_binary("logical_and", [](const Tensor& a, const Tensor& b) { return st::logical_and(a, b); }, st::kBool, 0, 1);
  check_binary("logical_or", [](const Tensor& a, const Tensor& b) { return st::logical_or(a, b); }, st::kBool, 0, 1);
  for (DType dt : all) {
    Tensor c = random({7, 1, 5}, st::kBool), a = random({1, 3, 5}, dt, -3, 3), b = random({7, 3, 1}, dt, -3, 3);
    expect_close(st::where(c, a, b), st::where(gpu(c), gpu(a), gpu(b)), "where broadcast " +
                 std::string(st::dtype_name(dt)));
    Tensor m = random({33, 31}, dt, -3, 3), k = random({31, 33}, dt, -3, 3), cm = random({31, 33}, st::kBool);
    expect_close(st::where(cm, m.t(), k), st::where(gpu(cm), gpu(m).t(), gpu(k)), "where transposed");
  }
}

// Past 2^31 elements the launcher switches to 64-bit offsets; uint8 keeps this at ~6.4 GB.
TEST(CudaElementwise, MoreThan2To31Elements) {
  SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t(1) << 31) + 4099;
  const int64_t need = 3 * n + (int64_t(1) << 30);
  cuda::DeviceProperties p = cuda::get_device_properties(0);
  if (p.total_memory - cuda::memory_stats(0).reserved_bytes < need)
    GTEST_SKIP() << "needs about " << need / (1 << 20) << " MiB of free device memory";
  Tensor a = st::full({n}, 3, st::TensorOptions().dtype(st::kUInt8));
  Tensor b = st::full({n}, 4, st::TensorOptions().dtype(st::kUInt8));
  Tensor ga = gpu(a), gb = gpu(b);
  a = Tensor(), b = Tensor();
  Tensor sum = ga + gb;                                          // contiguous, flat path
  // n is odd: both views take the (n - 1) / 2 elements of one parity; a's last offset n - 3 passes 2^31
  Tensor strided = ga.slice(0, 0, n - 1, 2) + gb.slice(0, 1, n, 2);  // strided, 64-bit offsets
  Tensor hs = sum.slice(0, n - 8, n).to(st::Device::cpu());
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(hs.data_ptr<uint8_t>()[i], 7);
  Tensor hl = strided.slice(0, strided.numel() - 8, strided.numel()).to(st::Device::cpu());
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(hl.data_ptr<uint8_t>()[i], 7);
}

// Casts between every pair of dtypes on the device, strided copies (contiguous() of views),
// and fill through full/zeros/ones. Sources are whole numbers and halves in a range every
// dtype holds (non-negative when the destination is uint8: a negative float to uint8 is
// undefined in C++ and the host and device differ there).
// Layouts that take the strided kernel over 16-byte vectors: a head split and merge that keeps
// the last dim (and one whose last dim is not a whole number of vectors, which must not), a
// strided tensor times a scalar tensor and plus a per-row value (broadcast inputs read one
// element per vector), and an operand off 16-byte alignment. Exact against the CPU.
TEST(CudaElementwise, StridedVectorPaths) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16, st::kInt8, st::kBool}) {
    const std::string at = " " + std::string(st::dtype_name(dt));
    for (int64_t hd : {64, 6}) {
      Tensor x = random({2, 5, 3, hd}, dt, -2, 2);  // (B, T, H, hd) -> (B, H, T, hd) and back
      Tensor heads = x.transpose(1, 2), gheads = gpu(x).transpose(1, 2);
      st::cuda_testing::expect_close(heads.contiguous(), gheads.contiguous(), "head split hd " + std::to_string(hd) + at, 0);
      Tensor merged = heads.contiguous().transpose(1, 2), gmerged = gheads.contiguous().transpose(1, 2);
      st::cuda_testing::expect_close(merged.contiguous(), gmerged.contiguous(), "head merge" + at, 0);
    }
    if (dt == st::kBool) continue;
    Tensor x = random({4, 6, 32}, dt, -2, 2), row = random({4, 6, 1}, dt, -2, 2);
    Tensor xt = x.transpose(0, 1), gxt = gpu(x).transpose(0, 1);
    Tensor two = st::full({}, 2, st::TensorOptions().dtype(dt));
    st::cuda_testing::expect_close(xt * two, gxt * gpu(two), "strided times a scalar tensor" + at, 0);
    st::cuda_testing::expect_close(xt + row.transpose(0, 1), gxt + gpu(row).transpose(0, 1), "plus a per-row value" + at,
                                   0);
    // rows of 32 starting one element in: the input is not 16-byte aligned, so the scalar kernel runs
    Tensor off = random({4, 36}, dt, -2, 2);
    st::cuda_testing::expect_close(off.slice(1, 1, 33).contiguous(), gpu(off).slice(1, 1, 33).contiguous(),
                                   "unaligned" + at, 0);
  }
}

TEST(CudaElementwise, CopyCastFill) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  std::vector<DType> all = kFloat;
  all.insert(all.end(), kInt.begin(), kInt.end());
  all.push_back(st::kBool);
  for (DType from : all) {
    for (DType to : all) {
      const double lo = to == st::kUInt8 || from == st::kUInt8 ? 0 : -9;
      for (int64_t n : kSizes) {
        Tensor x = random({n}, from, lo, 9);
        expect_close(x.to(to), gpu(x).to(to), "cast n=" + std::to_string(n) + " " + std::string(st::dtype_name(from)) +
                                                   " -> " + std::string(st::dtype_name(to)));
      }
      Tensor m = random({33, 31}, from, lo, 9);
      expect_close(m.t().to(to).contiguous(), gpu(m).t().to(to).contiguous(), "cast transposed");
    }
    Tensor m = random({33, 31}, from, -3, 3);
    expect_close(m.t().contiguous(), gpu(m).t().contiguous(), "contiguous of transposed");
    expect_close(m.slice(1, 2, 31, 4).clone(), gpu(m).slice(1, 2, 31, 4).clone(), "clone of sliced");
    auto cuda_opts = st::TensorOptions().dtype(from).device(st::Device::cuda());
    auto cpu_opts = st::TensorOptions().dtype(from);
    for (int64_t n : kSizes) {
      expect_close(st::full({n}, 1, cpu_opts), st::full({n}, 1, cuda_opts), "full");
      expect_close(st::zeros({n}, cpu_opts), st::zeros({n}, cuda_opts), "zeros");
      expect_close(st::ones({n}, cpu_opts), st::ones({n}, cuda_opts), "ones");
    }
  }
}

// In-place ops under autograd through views (Note [Views under autograd]): the base's
// copy_slices history, a stale view's rebuilt one and an operand on the written memory run the
// same composed ops on either device. Gradients and a second derivative on `device`.
namespace {
std::vector<Tensor> writes_through_views(const Tensor& x0, const Tensor& y0, st::Device device) {
  Tensor x = x0.to(device).detach().requires_grad_(), y = y0.to(device).detach().requires_grad_();
  Tensor h = x * 1.0;  // (5, 6)
  Tensor first = h[0];
  h.narrow(1, 1, 3).mul_(y);  // y (5, 3)
  h[0].add_(h[1]);
  Tensor buf = st::zeros({5, 6}, st::TensorOptions(x.dtype(), device));
  for (int64_t i = 0; i < 5; ++i) buf[i].copy_(h[i] * h[(i + 1) % 5]);
  Tensor loss = (buf * buf).sum() + st::tanh(h).sum() + (first * first).sum();
  std::vector<Tensor> g = st::autograd::grad({loss}, {x, y}, {}, true, true);
  Tensor gg = st::autograd::grad({(g[0] * g[0]).sum()}, {y})[0];
  return {g[0].detach(), g[1].detach(), gg};
}
}  // namespace

TEST(CudaElementwise, InPlaceThroughViewsUnderAutograd) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : {st::kFloat64, st::kFloat32}) {
    Tensor x0 = random({5, 6}, dt), y0 = random({5, 3}, dt);
    std::vector<Tensor> cpu = writes_through_views(x0, y0, st::kCPU);
    std::vector<Tensor> dev = writes_through_views(x0, y0, st::Device::cuda());
    const double rel = dt == st::kFloat64 ? 1e-10 : 1e-4;
    const std::string name(st::dtype_name(dt));
    for (size_t i = 0; i < cpu.size(); ++i)
      st::cuda_testing::expect_close(cpu[i], dev[i], "gradient " + std::to_string(i) + " " + name, rel, rel);
  }
}

// The same seed gives the same Philox stream on both devices: uniform and randint exactly
// (the draw is integer arithmetic and one float multiply); normal to float rounding: both
// devices evaluate the same log, sine and cosine (kernels/common/vec_exp.h), but each compiler
// fuses multiplies and adds where it chooses.
TEST(CudaElementwise, PhiloxMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    for (DType dt : kFloat) {
      auto cpu_opts = st::TensorOptions().dtype(dt);
      auto cuda_opts = cpu_opts.device(st::Device::cuda());
      st::Generator g1(1234 + n), g2(1234 + n);
      Tensor a = st::rand({n}, cpu_opts, &g1), b = st::rand({n}, cuda_opts, &g2);
      Tensor ha = a.to(st::kFloat64), hb = b.to(st::Device::cpu()).to(st::kFloat64);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(ha.data_ptr<double>()[i], hb.data_ptr<double>()[i]) << "rand " << st::dtype_name(dt) << " at " << i;
      // the normal is computed in float for every dtype (kernels/common/philox.h)
      st::cuda_testing::expect_close(st::randn({n}, cpu_opts, &g1), st::randn({n}, cuda_opts, &g2), "randn",
                                     std::max(rel_tol(dt), rel_tol(st::kFloat32)));
    }
    for (DType dt : kInt) {
      auto cpu_opts = st::TensorOptions().dtype(dt);
      st::Generator g1(99), g2(99);
      expect_close(st::randint(0, 100, {n}, cpu_opts, &g1),
                   st::randint(0, 100, {n}, cpu_opts.device(st::Device::cuda()), &g2), "randint");
      const int64_t m = dt == st::kInt8 || dt == st::kUInt8 ? std::min<int64_t>(n, 100) : n;  // stays in range
      expect_close(st::arange(0, m, 1, cpu_opts), st::arange(0, m, 1, cpu_opts.device(st::Device::cuda())), "arange");
    }
    auto f32 = st::TensorOptions().dtype(st::kFloat32);
    expect_close(st::linspace(-1, 2, n, f32), st::linspace(-1, 2, n, f32.device(st::Device::cuda())), "linspace");
  }
}

TEST(CudaElementwise, IsClose) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  std::vector<DType> all = kFloat;
  all.insert(all.end(), kInt.begin(), kInt.end());
  all.push_back(st::kBool);
  for (DType dt : all)  // loose tolerances so that both outcomes occur
    check_binary("isclose", [](const Tensor& a, const Tensor& b) { return st::isclose(a, b, 0.2, 0.5); }, dt, -3, 3);
}

// The activations composed of elementwise ops (src/nn/activations.cpp), values and gradients,
// on the grid of their kinks and thresholds and on random inputs.
TEST(CudaElementwise, ComposedActivationsMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  namespace F = st::nn::functional;
  const std::vector<std::pair<const char*, Unary>> acts = {
      {"elu", [](const Tensor& x) { return F::elu(x, 0.7); }},
      {"selu", [](const Tensor& x) { return F::selu(x); }},
      {"celu", [](const Tensor& x) { return F::celu(x, 2.0); }},
      {"softplus", [](const Tensor& x) { return F::softplus(x, 2.0, 20.0); }},
      {"mish", [](const Tensor& x) { return F::mish(x); }},
      {"logsigmoid", [](const Tensor& x) { return F::logsigmoid(x); }},
      {"hardtanh", [](const Tensor& x) { return F::hardtanh(x, -2.0, 3.0); }},
      {"relu6", [](const Tensor& x) { return F::relu6(x); }},
      {"hardsigmoid", [](const Tensor& x) { return F::hardsigmoid(x); }},
      {"hardswish", [](const Tensor& x) { return F::hardswish(x); }},
      {"softsign", [](const Tensor& x) { return F::softsign(x); }},
      {"glu", [](const Tensor& x) { return F::glu(x, 0); }},
  };
  const std::vector<double> kinks = {-100, -20, -3, -2, -1e-3, 0, 1e-3, 3, 6, 10, 20, 100};
  for (DType dt : kFloat)
    for (const auto& [name, f] : acts) {
      const std::string what = std::string(name) + " " + std::string(st::dtype_name(dt));
      for (const Tensor& x : {st::from_vector(kinks).to(dt), random({2, 1031}, dt, -8, 8)}) {
        Tensor xc = x.clone().requires_grad_(), xg = gpu(x).requires_grad_();
        const Tensor yc = f(xc), yg = f(xg);
        expect_close(yc, yg, what);
        const Tensor gy = random(yc.shape(), dt);
        yc.backward(gy);
        yg.backward(gpu(gy));
        expect_close(xc.grad(), xg.grad(), what + " gradient");
      }
    }
}
