// The native 3-d convolutions on the CPU (oneDNN; skipped in a build without it) against the
// direct float64 loops of volume_testing.h and against the composed path (set_native_conv3d off)
// on the same inputs: odd sizes, stride / padding / dilation / groups per dim, output_padding
// at or past the stride, non-contiguous inputs, bfloat16 and float16, and gradients of input,
// weight and bias by central differences in float32 (exact up to rounding, as the loss is linear
// in each operand) and against the composed path's float64 gradients.
#include <cmath>
#include <functional>
#include <vector>

#include "nn/volume_testing.h"

using namespace strata;
using namespace strata::testing;  // the loops and cases of volume_testing.h
namespace F = strata::nn::functional;
using nn::Size3;
using Fn3 = std::function<Tensor(const std::vector<Tensor>&)>;

namespace {

bool native_on_cpu() { return ext::has_kernel(OpId::conv3d, DeviceType::CPU, kFloat32); }

#define SKIP_WITHOUT_NATIVE() \
  if (!native_on_cpu()) GTEST_SKIP() << "strata was built without oneDNN: conv3d runs composed of conv2d"

// f with the native path off, restored however the scope is left.
Tensor composed(const std::function<Tensor()>& f) {
  struct Restore {
    ~Restore() { F::set_native_conv3d(DeviceType::CPU, true); }
  } restore;
  F::set_native_conv3d(DeviceType::CPU, false);
  return f();
}

// The gradients of sum(f(inputs) * cot) with respect to every input.
std::vector<Tensor> grads_of(const Fn3& f, const std::vector<Tensor>& inputs, const Tensor& cot) {
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.detach().requires_grad_());
  return autograd::grad({f(leaves)}, leaves, {cot.to(inputs[0].dtype())});
}

// Central differences of sum(f(x) * cot) in float32 through every element of every input: the
// loss is linear in each operand, so the difference quotient is exact but for rounding.
::testing::AssertionResult central_differences_match(const Fn3& f, const std::vector<Tensor>& inputs) {
  Generator g(5);
  const Tensor y = f(inputs);
  const Tensor cot = randn(y.shape(), kFloat32, &g);
  const std::vector<double> cv = values(cot);
  const std::vector<Tensor> analytic = grads_of(f, inputs, cot);
  for (size_t k = 0; k < inputs.size(); ++k) {
    std::vector<double> numeric;
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      auto loss = [&](double step) {
        std::vector<Tensor> moved = inputs;
        moved[k] = inputs[k].clone();
        float* p = static_cast<float*>(moved[k].data());
        p[i] += static_cast<float>(step);
        return weighted_sum(f(moved), cv);
      };
      numeric.push_back((loss(0.5) - loss(-0.5)) / 1.0);
    }
    auto r = all_close(analytic[k], numeric, 1e-4, 1e-4);
    if (!r) return r << " (input " << k << ")";
  }
  return ::testing::AssertionSuccess();
}

struct Operands {
  Tensor x, w, b;
};

Operands draw(const ConvCase& c, bool transposed, Generator& g) {
  const Shape ws = transposed ? Shape{c.x.c, c.out_channels / c.groups, c.kernel.d, c.kernel.h, c.kernel.w}
                              : Shape{c.out_channels, c.x.c / c.groups, c.kernel.d, c.kernel.h, c.kernel.w};
  return {randn({c.x.n, c.x.c, c.x.d, c.x.h, c.x.w}, kFloat64, &g), randn(ws, kFloat64, &g),
          c.bias ? randn({c.out_channels}, kFloat64, &g) : Tensor()};
}

Tensor f32(const Tensor& t) { return t.defined() ? t.to(kFloat32) : t; }

}  // namespace

TEST(Conv3dNative, MatchesLoopAndComposedPath) {
  SKIP_WITHOUT_NATIVE();
  EXPECT_TRUE(F::native_conv3d_enabled(DeviceType::CPU));
  EXPECT_FALSE(F::native_conv3d_enabled(DeviceType::CUDA));
  Generator g(81);
  for (const ConvCase& c : kCases) {
    SCOPED_TRACE(fmt::format("x ({}, {}, {}, {}, {}) kernel {} stride {} padding {} dilation {} groups {}", c.x.n,
                             c.x.c, c.x.d, c.x.h, c.x.w, c.kernel, c.stride, c.padding, c.dilation, c.groups));
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(transposed ? "conv_transpose3d" : "conv3d");
      const Operands o = draw(c, transposed, g);
      const F::Conv3dArgs a{c.stride, c.padding, c.dilation, c.groups};
      const F::ConvTranspose3dArgs ta{c.stride, c.padding, c.output_padding, c.groups, c.dilation};
      auto run = [&](const Tensor& x, const Tensor& w, const Tensor& b) {
        return transposed ? F::conv_transpose3d(x, w, b, ta) : F::conv3d(x, w, b, a);
      };
      Shape shape;
      const std::vector<double> want =
          transposed ? conv_transpose3d_loop(o.x, o.w, o.b, ta, shape) : conv3d_loop(o.x, o.w, o.b, a, shape);
      const Tensor x = f32(o.x).requires_grad_(), w = f32(o.w), b = f32(o.b);
      const Tensor y = run(x, w, b);
      EXPECT_EQ(y.grad_fn()->name(), transposed ? "conv_transpose3d" : "conv3d");  // the native op ran
      EXPECT_EQ(y.shape(), shape);
      EXPECT_TRUE(y.is_contiguous());
      EXPECT_TRUE(all_close(y, want, 1e-5, 1e-5));
      const Tensor old = composed([&] { return run(x, w, b); });
      EXPECT_NE(old.grad_fn()->name(), y.grad_fn()->name());
      EXPECT_TRUE(all_close(y, values(old), 1e-5, 1e-5));
      // the half types through the float32 kernels
      for (DType dt : {kBFloat16, kFloat16}) {
        auto cast = [dt](const Tensor& t) { return t.defined() ? t.to(dt) : t; };
        const Tensor h = run(cast(o.x), cast(o.w), cast(o.b));
        EXPECT_EQ(h.dtype(), dt);
        EXPECT_TRUE(all_close(h, want, dt == kBFloat16 ? 0.05 : 0.01, 0.1)) << dtype_name(dt);
      }
      // unbatched
      EXPECT_TRUE(all_close(run(x.detach()[0], w, b), values(y.detach()[0]), 0, 0));
    }
  }
}

TEST(Conv3dNative, NonContiguousOperands) {
  SKIP_WITHOUT_NATIVE();
  Generator g(82);
  // a depth slice of a wider volume, channels taken every other one, and a transposed weight
  const Tensor wide = randn({2, 6, 9, 7, 8}, kFloat32, &g);
  const Tensor x = wide.narrow(2, 1, 6).slice(1, 0, 6, 2);  // (2, 3, 6, 7, 8)
  const Tensor w = randn({3, 4, 3, 2, 3}, kFloat32, &g).transpose(0, 1);  // (4, 3, 3, 2, 3)
  const Tensor b = randn({8}, kFloat32, &g).slice(0, 0, 8, 2);
  ASSERT_FALSE(x.is_contiguous() || w.is_contiguous() || b.is_contiguous());
  const F::Conv3dArgs a{{2, 1, 2}, {1, 0, 1}, {1, 2, 1}, 1};
  Shape shape;
  const std::vector<double> want = conv3d_loop(x.to(kFloat64), w.to(kFloat64), b.to(kFloat64), a, shape);
  EXPECT_TRUE(all_close(F::conv3d(x, w, b, a), want, 1e-5, 1e-5));
  const Tensor t = randn({2, 4, 3, 5, 4}, kFloat32, &g).transpose(3, 4);  // (2, 4, 3, 4, 5)
  const F::ConvTranspose3dArgs ta{{2, 1, 2}, {0, 1, 1}, {1, 0, 1}, 1, 1};
  const Tensor tb = randn({6}, kFloat32, &g).slice(0, 0, 6, 2);  // a strided bias of 3
  ASSERT_FALSE(t.is_contiguous() || tb.is_contiguous());
  EXPECT_TRUE(all_close(F::conv_transpose3d(t, w, tb, ta),
                        conv_transpose3d_loop(t.to(kFloat64), w.to(kFloat64), tb.to(kFloat64), ta, shape), 1e-5, 1e-5));
}

TEST(Conv3dNative, CentralDifferenceGradients) {
  SKIP_WITHOUT_NATIVE();
  Generator g(83);
  const F::Conv3dArgs a{{2, 1, 1}, {1, 1, 0}, {1, 1, 2}, 2};
  const std::vector<Tensor> in = {randn({2, 4, 4, 5, 3}, kFloat32, &g), randn({4, 2, 2, 3, 2}, kFloat32, &g),
                                  randn({4}, kFloat32, &g)};
  const Fn3 conv = [&](const std::vector<Tensor>& t) { return F::conv3d(t[0], t[1], t[2], a); };
  EXPECT_TRUE(central_differences_match(conv, in));
  // output_padding past the stride (below the dilation): the kernels see an output smaller than full
  const F::ConvTranspose3dArgs ta{{2, 1, 1}, {1, 0, 1}, {1, 1, 0}, 2, {1, 2, 1}};
  const std::vector<Tensor> tin = {randn({2, 4, 3, 3, 2}, kFloat32, &g), randn({4, 1, 3, 2, 2}, kFloat32, &g),
                                   randn({2}, kFloat32, &g)};
  const Fn3 up = [&](const std::vector<Tensor>& t) { return F::conv_transpose3d(t[0], t[1], t[2], ta); };
  EXPECT_TRUE(central_differences_match(up, tin));
}

TEST(Conv3dNative, GradientsMatchComposedFloat64) {
  SKIP_WITHOUT_NATIVE();
  Generator g(84);
  for (const ConvCase& c : kCases) {
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(fmt::format("{} groups {} stride {}", transposed ? "transposed" : "conv", c.groups, c.stride));
      const Operands o = draw(c, transposed, g);
      const F::Conv3dArgs a{c.stride, c.padding, c.dilation, c.groups};
      const F::ConvTranspose3dArgs ta{c.stride, c.padding, c.output_padding, c.groups, c.dilation};
      const Fn3 f = [&](const std::vector<Tensor>& t) {
        return transposed ? F::conv_transpose3d(t[0], t[1], t[2], ta) : F::conv3d(t[0], t[1], t[2], a);
      };
      std::vector<Tensor> in64 = {o.x, o.w, o.b.defined() ? o.b : zeros({c.out_channels}, kFloat64)};
      std::vector<Tensor> in32;
      for (const Tensor& t : in64) in32.push_back(f32(t));
      const Tensor cot = randn(f(in64).shape(), kFloat64, &g);
      const std::vector<Tensor> want = grads_of(f, in64, cot);  // float64: the composed path, gradchecked
      const std::vector<Tensor> got = grads_of(f, in32, cot);
      for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(all_close(got[k], values(want[k]), 1e-4, 1e-4)) << "input " << k;
    }
  }
}

// Geometries at the edges of what oneDNN describes: padding wider than the kernel's reach, a
// stride past the kernel (windows skip inputs), the last window stopping far short of the padded
// input (a negative right padding), a kernel as large as the padded input, transposed ones of each.
TEST(Conv3dNative, EdgeGeometriesMatchLoop) {
  SKIP_WITHOUT_NATIVE();
  Generator g(85);
  const ConvCase edges[] = {
      {{1, 2, 3, 4, 2}, 3, 1, 1, {3, 2, 4}, 1, 1, true},
      {{2, 2, 10, 9, 11}, 2, {2, 1, 3}, {7, 5, 4}, 0, 1, 1, true},
      {{1, 3, 5, 4, 6}, 3, {2, 3, 2}, {3, 2, 5}, {2, 1, 3}, {3, 1, 2}, 3, false},
      {{1, 2, 3, 3, 3}, 2, {5, 5, 3}, 1, 1, 1, 1, true},
      {{2, 4, 3, 4, 3}, 4, 2, {3, 2, 4}, {1, 0, 2}, {2, 3, 1}, 4, true, {2, 2, 0}},
  };
  for (const ConvCase& c : edges) {
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(fmt::format("{} x ({}, {}, {}, {}, {}) kernel {} stride {} padding {} dilation {}",
                               transposed ? "transposed" : "conv", c.x.n, c.x.c, c.x.d, c.x.h, c.x.w, c.kernel,
                               c.stride, c.padding, c.dilation));
      const Operands o = draw(c, transposed, g);
      const F::Conv3dArgs a{c.stride, c.padding, c.dilation, c.groups};
      const F::ConvTranspose3dArgs ta{c.stride, c.padding, c.output_padding, c.groups, c.dilation};
      Shape shape;
      if (transposed) {
        const std::vector<double> want = conv_transpose3d_loop(o.x, o.w, o.b, ta, shape);
        if (shape[2] < 1 || shape[3] < 1 || shape[4] < 1) continue;
        EXPECT_TRUE(all_close(F::conv_transpose3d(f32(o.x), f32(o.w), f32(o.b), ta), want, 1e-5, 1e-5));
      } else {
        const std::vector<double> want = conv3d_loop(o.x, o.w, o.b, a, shape);
        EXPECT_TRUE(all_close(F::conv3d(f32(o.x), f32(o.w), f32(o.b), a), want, 1e-5, 1e-5));
      }
      const Fn3 f = [&](const std::vector<Tensor>& t) {
        return transposed ? F::conv_transpose3d(t[0], t[1], t[2], ta) : F::conv3d(t[0], t[1], t[2], a);
      };
      std::vector<Tensor> in64 = {o.x, o.w, o.b.defined() ? o.b : zeros({c.out_channels}, kFloat64)};
      std::vector<Tensor> in32;
      for (const Tensor& t : in64) in32.push_back(f32(t));
      const Tensor cot = randn(f(in64).shape(), kFloat64, &g);
      const std::vector<Tensor> want = grads_of(f, in64, cot);
      const std::vector<Tensor> got = grads_of(f, in32, cot);
      for (size_t k = 0; k < 3; ++k) EXPECT_TRUE(all_close(got[k], values(want[k]), 1e-4, 1e-4)) << "input " << k;
    }
  }
}

// Problems that differ only in one 3-d parameter yet have the same operand shapes, back to back,
// and a 2-d convolution beside its depth-1 3-d twin: each must build its own oneDNN primitive
// (the cache key holds the rank and every parameter per dim), so each matches its own loop.
TEST(Conv3dNative, SameShapesOtherParametersGetTheirOwnPrimitives) {
  SKIP_WITHOUT_NATIVE();
  Generator g(86);
  const Tensor x = randn({1, 2, 5, 6, 5}, kFloat64, &g), w = randn({3, 2, 3, 3, 1}, kFloat64, &g);
  const F::Conv3dArgs variants[] = {
      {1, {1, 1, 0}, 1, 1}, {1, {2, 1, 0}, {2, 1, 1}, 1},    // padding and dilation of depth (same output)
      {1, {1, 1, 0}, 1, 1}, {1, {1, 2, 0}, {1, 2, 1}, 1},    // of height
      {{1, 1, 3}, {1, 1, 0}, 1, 1}, {{1, 1, 4}, {1, 1, 0}, 1, 1},  // stride of width 3 and 4: 2 outputs each
  };
  for (bool backward : {false, true})
    for (const F::Conv3dArgs& a : variants) {
      SCOPED_TRACE(fmt::format("stride {} padding {} dilation {}", a.stride, a.padding, a.dilation));
      Shape shape;
      const std::vector<double> want = conv3d_loop(x, w, Tensor(), a, shape);
      const Tensor xf = f32(x).requires_grad_(), wf = f32(w).requires_grad_();
      const Tensor y = F::conv3d(xf, wf, Tensor(), a);
      EXPECT_TRUE(all_close(y, want, 1e-5, 1e-5));
      if (!backward) continue;
      const Tensor cot = randn(shape, kFloat32, &g);
      const std::vector<Tensor> got = autograd::grad({y}, {xf, wf}, {cot});
      const Fn3 conv = [&](const std::vector<Tensor>& t) { return F::conv3d(t[0], t[1], Tensor(), a); };
      const std::vector<Tensor> ref = grads_of(conv, {x, w}, cot);  // float64: the composed path
      for (size_t k = 0; k < 2; ++k) EXPECT_TRUE(all_close(got[k], values(ref[k]), 1e-4, 1e-4)) << "input " << k;
    }
  const Tensor x2 = x.select(2, 0), w2 = w.select(2, 1);
  const Tensor y2 = F::conv2d(f32(x2), f32(w2), Tensor(), {.padding = {1, 0}});
  const Tensor y3 = F::conv3d(f32(x2).unsqueeze(2), f32(w2).unsqueeze(2), Tensor(), {.padding = {0, 1, 0}});
  EXPECT_TRUE(all_close(y3.squeeze(2), values(F::conv2d(x2, w2, Tensor(), {.padding = {1, 0}})), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(y2, values(y3.squeeze(2)), 1e-5, 1e-5));
}
