// CUDA convolution (cuDNN), pooling and batch norm against the CPU kernels on fresh random
// inputs: forward and gradients for ResNet-like and odd shapes (groups, depthwise, dilation,
// stride 2, 1x1, 7x7, asymmetric windows), NCHW, NHWC and view inputs, every floating dtype;
// benchmark mode (same results, a second call served from the algorithm cache) and
// deterministic mode; max pooling's indices; batch norm's running statistics; and the
// gradients of a small conv + batch norm + pooling stack; pad, interpolate and conv1d in every
// mode and floating dtype. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <strata/strata.hpp>

#include "cuda/cuda_testing.h"

namespace st = strata;
namespace F = strata::nn::functional;
using st::DType;
using st::MemoryFormat;
using st::Tensor;
using st::cuda_testing::gpu;
using st::cuda_testing::host;
using st::cuda_testing::random;
using st::nn::Size2;

namespace {

const std::vector<DType> kFloats = {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16};

std::string name(DType t) { return std::string(st::dtype_name(t)); }

// Tolerance relative to the reference's largest magnitude (at least 1). cuDNN and the CPU sum
// in different orders, and cuDNN's half-precision algorithms may transform in half precision.
double conv_tol(DType t) {
  switch (t) {
    case DType::Float64: return 1e-10;
    case DType::Float32: return 1e-4;
    case DType::Float16: return 1e-2;
    default: return 4e-2;
  }
}

// Pooling and batch norm compute as the CPU does, up to summation order and fused multiply-adds.
double elem_tol(DType t) {
  switch (t) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 2e-5;
    case DType::Float16: return 2e-3;
    default: return 1.6e-2;
  }
}

// Gradients that several windows add into: the CPU rounds to the storage type after every
// addition, the GPU once, so 16-bit results may differ by a few ulps.
double grad_tol(DType t) {
  switch (t) {
    case DType::Float16: return 6e-3;
    case DType::BFloat16: return 5e-2;
    default: return elem_tol(t);
  }
}

// cuda_testing::expect_close with an absolute tolerance of tol times the reference's largest
// finite magnitude (at least 1); tol == 0 asks for the same values, the sign of zero included.
void expect_close(const Tensor& ref, const Tensor& got, double tol, const std::string& what) {
  double scale = 1;
  if (ref.defined()) {
    const Tensor a = host(ref).to(st::kFloat64).contiguous();
    const double* pa = a.data_ptr<double>();
    for (int64_t i = 0; i < a.numel(); ++i)
      if (std::isfinite(pa[i])) scale = std::max(scale, std::fabs(pa[i]));
  }
  st::cuda_testing::expect_close(ref, got, what, 0, tol * scale);
}

Tensor in_layout(const Tensor& t, bool nhwc) { return nhwc ? t.to(MemoryFormat::ChannelsLast) : t; }

// A leaf that requires grad, sharing t's memory (and so its layout) rather than a copy's.
Tensor leaf(const Tensor& t) {
  Tensor l = t.detach();
  l.requires_grad_();
  return l;
}

// ---- convolution ------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, o;
  Size2 k, stride, pad, dil;
  int64_t groups;
  bool bias;
  F::Conv2dArgs args() const { return {stride, pad, dil, groups}; }
};

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {"stem 7x7 stride 2", 2, 3, 32, 30, 16, 7, 2, 3, 1, 1, true},
      {"3x3", 2, 16, 14, 14, 16, 3, 1, 1, 1, 1, false},
      {"1x1 stride 2", 2, 16, 14, 13, 32, 1, 2, 0, 1, 1, false},
      {"groups 3", 2, 12, 9, 11, 18, 3, 1, 1, 1, 3, true},
      {"depthwise", 3, 8, 10, 10, 8, 3, 1, 1, 1, 8, true},
      {"dilation 2", 1, 5, 13, 11, 7, 3, 1, 2, 2, 1, true},
      {"asymmetric", 3, 3, 7, 5, 5, {3, 2}, {2, 1}, {1, 0}, {1, 2}, 1, true},
  };
  return cases;
}

// Forward and all three gradients on the CPU and on the GPU (activations in NHWC when asked,
// the weight too when weight_nhwc), compared.
void check_conv(const ConvCase& k, DType dt, bool nhwc, bool weight_nhwc) {
  SCOPED_TRACE(std::string(k.name) + " " + name(dt) + (nhwc ? " NHWC" : " NCHW") +
               (weight_nhwc ? " weight NHWC" : ""));
  const Tensor x = random({k.n, k.c, k.h, k.w}, dt), w = random({k.o, k.c / k.groups, k.k.h, k.k.w}, dt);
  const Tensor b = k.bias ? random({k.o}, dt) : Tensor();
  Tensor xc = leaf(x), wc = leaf(w), bc = k.bias ? leaf(b) : Tensor();
  Tensor yc = F::conv2d(xc, wc, bc, k.args());
  const Tensor gy = random(yc.shape(), dt);
  yc.backward(gy);

  Tensor xg = leaf(in_layout(gpu(x), nhwc)), wg = leaf(in_layout(gpu(w), weight_nhwc));
  Tensor bg = k.bias ? leaf(gpu(b)) : Tensor();
  Tensor yg = F::conv2d(xg, wg, bg, k.args());
  if (nhwc && k.o > 1) EXPECT_TRUE(yg.is_contiguous(MemoryFormat::ChannelsLast)) << "result keeps the layout";
  yg.backward(in_layout(gpu(gy), nhwc));
  const double tol = conv_tol(dt);
  expect_close(yc, yg, tol, "output");
  expect_close(xc.grad(), xg.grad(), tol, "input gradient");
  expect_close(wc.grad(), wg.grad(), tol, "weight gradient");
  if (k.bias) expect_close(bc.grad(), bg.grad(), tol, "bias gradient");
}

}  // namespace

TEST(CudaConv, ForwardAndGradientsMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  for (const ConvCase& k : conv_cases())
    for (DType dt : kFloats)
      for (bool nhwc : {false, true}) {
        try {  // name the case that raised, and go on to the others
          check_conv(k, dt, nhwc, nhwc);
        } catch (const st::Error& e) {
          ADD_FAILURE() << k.name << " " << name(dt) << (nhwc ? " NHWC" : " NCHW") << ": " << e.what();
        }
      }
}

TEST(CudaConv, ResNetLayerShapesAndMixedLayouts) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  const ConvCase layer{"resnet 3x3 stride 2", 4, 64, 28, 28, 128, 3, 2, 1, 1, 1, false};
  const ConvCase bottleneck{"resnet 1x1", 4, 128, 14, 14, 64, 1, 1, 0, 1, 1, true};
  for (DType dt : {st::kFloat32, st::kBFloat16})
    for (bool nhwc : {false, true}) {
      check_conv(layer, dt, nhwc, nhwc);
      check_conv(bottleneck, dt, nhwc, nhwc);
    }
  // activations and weight in different layouts: the weight is brought to the activations'
  check_conv(conv_cases()[3], st::kFloat32, true, false);
  check_conv(conv_cases()[3], st::kFloat32, false, true);
}

TEST(CudaConv, ViewInputsEmptyBatchAndTransposedConvolution) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  // a step-sliced input view (neither NCHW- nor NHWC-dense)
  const Tensor big = random({2, 4, 9, 16}, st::kFloat32), w = random({6, 4, 3, 3}, st::kFloat32);
  const F::Conv2dArgs a{1, 1, 1, 1};
  expect_close(F::conv2d(big.slice(3, 0, 16, 2), w, Tensor(), a),
               F::conv2d(gpu(big).slice(3, 0, 16, 2), gpu(w), Tensor(), a), conv_tol(st::kFloat32), "sliced input");
  // an empty batch: an empty result and zero weight gradients
  Tensor e = leaf(gpu(st::zeros({0, 4, 6, 5}))), we = leaf(gpu(w));
  Tensor ye = F::conv2d(e, we, Tensor(), a);
  EXPECT_EQ(ye.shape(), (st::Shape{0, 6, 6, 5}));
  ye.backward(gpu(st::zeros(ye.shape())));
  expect_close(st::zeros(w.shape()), we.grad(), 0, "empty-batch weight gradient");
  // transposed convolutions, one with output_padding past the stride (allowed by the
  // dilation), whose forward and backward reach cuDNN with a cropped output
  for (const F::ConvTranspose2dArgs& t : {F::ConvTranspose2dArgs{2, 1, 1, 1, 1}, F::ConvTranspose2dArgs{1, 1, 1, 1, 2}})
    for (DType dt : {st::kFloat32, st::kFloat64}) {
      SCOPED_TRACE("conv_transpose2d output_padding " + std::to_string(t.output_padding.h) + " " + name(dt));
      const Tensor x = random({2, 4, 7, 6}, dt), wt = random({4, 3, 3, 3}, dt), b = random({3}, dt);
      Tensor xc = leaf(x), wc = leaf(wt), bc = leaf(b), xg = leaf(gpu(x)), wg = leaf(gpu(wt)), bg = leaf(gpu(b));
      Tensor yc = F::conv_transpose2d(xc, wc, bc, t), yg = F::conv_transpose2d(xg, wg, bg, t);
      const Tensor gy = random(yc.shape(), dt);
      yc.backward(gy);
      yg.backward(gpu(gy));
      expect_close(yc, yg, conv_tol(dt), "output");
      expect_close(xc.grad(), xg.grad(), conv_tol(dt), "input gradient");
      expect_close(wc.grad(), wg.grad(), conv_tol(dt), "weight gradient");
      expect_close(bc.grad(), bg.grad(), conv_tol(dt), "bias gradient");
    }
}

TEST(CudaConv, BenchmarkModeCachesItsChoiceAndAgrees) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  // a shape no other test uses, so the first call searches
  const Tensor x = gpu(random({3, 7, 19, 17}, st::kFloat32)), w = gpu(random({9, 7, 3, 3}, st::kFloat32));
  const F::Conv2dArgs a{1, 1, 1, 1};
  const Tensor heuristic = F::conv2d(x, w, Tensor(), a);
  st::cuda::set_benchmark_mode(true);
  EXPECT_TRUE(st::cuda::benchmark_mode());
  const auto before = st::cuda::conv_algorithm_cache_stats();
  const Tensor first = F::conv2d(x, w, Tensor(), a);
  const auto searched = st::cuda::conv_algorithm_cache_stats();
  const Tensor second = F::conv2d(x, w, Tensor(), a);
  const auto cached = st::cuda::conv_algorithm_cache_stats();
  st::cuda::set_benchmark_mode(false);
  EXPECT_EQ(searched.searches, before.searches + 1) << "the first call in benchmark mode runs a timed search";
  EXPECT_EQ(searched.entries, before.entries + 1);
  EXPECT_EQ(cached.searches, searched.searches) << "the second call searches nothing";
  EXPECT_EQ(cached.hits, searched.hits + 1) << "the second call is served from the cache";
  expect_close(heuristic, first, conv_tol(st::kFloat32), "benchmark mode against heuristics");
  expect_close(first, second, 0, "the cached choice gives the same result");
  // and gradients in benchmark mode match the CPU's
  st::cuda::set_benchmark_mode(true);
  check_conv(conv_cases()[1], st::kFloat32, true, true);
  check_conv(conv_cases()[3], st::kFloat16, false, false);
  st::cuda::set_benchmark_mode(false);
}

TEST(CudaConv, DeterministicModeRepeatsBitForBit) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_deterministic(true);
  EXPECT_TRUE(st::cuda::deterministic());
  const Tensor x = gpu(random({4, 16, 15, 15}, st::kFloat32)), w = gpu(random({16, 16, 3, 3}, st::kFloat32));
  const Tensor gy = gpu(random({4, 16, 15, 15}, st::kFloat32));
  Tensor grads[2][2];
  for (auto& g : grads) {
    Tensor xl = leaf(x), wl = leaf(w);
    F::conv2d(xl, wl, Tensor(), {1, 1, 1, 1}).backward(gy);
    g[0] = xl.grad(), g[1] = wl.grad();
  }
  st::cuda::set_deterministic(false);
  expect_close(grads[0][0], grads[1][0], 0, "input gradient, run twice");
  expect_close(grads[0][1], grads[1][1], 0, "weight gradient, run twice");
}

// ---- pooling -------------------------------------------------------------------------------------

namespace {

// The input in three layouts: NCHW, NHWC, and a step-sliced view.
std::vector<std::pair<std::string, Tensor>> pool_inputs(const Tensor& x) {
  Tensor wide = gpu(st::zeros({x.size(0), x.size(1), x.size(2), 2 * x.size(3)}, x.dtype()));
  Tensor view = wide.slice(3, 0, 2 * x.size(3), 2);
  view.copy_(gpu(x));
  return {{"NCHW", gpu(x)}, {"NHWC", gpu(x).to(MemoryFormat::ChannelsLast)}, {"sliced view", view}};
}

template <class Op>
void check_pool(const std::string& what, const Tensor& x, const Op& op, double tol) {
  Tensor xc = leaf(x);
  Tensor yc = op(xc);
  const Tensor gy = random(yc.shape(), x.dtype());
  yc.backward(gy);
  for (const auto& [layout, xg0] : pool_inputs(x)) {
    SCOPED_TRACE(what + " " + layout + " " + name(x.dtype()));
    Tensor xg = leaf(xg0);
    Tensor yg = op(xg);
    yg.backward(gpu(gy));
    expect_close(yc, yg, tol, "output");
    expect_close(xc.grad(), xg.grad(), std::max(tol, grad_tol(x.dtype())), "input gradient");
  }
}

}  // namespace

TEST(CudaPool, MaxPoolValuesIndicesAndGradients) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  struct Case { Size2 k; std::optional<Size2> stride; Size2 pad, dil; bool ceil; };
  const std::vector<Case> cases = {{3, 2, 1, 1, false}, {2, std::nullopt, 0, 1, false}, {3, 2, 1, 2, true},
                                   {{3, 2}, Size2{1, 2}, {1, 1}, 1, false}, {3, 3, 1, 1, true}};
  for (DType dt : kFloats)
    for (const Case& c : cases) {
      const F::MaxPool2dArgs a{c.stride, c.pad, c.dil, c.ceil};
      const Tensor x = random({2, 5, 11, 9}, dt);
      const std::string what = "max_pool2d k " + std::to_string(c.k.h) + "x" + std::to_string(c.k.w);
      check_pool(what, x, [&](const Tensor& t) { return F::max_pool2d(t, c.k, a); }, elem_tol(dt));
      const F::MaxPoolResult rc = F::max_pool2d_with_indices(x, c.k, a);
      for (const auto& [layout, xg] : pool_inputs(x)) {
        SCOPED_TRACE(what + " " + layout + " " + name(dt));
        const F::MaxPoolResult rg = F::max_pool2d_with_indices(xg, c.k, a);
        expect_close(rc.output, rg.output, 0, "max values");
        expect_close(rc.indices, rg.indices, 0, "indices");
      }
    }
  // NaN is the maximum, and its index is reported, as on the CPU
  Tensor x = random({1, 2, 6, 6}, st::kFloat32);
  x.data_ptr<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  const F::MaxPoolResult rc = F::max_pool2d_with_indices(x, 3, {2, 1});
  const F::MaxPoolResult rg = F::max_pool2d_with_indices(gpu(x), 3, {2, 1});
  expect_close(rc.output, rg.output, 0, "NaN values");
  expect_close(rc.indices, rg.indices, 0, "NaN indices");
}

TEST(CudaPool, AvgPoolEveryDivisorRule) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  struct Case { Size2 k; std::optional<Size2> stride; Size2 pad; bool ceil, count_pad; std::optional<int64_t> divisor; };
  const std::vector<Case> cases = {{3, 2, 1, false, true, std::nullopt},  {3, 2, 1, true, false, std::nullopt},
                                   {2, Size2{1}, 1, false, true, 3},     {{3, 2}, Size2{2, 1}, {1, 0}, true, true, std::nullopt},
                                   {4, std::nullopt, 2, true, false, std::nullopt}};
  for (DType dt : kFloats)
    for (const Case& c : cases) {
      const F::AvgPool2dArgs a{c.stride, c.pad, c.ceil, c.count_pad, c.divisor};
      check_pool("avg_pool2d k " + std::to_string(c.k.h) + "x" + std::to_string(c.k.w), random({2, 5, 11, 9}, dt),
                 [&](const Tensor& t) { return F::avg_pool2d(t, c.k, a); }, elem_tol(dt));
    }
}

TEST(CudaPool, AdaptiveAvgPool) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kFloats)
    for (Size2 out : {Size2{1, 1}, Size2{3, 5}, Size2{4, 4}, Size2{11, 9}, Size2{13, 10}})
      check_pool("adaptive_avg_pool2d " + std::to_string(out.h) + "x" + std::to_string(out.w),
                 random({2, 6, 11, 9}, dt), [&](const Tensor& t) { return F::adaptive_avg_pool2d(t, out); },
                 elem_tol(dt));
}

// ---- batch norm ----------------------------------------------------------------------------------

// One batch-norm call's output, running statistics and leaves (input, weight, bias and any
// residual), whose gradients are compared too.
struct BatchNormRun {
  Tensor y, running_mean, running_var;
  std::vector<Tensor> leaves;
};

void expect_same_batch_norm(const BatchNormRun& cpu, const BatchNormRun& cuda, DType dt) {
  const double tol = elem_tol(dt), stat_tol = elem_tol(dt == st::kFloat64 ? st::kFloat64 : st::kFloat32);
  expect_close(cpu.y, cuda.y, tol, "output");
  expect_close(cpu.running_mean, cuda.running_mean, stat_tol, "running mean");
  expect_close(cpu.running_var, cuda.running_var, stat_tol, "running var");
  const char* names[] = {"input gradient", "weight gradient", "bias gradient", "residual gradient"};
  for (size_t i = 0; i < cpu.leaves.size(); ++i)
    expect_close(cpu.leaves[i].grad(), cuda.leaves[i].grad(), 10 * tol, names[i]);
}

TEST(CudaBatchNorm, TrainAndEvalWithRunningStatistics) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  struct Input { const char* name; st::Shape shape; bool nhwc; };
  const std::vector<Input> inputs = {{"NCHW", {4, 6, 5, 7}, false}, {"NHWC", {4, 6, 5, 7}, true},
                                     {"(N, C)", {9, 5}, false},     {"(N, C) vectors", {9, 16}, false},
                                     {"(N, C, L)", {3, 4, 10}, false},  {"wide NHWC", {2, 70, 3, 3}, true},
                                     // channel sums split over several blocks (NCHW: past 4096 values
                                     // a channel); NHWC in two channel tiles, C not a multiple of 32
                                     {"NCHW split sums", {8, 3, 32, 33}, false},
                                     {"NHWC split sums", {4, 40, 12, 12}, true}};
  for (DType dt : kFloats)
    for (const Input& in : inputs)
      for (bool training : {true, false}) {
        SCOPED_TRACE(std::string(in.name) + " " + name(dt) + (training ? " training" : " eval"));
        const DType s = dt == st::kFloat64 ? st::kFloat64 : st::kFloat32;
        const int64_t c = in.shape[1];
        const Tensor x = random(in.shape, dt, -2, 3), w = random({c}, s, 0.5, 1.5), b = random({c}, s);
        const Tensor rm = random({c}, s), rv = random({c}, s, 0.5, 2);
        const F::BatchNormArgs a{training, 0.1, 1e-5};
        Tensor xc = leaf(x), wc = leaf(w), bc = leaf(b), rmc = rm.clone(), rvc = rv.clone();
        Tensor yc = F::batch_norm(xc, rmc, rvc, wc, bc, a);
        const Tensor gy = random(yc.shape(), dt);
        yc.backward(gy);
        const Tensor xg0 = in.nhwc ? gpu(x).to(MemoryFormat::ChannelsLast) : gpu(x);
        Tensor xg = leaf(xg0), wg = leaf(gpu(w)), bg = leaf(gpu(b)), rmg = gpu(rm), rvg = gpu(rv);
        Tensor yg = F::batch_norm(xg, rmg, rvg, wg, bg, a);
        yg.backward(in.nhwc ? gpu(gy).to(MemoryFormat::ChannelsLast) : gpu(gy));
        expect_same_batch_norm({yc, rmc, rvc, {xc, wc, bc}}, {yg, rmg, rvg, {xg, wg, bg}}, dt);
      }
}

// relu(batch_norm(x) + residual) in one kernel against the CPU's. The shapes take both of the
// affine pass's paths: 16-byte vectors (NCHW with H * W a multiple of 8, channels-last with C a
// multiple of 8) and one element at a time (odd sizes, and the input, the residual or the
// incoming gradient one element past alignment, each alone and all together). A residual that needs no gradient lets the backward apply the ReLU's mask as it
// reads (Note [ReLU mask in the backward]); one that needs one has the masked gradient written.
TEST(CudaBatchNorm, ReluAndResidualMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  enum Misaligned { kNone = 0, kX = 1, kResidual = 2, kGrad = 4, kAll = 7 };
  struct Input { const char* name; st::Shape shape; bool nhwc; int misaligned; };
  const std::vector<Input> inputs = {{"NCHW vectors", {3, 5, 4, 6}, false, kNone},
                                     {"NHWC vectors", {3, 16, 3, 5}, true, kNone},
                                     {"NCHW odd", {2, 3, 5, 7}, false, kNone},
                                     {"NHWC odd", {2, 6, 3, 3}, true, kNone},
                                     {"NCHW misaligned", {2, 4, 4, 4}, false, kAll},
                                     {"NCHW misaligned input", {2, 4, 4, 4}, false, kX},
                                     {"NCHW misaligned residual", {2, 4, 4, 4}, false, kResidual},
                                     {"NCHW misaligned gradient", {2, 4, 4, 4}, false, kGrad},
                                     {"NHWC misaligned", {2, 16, 3, 3}, true, kAll},
                                     {"NCHW split sums", {8, 3, 32, 33}, false, kNone},
                                     {"NHWC split sums", {4, 40, 12, 12}, true, kNone}};
  struct Residual { const char* name; bool present, needs_grad; };
  const Residual residuals[] = {{"", false, false}, {" residual", true, true}, {" constant residual", true, false}};
  for (DType dt : kFloats)
    for (const Input& in : inputs)
      for (const Residual& res : residuals)
        for (bool training : {true, false}) {
          SCOPED_TRACE(std::string(in.name) + " " + name(dt) + res.name + (training ? " training" : " eval"));
          const bool with_residual = res.present, residual_grad = res.needs_grad;
          const DType s = dt == st::kFloat64 ? st::kFloat64 : st::kFloat32;
          const int64_t c = in.shape[1];
          const Tensor x = random(in.shape, dt, -2, 3), w = random({c}, s, 0.5, 1.5), b = random({c}, s);
          const Tensor r = with_residual ? random(in.shape, dt) : Tensor();
          const Tensor rm = random({c}, s), rv = random({c}, s, 0.5, 2);
          const F::BatchNormArgs a{training, 0.1, 1e-5};
          auto residual_of = [&](const Tensor& t) { return !with_residual ? Tensor() : residual_grad ? leaf(t) : t; };
          Tensor xc = leaf(x), wc = leaf(w), bc = leaf(b), rc = residual_of(r);
          Tensor rmc = rm.clone(), rvc = rv.clone();
          Tensor yc = F::batch_norm_relu(xc, rmc, rvc, wc, bc, a, rc);
          const Tensor gy = random(yc.shape(), dt);
          yc.backward(gy);
          // on the GPU in the case's layout, or, for the operands the case names, one element into
          // a larger buffer in that layout (misaligned)
          auto on_gpu = [&](const Tensor& t, int which) {
            if (!(in.misaligned & which)) return in_layout(gpu(t), in.nhwc);
            Tensor big = st::empty({t.numel() + 1}, st::TensorOptions(dt, st::Device::cuda()));
            const st::Shape& n = in.shape;
            Tensor view = big.narrow(0, 1, t.numel());
            view = in.nhwc ? view.view({n[0], n[2], n[3], n[1]}).permute({0, 3, 1, 2}) : view.view(n);
            view.copy_(gpu(t));
            return view;
          };
          Tensor xg = leaf(on_gpu(x, kX)), wg = leaf(gpu(w)), bg = leaf(gpu(b));
          Tensor rg = with_residual ? residual_of(on_gpu(r, kResidual)) : Tensor(), rmg = gpu(rm), rvg = gpu(rv);
          Tensor yg = F::batch_norm_relu(xg, rmg, rvg, wg, bg, a, rg);
          yg.backward(on_gpu(gy, kGrad));
          std::vector<Tensor> cpu_leaves{xc, wc, bc}, gpu_leaves{xg, wg, bg};
          if (residual_grad) cpu_leaves.push_back(rc), gpu_leaves.push_back(rg);
          expect_same_batch_norm({yc, rmc, rvc, cpu_leaves}, {yg, rmg, rvg, gpu_leaves}, dt);
        }
}

// ---- a small network ------------------------------------------------------------------------------

TEST(CudaConvNet, ConvBatchNormPoolStackGradientsMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  for (DType dt : {st::kFloat32, st::kFloat64})
    for (bool nhwc : {false, true}) {
      SCOPED_TRACE(name(dt) + (nhwc ? " NHWC" : " NCHW"));
      const std::vector<Tensor> init = {random({4, 3, 16, 16}, dt), random({8, 3, 3, 3}, dt), random({8}, dt),
                                        random({8}, dt, 0.5, 1.5),   random({8}, dt),          random({6, 8, 3, 3}, dt)};
      const Tensor rm = st::zeros({8}, dt), rv = st::ones({8}, dt);
      // x, conv1 weight and bias, bn weight and bias, conv2 weight. In float32 the CPU and GPU
      // results differ by rounding, which could move a relu kink or a max-pool argmax and make
      // one gradient element differ entirely: float32 takes smooth silu and average pooling.
      const bool exact = dt == st::kFloat64;
      auto net = [exact](const std::vector<Tensor>& p, Tensor& running_mean, Tensor& running_var) {
        Tensor h = F::conv2d(p[0], p[1], p[2], {1, 1, 1, 1});
        h = F::batch_norm(h, running_mean, running_var, p[3], p[4], {true, 0.1, 1e-5});
        h = exact ? F::max_pool2d(h.relu(), 2) : F::avg_pool2d(st::silu(h), 2);
        h = F::conv2d(h, p[5], Tensor(), {2, 1, 1, 1});
        h = F::avg_pool2d(h, 3, {1, 1});
        return F::adaptive_avg_pool2d(h, {2, 2});
      };
      std::vector<Tensor> pc, pg;
      for (const Tensor& t : init) pc.push_back(leaf(t));
      for (size_t i = 0; i < init.size(); ++i) pg.push_back(leaf(i == 0 ? in_layout(gpu(init[i]), nhwc) : gpu(init[i])));
      Tensor rmc = rm.clone(), rvc = rv.clone(), rmg = gpu(rm), rvg = gpu(rv);
      Tensor yc = net(pc, rmc, rvc), yg = net(pg, rmg, rvg);
      const Tensor gy = random(yc.shape(), dt);
      yc.backward(gy);
      yg.backward(gpu(gy));
      const double tol = conv_tol(dt);
      expect_close(yc, yg, tol, "output");
      expect_close(rmc, rmg, tol, "running mean");
      expect_close(rvc, rvg, tol, "running var");
      const char* names[] = {"input", "conv1 weight", "conv1 bias", "bn weight", "bn bias", "conv2 weight"};
      for (size_t i = 0; i < init.size(); ++i) expect_close(pc[i].grad(), pg[i].grad(), tol, std::string(names[i]) + " gradient");
    }
}

// ---- padding, resampling and 1-d convolution (composed of index_select, arithmetic and conv2d) ----

TEST(CudaResample, PadInterpolateAndConv1dMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  using F::InterpolateMode;
  using F::PadMode;
  std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops;
  for (PadMode m : {PadMode::Constant, PadMode::Reflect, PadMode::Replicate, PadMode::Circular})
    ops.push_back({"pad mode " + std::to_string(static_cast<int>(m)),
                   [m](const Tensor& x) { return F::pad(x, {2, 1, -1, 3}, m); }});
  for (InterpolateMode m : {InterpolateMode::Nearest, InterpolateMode::NearestExact, InterpolateMode::Bilinear,
                            InterpolateMode::Bicubic}) {
    F::InterpolateArgs a{.size = {13, 6}, .mode = m};
    if (m == InterpolateMode::Bilinear) a.align_corners = true;
    ops.push_back({"interpolate mode " + std::to_string(static_cast<int>(m)),
                   [a](const Tensor& x) { return F::interpolate(x, a); }});
  }
  for (DType dt : kFloats) {
    const Tensor w = random({6, 2, 3}, dt);
    ops.push_back({"conv1d " + name(dt), [w](const Tensor& x) {
                     const Tensor seq = x.flatten(2);  // (N, C, H * W)
                     return F::conv1d(seq, w.to(x.device()), Tensor(), {2, 1, 1, 2});
                   }});
    for (bool nhwc : {false, true})
      for (const auto& [what, op] : ops) {
        SCOPED_TRACE(what + " " + name(dt) + (nhwc ? " NHWC" : " NCHW"));
        const Tensor x = random({2, 4, 7, 9}, dt);
        Tensor xc = leaf(in_layout(x, nhwc)), xg = leaf(in_layout(gpu(x), nhwc));
        const Tensor yc = op(xc), yg = op(xg);
        ASSERT_TRUE(yg.device().is_cuda());
        EXPECT_EQ(yc.is_contiguous(MemoryFormat::ChannelsLast), yg.is_contiguous(MemoryFormat::ChannelsLast));
        const Tensor gy = random(yc.shape(), dt);
        yc.backward(gy);
        yg.backward(gpu(gy));
        const double tol = what.rfind("conv1d", 0) == 0 ? conv_tol(dt) : grad_tol(dt);
        expect_close(yc, yg, tol, "output");
        expect_close(xc.grad(), xg.grad(), tol, "input gradient");
      }
    ops.pop_back();
  }
}

TEST(CudaChannelLayers, PoolingInstanceNormDropoutAndPixelShuffleMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"max_pool1d", [](const Tensor& x) { return F::max_pool1d(x.flatten(2), 3, {2, 1}); }},
      {"avg_pool1d", [](const Tensor& x) { return F::avg_pool1d(x.flatten(2), 4, {3, 2, false, false}); }},
      {"adaptive_avg_pool1d", [](const Tensor& x) { return F::adaptive_avg_pool1d(x.flatten(2), 5); }},
      {"instance_norm", [](const Tensor& x) { return F::instance_norm(x); }},
      {"dropout2d", [](const Tensor& x) {
         st::Generator g(11);  // the same Philox stream on both devices
         return F::dropout2d(x, 0.3, true, &g);
       }},
      {"pixel_shuffle", [](const Tensor& x) { return F::pixel_shuffle(x, 2); }},
      {"adaptive_max_pool2d", [](const Tensor& x) { return F::adaptive_max_pool2d(x, {3, 4}); }},
      {"adaptive_max_pool2d divisible", [](const Tensor& x) { return F::adaptive_max_pool2d(x, {7, 3}); }},
  };
  for (DType dt : {st::kFloat32, st::kFloat64})
    for (const auto& [what, op] : ops) {
      SCOPED_TRACE(what + " " + name(dt));
      const Tensor x = random({2, 8, 7, 9}, dt);
      Tensor xc = leaf(x), xg = leaf(gpu(x));
      const Tensor yc = op(xc), yg = op(xg);
      const Tensor gy = random(yc.shape(), dt);
      yc.backward(gy);
      yg.backward(gpu(gy));
      expect_close(yc, yg, elem_tol(dt), "output");
      expect_close(xc.grad(), xg.grad(), elem_tol(dt), "input gradient");
    }
}

TEST(CudaChannelLayers, EmbeddingBagMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const Tensor idx = st::randint(0, 50, {400}, st::kInt64), off = st::from_vector<int64_t>({0, 3, 3, 90, 250, 399});
  const Tensor psw = random({400}, st::kFloat32);
  for (auto mode : {st::nn::EmbeddingBagMode::Sum, st::nn::EmbeddingBagMode::Mean, st::nn::EmbeddingBagMode::Max}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const Tensor w = random({50, 16}, st::kFloat32);
    Tensor wc = leaf(w), wg = leaf(gpu(w));
    const bool sum = mode == st::nn::EmbeddingBagMode::Sum;
    const Tensor yc = F::embedding_bag(idx, wc, {off, mode, sum ? psw : Tensor(), false, 7});
    const Tensor yg = F::embedding_bag(gpu(idx), wg, {gpu(off), mode, sum ? gpu(psw) : Tensor(), false, 7});
    const Tensor gy = random(yc.shape(), st::kFloat32);
    yc.backward(gy);
    yg.backward(gpu(gy));
    expect_close(yc, yg, elem_tol(st::kFloat32), "output");
    expect_close(wc.grad(), wg.grad(), grad_tol(st::kFloat32), "weight gradient");
  }
}
