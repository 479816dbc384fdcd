// Tensor basics: factories, views and the bounds they are held to, copies across layouts
// (the tiled transposes of kernels/cpu/transpose.h), dtype promotion and
// conversion, the caching allocator, from_blob, printing.
#include <cstdlib>
#include <limits>
#include <thread>

#include "testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::values;

TEST(Tensor, Factories) {
  EXPECT_TRUE(all_close(zeros({2, 3}), std::vector<double>(6, 0), 0, 0));
  EXPECT_TRUE(all_close(ones({4}), std::vector<double>(4, 1), 0, 0));
  EXPECT_TRUE(all_close(full({2, 2}, 7.5), {7.5, 7.5, 7.5, 7.5}, 0, 0));
  EXPECT_EQ(full({2}, 3).dtype(), kFloat32);
  EXPECT_EQ(arange(5).dtype(), kInt64);
  EXPECT_EQ(arange(0.0, 1.0, 0.25).dtype(), kFloat32);
  EXPECT_TRUE(all_close(arange(0.0, 1.0, 0.25), {0, 0.25, 0.5, 0.75}, 0, 0));
  EXPECT_TRUE(all_close(arange(10, 0, -3), {10, 7, 4, 1}, 0, 0));
  EXPECT_TRUE(all_close(linspace(0, 1, 5, kFloat64), {0, 0.25, 0.5, 0.75, 1}, 0, 0));
  EXPECT_EQ(linspace(-1, 3, 7).numel(), 7);
  EXPECT_EQ(values(linspace(-1, 3, 7)).back(), 3.0);
  // one step is the start; both ends exact, and the values symmetric (PyTorch's two-ended form)
  EXPECT_EQ(values(linspace(3, 7, 1)), std::vector<double>{3});
  EXPECT_EQ(values(linspace(3, 7, 1, TensorOptions(kInt64))), std::vector<double>{3});
  const std::vector<double> sym = values(linspace(-1, 1, 7, kFloat64));
  EXPECT_EQ(sym[3], 0.0);
  for (size_t i = 0; i < sym.size(); ++i) EXPECT_EQ(sym[i], -sym[sym.size() - 1 - i]) << i;
  EXPECT_TRUE(all_close(eye(2, 3), {1, 0, 0, 0, 1, 0}, 0, 0));
  Tensor v = from_vector<int32_t>({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  EXPECT_EQ(v.dtype(), kInt32);
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(v, {1, 2, 3, 4, 5, 6}, 0, 0));
  EXPECT_EQ(from_vector<bool>({true, false}).dtype(), kBool);
  EXPECT_EQ(scalar_tensor(3).dim(), 0);
  EXPECT_EQ(scalar_tensor(3).item<int>(), 3);
}

// Long aranges run as a vectorized loop over the threads' spans: every value is start + i step.
TEST(Creation, LongArangeValues) {
  const int64_t big = (int64_t{1} << 52) + 3;
  const std::vector<double> ints = values(arange(big, big + 100003, 1));
  for (size_t i = 0; i < ints.size(); ++i) ASSERT_EQ(ints[i], static_cast<double>(big + static_cast<int64_t>(i))) << i;
  const std::vector<double> floats = values(arange(-3.0, 7000.0, 0.125, kFloat64));
  ASSERT_EQ(floats.size(), 56024u);
  for (size_t i = 0; i < floats.size(); ++i) ASSERT_EQ(floats[i], -3.0 + 0.125 * static_cast<double>(i)) << i;
  const std::vector<double> down = values(arange(100, -100, -3, kInt8));
  ASSERT_EQ(down.size(), 67u);
  for (size_t i = 0; i < down.size(); ++i) ASSERT_EQ(down[i], 100.0 - 3.0 * static_cast<double>(i)) << i;
  // an integer dtype truncates fractional arguments toward zero first, as PyTorch's int64
  // arange: no value is repeated or skipped
  EXPECT_EQ(values(arange(-2.5, 2.5, 1, kInt64)), (std::vector<double>{-2, -1, 0, 1}));
  EXPECT_EQ(values(arange(0, 5, 1.5, kInt32)), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(all_close(arange(0.5, 2.5, 0.5, kFloat64), {0.5, 1, 1.5, 2}, 0, 0));
}

TEST(Tensor, FactoriesRejectBadInput) {
  EXPECT_THROW(zeros({2, -1}), Error);
  EXPECT_THROW(arange(0, 10, 0), Error);
  EXPECT_THROW(arange(0, 10, -1), Error);
  EXPECT_THROW(linspace(0, 1, -2), Error);
  EXPECT_THROW(eye(-1), Error);
  EXPECT_THROW(from_vector<float>({1, 2, 3}, Shape{2, 2}), Error);
  EXPECT_THROW(randint(5, 5, {3}), Error);
  // element counts whose product overflows int64
  EXPECT_THROW(empty({int64_t(1) << 40, int64_t(1) << 40}), Error);
  EXPECT_THROW(empty({std::numeric_limits<int64_t>::max(), 2}), Error);
  EXPECT_THROW(empty({2}, Device::cuda(0)), Error);
}

TEST(Tensor, ZeroSize) {
  Tensor z = zeros({3, 0, 2});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ((z + 1).shape(), (Shape{3, 0, 2}));
  EXPECT_EQ(z.reshape({0, 5}).shape(), (Shape{0, 5}));
  EXPECT_EQ(z.transpose(0, 2).contiguous().shape(), (Shape{2, 0, 3}));
  EXPECT_THROW(z.reshape({-1}).view({0, -1}), Error);  // -1 cannot be inferred for 0 elements
}

TEST(Tensor, ZeroSizeWithHugeDims) {
  // no elements, so the other dims may be as large as int64 allows; strides must not wrap
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Tensor z = empty({0, kMax, kMax}, kFloat32);
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.stride(2), 1);
  EXPECT_EQ(z.stride(1), kMax);
  EXPECT_EQ(z.stride(0), kMax);  // saturated, not wrapped
  EXPECT_THROW(empty({2, kMax}, kFloat32), Error);  // elements that int64 cannot count
}

TEST(Tensor, ViewsShareStorage) {
  Tensor a = arange(12, kFloat32);
  Tensor m = a.view({3, 4});
  Tensor t = m.t();
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.shape(), (Shape{4, 3}));
  EXPECT_EQ(t.strides(), (Strides{1, 4}));
  t.select(0, 1).fill_(-1);  // column 1 of m
  EXPECT_TRUE(all_close(m.select(1, 1), {-1, -1, -1}, 0, 0));
  EXPECT_EQ(a.storage().get(), t.storage().get());
  // a view equals its copy
  EXPECT_TRUE(all_close(t.contiguous(), values(t), 0, 0));
  EXPECT_TRUE(all_close(m.slice(1, 1, 4, 2), {-1, 3, -1, 7, -1, 11}, 0, 0));
  EXPECT_TRUE(all_close(m.narrow(0, 1, 2), {4, -1, 6, 7, 8, -1, 10, 11}, 0, 0));
  EXPECT_TRUE(all_close(m[2], {8, -1, 10, 11}, 0, 0));
  EXPECT_EQ(m.unsqueeze(1).shape(), (Shape{3, 1, 4}));
  EXPECT_EQ(m.unsqueeze(-1).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(m.unsqueeze(1).squeeze().shape(), (Shape{3, 4}));
  EXPECT_EQ(m.unsqueeze(0).squeeze(0).shape(), (Shape{3, 4}));
  EXPECT_EQ(m.view({2, 2, 3}).flatten(1).shape(), (Shape{2, 6}));
  EXPECT_EQ(m.unflatten(1, {2, -1}).shape(), (Shape{3, 2, 2}));
  Tensor e = arange(3, kFloat32).view({3, 1}).expand({3, 4});
  EXPECT_EQ(e.strides(), (Strides{1, 0}));
  EXPECT_TRUE(all_close(e, {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, 0, 0));
  Tensor p = arange(24, kFloat32).view({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(values(p)[1], 4.0);
}

TEST(Tensor, ReshapeCopiesOnlyWhenItMust) {
  Tensor m = arange(12, kFloat32).view({3, 4});
  EXPECT_EQ(m.reshape({4, 3}).storage().get(), m.storage().get());
  Tensor t = m.t();
  EXPECT_THROW(t.view({12}), Error);
  Tensor r = t.reshape({12});
  EXPECT_NE(r.storage().get(), m.storage().get());
  EXPECT_TRUE(all_close(r, {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}, 0, 0));
  // a permuted tensor whose merged dims stay contiguous can still be viewed
  Tensor q = arange(48, kFloat32).view({8, 6}).slice(0, 0, 8, 2);  // (4, 6), strides (12, 1)
  EXPECT_EQ(q.view({4, 2, 3}).storage().get(), q.storage().get());
  EXPECT_THROW(q.view({24}), Error);
  // round trip
  Tensor x = randn({2, 3, 5});
  EXPECT_TRUE(all_close(x.reshape({5, 6}).reshape({2, 3, 5}), values(x), 0, 0));
}

TEST(Tensor, ViewsRejectBadInput) {
  Tensor m = zeros({3, 4});
  EXPECT_THROW(m.view({5, 3}), Error);
  EXPECT_THROW(m.view({-1, -1}), Error);
  EXPECT_THROW(m.permute({0, 0}), Error);
  EXPECT_THROW(m.permute({0}), Error);
  EXPECT_THROW(m.transpose(0, 2), Error);
  EXPECT_THROW(m.select(0, 3), Error);
  EXPECT_THROW(m.select(1, -5), Error);
  EXPECT_THROW(m.narrow(1, 2, 3), Error);
  EXPECT_THROW(m.narrow(1, 0, -1), Error);
  EXPECT_THROW(m.slice(0, 0, 3, 0), Error);
  EXPECT_THROW(m.expand({3, 5}), Error);
  EXPECT_THROW(m.expand({4}), Error);
  EXPECT_THROW(m.unsqueeze(4), Error);
  EXPECT_THROW(m.size(2), Error);
  EXPECT_THROW(m.flatten(1, 0), Error);
  EXPECT_THROW(Tensor().shape(), Error);
  // views past the end of storage, negative offsets and strides
  EXPECT_THROW(m.as_strided({3, 4}, {4, 2}), Error);
  EXPECT_THROW(m.as_strided({2}, {1}, 11), Error);
  EXPECT_THROW(m.as_strided({2}, {1}, -1), Error);
  EXPECT_THROW(m.as_strided({2}, {-1}, 5), Error);
  EXPECT_THROW(m.as_strided({2, 2}, {1}), Error);
  EXPECT_THROW(m.as_strided({int64_t(1) << 62, 4}, {int64_t(1) << 62, 1}), Error);
  EXPECT_NO_THROW(m.as_strided({4}, {3}, 0));
  EXPECT_NO_THROW(m.as_strided({4}, {0}, 11));  // stride-0 reads one element
}

TEST(Tensor, TypePromotion) {
  EXPECT_EQ(promote_types(kInt32, kFloat16), kFloat16);
  EXPECT_EQ(promote_types(kUInt8, kInt8), kInt32);
  EXPECT_EQ(promote_types(kFloat16, kBFloat16), kFloat32);
  EXPECT_EQ(promote_types(kBool, kUInt8), kUInt8);
  EXPECT_EQ(promote_types(kInt64, kFloat32), kFloat32);
  EXPECT_EQ(promote_types(kFloat32, kFloat64), kFloat64);
  Tensor i = ones({2}, kInt32), h = ones({2}, kFloat16), d = ones({2}, kFloat64);
  EXPECT_EQ((i + h).dtype(), kFloat16);
  EXPECT_EQ((i * 2.5).dtype(), kFloat32);
  EXPECT_EQ((h * 2.5).dtype(), kFloat16);
  EXPECT_EQ((i + 2).dtype(), kInt32);
  EXPECT_EQ((i / 2).dtype(), kFloat32);
  EXPECT_EQ((h + d).dtype(), kFloat64);
  EXPECT_EQ((i + scalar_tensor(2.0, kFloat64)).dtype(), kFloat64);  // 0-d lifts the category
  EXPECT_EQ((d + scalar_tensor(2, kInt64)).dtype(), kFloat64);
  EXPECT_EQ((h + scalar_tensor(2.0, kFloat64)).dtype(), kFloat16);  // same category: no lift
  EXPECT_EQ((ones({2}, kBool) + true).dtype(), kBool);
  EXPECT_EQ((ones({2}, kUInt8) < 3).dtype(), kBool);
}

TEST(Tensor, Conversions) {
  Tensor x = from_vector<float>({-1.75f, -0.5f, 0.f, 2.5f, 3.99f, 300.f});
  EXPECT_TRUE(all_close(x.to(kInt32), {-1, 0, 0, 2, 3, 300}, 0, 0));
  EXPECT_TRUE(all_close(x.to(kBool), {1, 1, 0, 1, 1, 1}, 0, 0));
  EXPECT_TRUE(all_close(x.to(kFloat16), {-1.75, -0.5, 0, 2.5, 3.990234375, 300}, 0, 0));
  EXPECT_TRUE(all_close(x.to(kBFloat16), {-1.75, -0.5, 0, 2.5, 3.984375, 300}, 0, 0));
  EXPECT_EQ(x.to(kFloat32).storage().get(), x.storage().get());  // no-op conversion is free
  EXPECT_EQ(from_vector<int64_t>({int64_t(1) << 40}).to(kFloat64).item<double>(), double(int64_t(1) << 40));
  Tensor b = from_vector<bool>({true, false, true});
  EXPECT_TRUE(all_close(b.to(kFloat32), {1, 0, 1}, 0, 0));
  EXPECT_EQ(scalar_tensor(2.5).item<int>(), 2);
  EXPECT_THROW(zeros({2}).item<float>(), Error);
  EXPECT_THROW(zeros({2}).data_ptr<double>(), Error);
  EXPECT_NE(zeros({2}).data_ptr<float>(), nullptr);
  // copy_ broadcasts and converts
  Tensor dst = zeros({2, 3}, kFloat64);
  dst.copy_(from_vector<int32_t>({1, 2, 3}));
  EXPECT_TRUE(all_close(dst, {1, 2, 3, 1, 2, 3}, 0, 0));
  EXPECT_THROW(dst.copy_(zeros({3, 3})), Error);
}

TEST(Tensor, ChannelsLast) {
  Tensor x = randn({2, 3, 4, 5});
  Tensor cl = x.to(MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.shape(), x.shape());
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_EQ(cl.strides(), (Strides{60, 1, 15, 3}));
  EXPECT_TRUE(all_close(cl, values(x), 0, 0));
  EXPECT_TRUE(cl.to(MemoryFormat::Contiguous).is_contiguous());
  EXPECT_THROW(randn({2, 3}).to(MemoryFormat::ChannelsLast), Error);
}

// Copies and *_like tensors keep channels-last, as PyTorch's default preserve_format;
// contiguous() and other layouts give contiguous results.
TEST(Tensor, CopiesKeepChannelsLast) {
  Tensor x = randn({2, 3, 4, 5});
  Tensor cl = x.to(MemoryFormat::ChannelsLast);
  const Strides nhwc{60, 1, 15, 3};
  std::vector<std::pair<const char*, Tensor>> copies = {
      {"clone", cl.clone()},           {"to(float64)", cl.to(kFloat64)}, {"to(cpu, float16)", cl.to(kCPU, kFloat16)},
      {"empty_like", empty_like(cl)},  {"zeros_like", zeros_like(cl)},  {"ones_like", ones_like(cl, kInt32)},
      {"full_like", full_like(cl, 2)}, {"rand_like", rand_like(cl)},    {"randn_like", randn_like(cl)}};
  for (const auto& [name, t] : copies) {
    EXPECT_EQ(t.shape(), x.shape()) << name;
    EXPECT_EQ(t.strides(), nhwc) << name;
  }
  EXPECT_TRUE(all_close(cl.clone(), values(x), 0, 0));
  EXPECT_TRUE(all_close(cl.to(kFloat64), values(x), 0, 0));
  EXPECT_EQ(values(full_like(cl, 2)), std::vector<double>(120, 2.0));
  EXPECT_TRUE(cl.contiguous().is_contiguous());
  EXPECT_TRUE(x.clone().is_contiguous());
  EXPECT_TRUE(x.transpose(2, 3).clone().is_contiguous());  // other layouts: contiguous copies
  Tensor leaf = zeros_like(cl, TensorOptions().requires_grad());
  EXPECT_TRUE(leaf.requires_grad() && leaf.is_leaf());
  EXPECT_EQ(leaf.strides(), nhwc);
  // a 1-channel or 1x1 image is both layouts at once: it stays contiguous
  EXPECT_TRUE(randn({2, 1, 4, 5}).to(MemoryFormat::ChannelsLast).clone().is_contiguous());
  // a slice of a channels-last tensor (not dense) copies to channels-last, as in PyTorch
  Tensor rows = cl.narrow(2, 1, 2);
  ASSERT_FALSE(rows.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(rows.clone().strides(), (Strides{30, 1, 15, 3}));
  EXPECT_TRUE(all_close(rows.clone(), values(x.narrow(2, 1, 2)), 0, 0));
  EXPECT_TRUE(x.narrow(2, 1, 2).clone().is_contiguous());
  // the gradient of a clone flows back whatever the layouts
  Tensor src = randn({2, 3, 4, 5}).requires_grad_();
  (src.to(MemoryFormat::ChannelsLast).clone() * 3).sum().backward();
  EXPECT_EQ(values(src.grad()), std::vector<double>(120, 3.0));
}

// Copies between layouts that run along different dims take tiles (kernels/cpu/transpose.h):
// sizes around the tile, outer dims, a broadcast operand and a dtype conversion, each checked
// element by element against the source.
TEST(Tensor, TransposedCopiesMatchElementByElement) {
  Generator g(31);
  for (int64_t r : {31, 32, 33, 70})
    for (int64_t c : {32, 45, 97}) {
      Tensor x = randn({r, c}, kFloat64, &g);
      for (DType t : {kFloat64, kFloat32}) {
        Tensor y = x.t().to(t).contiguous();  // (c, r) from a transposed view
        ASSERT_EQ(y.shape(), (Shape{c, r}));
        std::vector<double> xv = values(x), yv = values(y);
        for (int64_t i = 0; i < r; ++i)
          for (int64_t j = 0; j < c; ++j)
            ASSERT_EQ(yv[j * r + i], t == kFloat32 ? double(float(xv[i * c + j])) : xv[i * c + j]) << r << "x" << c;
      }
    }
  // a permute with outer dims both ways, to channels-last and back
  Tensor img = randn({3, 40, 5, 36}, kFloat32, &g);
  Tensor cl = img.to(MemoryFormat::ChannelsLast), back = cl.contiguous();
  EXPECT_EQ(values(cl), values(img));
  EXPECT_EQ(values(back), values(img));
  Tensor p = img.permute({2, 3, 0, 1}).contiguous();
  std::vector<double> iv = values(img), pv = values(p);
  for (int64_t n = 0; n < 3; ++n)
    for (int64_t ch = 0; ch < 40; ++ch)
      for (int64_t h = 0; h < 5; ++h)
        for (int64_t w = 0; w < 36; ++w)
          ASSERT_EQ(pv[((h * 36 + w) * 3 + n) * 40 + ch], iv[((n * 40 + ch) * 5 + h) * 36 + w]);
  // into a transposed destination from a source broadcast along a third dim
  Tensor src = randn({1, 48, 40}, kFloat32, &g), dst = zeros({4, 40, 48}, kFloat32).transpose(1, 2);
  dst.copy_(src);
  for (int64_t b = 0; b < 4; ++b) EXPECT_EQ(values(dst.select(0, b)), values(src.select(0, 0)));
}

TEST(Tensor, FromBlobDoesNotCopyAndRunsDeleter) {
  float buf[6] = {1, 2, 3, 4, 5, 6};
  int deleted = 0;
  {
    Tensor t = from_blob(buf, {2, 3}, kFloat32, [&](void* p) {
      EXPECT_EQ(p, buf);
      ++deleted;
    });
    Tensor view = t.t();
    t = Tensor();
    EXPECT_EQ(deleted, 0);  // the view keeps the storage alive
    view.mul_(2);
    EXPECT_EQ(buf[1], 4);
  }
  EXPECT_EQ(deleted, 1);
  Tensor strided = from_blob(buf, {3}, kFloat32, {}, Strides{2});
  EXPECT_TRUE(all_close(strided, {2, 6, 10}, 0, 0));
  EXPECT_THROW(from_blob(nullptr, {2}, kFloat32), Error);
  EXPECT_THROW(from_blob(buf, {2}, kFloat32, {}, Strides{-1}), Error);
}

TEST(Allocator, CachesAndCounts) {
  Allocator& a = cpu_allocator();
  a.empty_cache();
  MemoryStats s0 = a.stats();
  {
    Tensor t = empty({1000}, kFloat32);
    MemoryStats s1 = a.stats();
    EXPECT_GE(s1.bytes_in_use - s0.bytes_in_use, 4000);
    EXPECT_EQ(s1.num_allocs, s0.num_allocs + 1);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  }
  MemoryStats s2 = a.stats();
  EXPECT_EQ(s2.bytes_in_use, s0.bytes_in_use);
  EXPECT_GT(s2.bytes_reserved, s0.bytes_reserved);  // the block stays cached
  Tensor again = empty({1000}, kFloat32);
  EXPECT_EQ(a.stats().num_cache_hits, s2.num_cache_hits + 1);
  EXPECT_GE(a.stats().peak_bytes_in_use, 4000);
  again = Tensor();
  a.empty_cache();
  EXPECT_EQ(a.stats().bytes_reserved, a.stats().bytes_in_use);
  EXPECT_EQ(&pinned_allocator(), &cpu_allocator());  // no GPU: pinned falls back to CPU memory
  Tensor pinned = ones({3}).pin_memory();
  EXPECT_TRUE(all_close(pinned, {1, 1, 1}, 0, 0));
}

// Note [Huge pages]: blocks of 2 MiB and more start on a 2 MiB boundary, where a transparent
// huge page can back them; smaller ones keep the 64-byte alignment and their size class.
TEST(Allocator, LargeBlocksAlignToHugePages) {
  if (const char* env = std::getenv("STRATA_CPU_HUGE_PAGES"); env && std::atoi(env) == 0) GTEST_SKIP();
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  for (int64_t n : {int64_t(512) << 10, int64_t(640) << 10, int64_t(5) << 20}) {  // 2, 2.5 and 20 MiB of floats
    Tensor t = full({n}, 3.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kHuge, 0u) << n;
    EXPECT_EQ(t.sum().item<double>(), 3.0 * double(n));
  }
  Tensor small = empty({1000}, kFloat32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
}

// ---- bad input that once crashed or gave invalid tensors -------------------------------------

namespace {

// f() raises strata::Error whose message contains `needle`.
template <class F>
::testing::AssertionResult raises(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const Error& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message '" << e.what() << "' lacks '" << needle << "'";
  }
  return ::testing::AssertionFailure() << "no Error (wanted '" << needle << "')";
}

}  // namespace

TEST(BadInput, ZeroDimTensorsDimsAndViews) {
  Tensor s = scalar_tensor(3.0);
  EXPECT_TRUE(raises([&] { s.size(0); }, "[size] dim 0 is out of range"));
  EXPECT_TRUE(raises([&] { s.stride(-1); }, "[stride]"));
  EXPECT_TRUE(raises([&] { s.unflatten(0, {1}); }, "[unflatten] cannot unflatten a 0-d tensor"));
  EXPECT_TRUE(raises([&] { s.transpose(0, 1); }, "[transpose] dim 1 is out of range"));
  EXPECT_TRUE(raises([&] { s.squeeze(1); }, "[squeeze] dim 1 is out of range"));
  EXPECT_EQ(s.transpose(0, -1).dim(), 0);
  // a 0-d tensor views as any all-ones shape, as in PyTorch
  EXPECT_EQ(s.view({1}).shape(), (Shape{1}));
  EXPECT_EQ(s.reshape({-1}).shape(), (Shape{1}));
  EXPECT_EQ(s.reshape({1, 1, 1}).item<double>(), 3.0);
  EXPECT_EQ(s.flatten().shape(), (Shape{1}));
  EXPECT_EQ(s.flatten(-1, 0).shape(), (Shape{1}));
  EXPECT_TRUE(raises([&] { s.flatten(3, 7); }, "[flatten]"));
  EXPECT_TRUE(raises([&] { ones({1}).unflatten(0, {}); }, "[unflatten] sizes must not be empty"));
  EXPECT_TRUE(raises([&] { max(empty({2, 0}), 1); }, "[max]"));
  EXPECT_TRUE(raises([&] { min(empty({2, 0}), 1); }, "[min]"));
  EXPECT_TRUE(raises([&] { linspace(0, 1, 3, TensorOptions(kBool)); }, "[linspace] bool"));
}

TEST(BadInput, SliceWithHugeSteps) {
  Tensor t = arange(24).view({2, 3, 4});
  Tensor a = t.slice(2, 1, 4, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(a.shape(), (Shape{2, 3, 1}));
  EXPECT_TRUE(all_close(a.flatten(), {1, 5, 9, 13, 17, 21}, 0, 0));
  EXPECT_EQ(zeros({10}).slice(0, 2, 10, std::numeric_limits<int64_t>::max() - 5).shape(), (Shape{1}));
  EXPECT_EQ(zeros({10}).slice(0, 10, 10, 3).numel(), 0);
  EXPECT_TRUE(all_close(arange(10).slice(0, 1, 10, 4), {1, 5, 9}, 0, 0));
}

TEST(BadInput, RandintBoundsAndDtypes) {
  EXPECT_TRUE(raises([] { randint(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), {4}); },
                     "within +-2^53"));
  EXPECT_TRUE(raises([] { randint(int64_t(1) << 53, (int64_t(1) << 53) + 1, {4}); }, "within +-2^53"));
  EXPECT_TRUE(raises([] { randint(0, 1000, {4}, TensorOptions(kUInt8)); }, "do not fit uint8"));
  EXPECT_TRUE(raises([] { randint(-200, 200, {4}, TensorOptions(kInt8)); }, "do not fit int8"));
  EXPECT_TRUE(raises([] { randint(0, 70000, {4}, TensorOptions(kFloat16)); }, "do not fit float16"));
  Tensor edge = randint(-(int64_t(1) << 53), int64_t(1) << 53, {64});
  for (double v : values(edge)) EXPECT_TRUE(v >= -9007199254740992.0 && v < 9007199254740992.0);
  for (double v : values(randint(0, 256, {300}, TensorOptions(kUInt8)))) EXPECT_TRUE(v >= 0 && v <= 255);
}

TEST(BadInput, ScalarsThatDoNotFitAnIntegerDtype) {
  EXPECT_TRUE(raises([] { full({2}, NAN, TensorOptions(kInt64)); }, "[full] value nan cannot be converted to int64"));
  EXPECT_TRUE(raises([] { full({2}, INFINITY, TensorOptions(kInt32)); }, "cannot be converted to int32"));
  EXPECT_TRUE(raises([] { full({2}, 300, TensorOptions(kUInt8)); }, "value 300 cannot be converted to uint8"));
  EXPECT_TRUE(raises([] { full({2}, int64_t(1) << 40, TensorOptions(kInt32)); }, "cannot be converted to int32"));
  EXPECT_TRUE(raises([] { zeros({2}, TensorOptions(kInt8)).fill_(-129); }, "[fill_]"));
  EXPECT_TRUE(raises([] { full({2}, 9.3e18, TensorOptions(kInt64)); }, "cannot be converted to int64"));
  // an op with a scalar names itself, not the tensor it makes of the scalar
  const Tensor u8 = zeros({2}, TensorOptions(kUInt8));
  EXPECT_TRUE(raises([&] { lt(u8, -1); }, "[lt] value -1 cannot be converted to uint8"));
  EXPECT_TRUE(raises([&] { add(u8, 1000); }, "[add] value 1000"));
  EXPECT_TRUE(raises([&] { where(from_vector<bool>({true, false}), u8, -1); }, "[where] value -1"));
  Tensor m = from_vector<bool>({true, false});
  EXPECT_TRUE(raises([&] { zeros({2}, TensorOptions(kInt32)).masked_fill_(m, NAN); }, "[masked_fill]"));
  // what fits is taken: truncation toward zero, as PyTorch's fill does
  EXPECT_TRUE(all_close(full({2}, -7.9, TensorOptions(kInt8)), {-7, -7}, 0, 0));
  EXPECT_TRUE(all_close(full({1}, 255, TensorOptions(kUInt8)), {255}, 0, 0));
  EXPECT_TRUE(all_close(full({1}, 2.5, TensorOptions(kBool)), {1}, 0, 0));
  EXPECT_EQ(Scalar(NAN).to_int(), 0);
  EXPECT_EQ(Scalar(1e300).to_int(), std::numeric_limits<int64_t>::max());
}

// A value stored as it is (full, fill_, masked_fill, scatter) past a floating dtype's largest
// finite one raises, as in PyTorch, instead of becoming inf; inf and NaN themselves are stored,
// and arithmetic with such a scalar overflows to inf as the arithmetic would.
TEST(BadInput, StoredValuesPastAFloatingDtypesRange) {
  EXPECT_TRUE(raises([] { full({2}, 70000.0, TensorOptions(kFloat16)); },
                     "[full] value 70000 cannot be converted to float16 without overflow"));
  EXPECT_TRUE(raises([] { full({2}, -65520.0, TensorOptions(kFloat16)); }, "cannot be converted to float16"));
  EXPECT_TRUE(raises([] { full({2}, 3.4e38, TensorOptions(kBFloat16)); }, "cannot be converted to bfloat16"));
  EXPECT_TRUE(raises([] { full({2}, 1e39, TensorOptions(kFloat32)); }, "cannot be converted to float32"));
  EXPECT_TRUE(raises([] { zeros({2}, TensorOptions(kFloat16)).fill_(1e5); }, "[fill_] value 100000"));
  const Tensor m = from_vector<bool>({true, false});
  EXPECT_TRUE(raises([&] { zeros({2}, TensorOptions(kFloat16)).masked_fill_(m, -1e5); }, "[masked_fill]"));
  EXPECT_TRUE(raises([&] { masked_fill(zeros({2}), m, 1e300); }, "[masked_fill]"));
  EXPECT_TRUE(raises([&] { scatter(zeros({2}, TensorOptions(kBFloat16)), 0, from_vector<int64_t>({0}), 1e39); },
                     "[scatter] value 1e+39 cannot be converted to bfloat16"));
  // the largest finite values, infinities and NaN are stored; float64 takes anything
  EXPECT_EQ(values(full({1}, 65504.0, TensorOptions(kFloat16)))[0], 65504.0);
  EXPECT_EQ(values(full({1}, -3.4028234663852886e38, TensorOptions(kFloat32)))[0], -3.4028234663852886e38);
  EXPECT_EQ(values(full({1}, 3.3895313892515355e38, TensorOptions(kBFloat16)))[0], 3.3895313892515355e38);
  EXPECT_EQ(values(full({1}, -INFINITY, TensorOptions(kFloat16)))[0], -INFINITY);
  EXPECT_TRUE(std::isnan(values(zeros({1}, TensorOptions(kBFloat16)).fill_(NAN))[0]));
  EXPECT_EQ(values(masked_fill(zeros({2}, TensorOptions(kFloat16)), m, -INFINITY))[0], -INFINITY);
  EXPECT_EQ(values(full({1}, 1e300, TensorOptions(kFloat64)))[0], 1e300);
  // arithmetic and comparisons with an out-of-range scalar: inf, as the math gives
  EXPECT_EQ(values(add(ones({1}), 1e300))[0], INFINITY);
  EXPECT_EQ(values(mul(ones({1}, TensorOptions(kFloat16)), 1e5))[0], INFINITY);
  EXPECT_EQ(values(sub(ones({1}, TensorOptions(kBFloat16)), 1e300))[0], -INFINITY);
  EXPECT_TRUE(all_close(lt(ones({2}), 1e300), {1, 1}, 0, 0));
  EXPECT_TRUE(all_close(where(m, ones({2}), 1e300), {1, INFINITY}, 0, 0));
}

TEST(BadInput, IntegerArangeBeyondDoublesOrItsDtype) {
  EXPECT_TRUE(raises([] { arange((int64_t(1) << 53) + 1, (int64_t(1) << 53) + 4, 1); }, "past 2^53"));
  EXPECT_TRUE(
      raises([] { arange(0, 300, 1, TensorOptions(kUInt8)); }, "[arange] values from 0 to 299 do not fit uint8"));
  EXPECT_TRUE(all_close(arange(250, 256, 2, TensorOptions(kUInt8)), {250, 252, 254}, 0, 0));
  EXPECT_TRUE(raises([] { arange(0, 5, 0.5, kInt64); }, "[arange] step 0.5 truncates to 0 for int64"));
  const double base = 4503599627370496.0;  // 2^52: integers are still exact as doubles
  EXPECT_TRUE(all_close(arange(int64_t(1) << 52, (int64_t(1) << 52) + 3, 1), {base, base + 1, base + 2}, 0, 0));
}

TEST(BadInput, ThreadCounts) {
  const int before = get_num_threads();
  EXPECT_THROW(set_num_threads(0), Error);
  EXPECT_THROW(set_num_threads(100000), Error);  // OpenMP's runtime crashed starting them
  EXPECT_EQ(get_num_threads(), before);
}

TEST(BadInput, FromBlobSpansThatOverflow) {
  float buf[4] = {1, 2, 3, 4};
  EXPECT_TRUE(raises([&] { from_blob(buf, {(int64_t(1) << 62) + 1}, kFloat32); }, "[from_blob]"));
  EXPECT_TRUE(raises([&] { from_blob(buf, {3}, kFloat32, {}, Strides{std::numeric_limits<int64_t>::max()}); },
                     "[from_blob]"));
  EXPECT_TRUE(all_close(from_blob(buf, {2}, kFloat32, {}, Strides{2}), {1, 3}, 0, 0));
}

TEST(BadInput, WritesIntoExpandedViews) {
  Tensor base = zeros({1});
  Tensor e = base.expand({3});
  EXPECT_TRUE(raises([&] { e.fill_(2); }, "[fill_] the destination of shape [3] and strides [0]"));
  EXPECT_TRUE(raises([&] { e.copy_(arange(3).to(kFloat32)); }, "[copy_]"));
  EXPECT_TRUE(raises([&] { e.add_(arange(3).to(kFloat32)); }, "[add_]"));
  EXPECT_TRUE(raises([&] { e.relu_(); }, "[relu_]"));
  EXPECT_TRUE(raises([&] { e.masked_fill_(from_vector<bool>({true, false, true}), 2); }, "[masked_fill_]"));
  EXPECT_EQ(base.item<float>(), 0.0f);  // nothing was written
  // one element, or none, cannot collide
  zeros({1}).expand({1, 1}).fill_(1);
  zeros({1, 0}).expand({3, 0}).fill_(1);
}

TEST(BadInput, OneHotClassCountOverflow) {
  Tensor big = from_vector<int64_t>({std::numeric_limits<int64_t>::max()});
  EXPECT_TRUE(raises([&] { one_hot(big); }, "[one_hot] class index 9223372036854775807 leaves no room"));
  EXPECT_TRUE(raises([] { one_hot(zeros({4}, TensorOptions(kInt64)), int64_t(1) << 62); }, "one_hot"));
}

TEST(Tensor, Printing) {
  EXPECT_EQ(fmt::format("{}", from_vector<float>({1, 2, 3})), "tensor([1., 2., 3.])");
  EXPECT_EQ(fmt::format("{}", from_vector<float>({1.5f, -2.25f})), "tensor([ 1.5000, -2.2500])");
  EXPECT_EQ(fmt::format("{}", arange(4).view({2, 2})), "tensor([[0, 1],\n        [2, 3]])");
  EXPECT_EQ(fmt::format("{}", ones({2}, kFloat64)), "tensor([1., 1.], dtype=float64)");
  EXPECT_EQ(fmt::format("{}", from_vector<bool>({true, false})), "tensor([ True, False])");
  EXPECT_EQ(fmt::format("{}", scalar_tensor(5)), "tensor(5.)");
  EXPECT_EQ(fmt::format("{}", scalar_tensor(5, kInt64)), "tensor(5)");
  EXPECT_EQ(fmt::format("{}", zeros({0, 3})), "tensor([], size=[0, 3])");
  std::string big = fmt::format("{}", arange(2000));
  EXPECT_NE(big.find("2, ..., 1997"), std::string::npos) << big;
  EXPECT_LT(big.size(), 100u);
  EXPECT_EQ(to_string(Tensor()), "tensor(undefined)");
  // integers print exactly, past 2^53 and at the int64 limits
  EXPECT_EQ(fmt::format("{}", from_vector<int64_t>({9007199254740993, INT64_MAX, INT64_MIN})),
            "tensor([    9007199254740993,  9223372036854775807, -9223372036854775808])");
  EXPECT_EQ(fmt::format("{}", scalar_tensor(INT64_MAX, kInt64)), "tensor(9223372036854775807)");
}

// TensorOptions().requires_grad() makes every factory return a leaf that requires grad, filled
// first; an integer dtype cannot require grad.
TEST(Tensor, FactoriesTakeRequiresGrad) {
  const TensorOptions rg = TensorOptions().requires_grad();
  for (const Tensor& t : {empty({2}, rg), zeros({2}, rg), ones({2}, rg), full({2}, 3.5, rg), rand({2}, rg),
                          randn({2}, rg), arange(0, 2, 1, rg), linspace(0, 1, 3, rg), eye(2, std::nullopt, rg),
                          zeros_like(ones({2}), rg), scalar_tensor(1, rg)}) {
    EXPECT_TRUE(t.requires_grad());
    EXPECT_TRUE(t.is_leaf());
  }
  EXPECT_TRUE(all_close(full({2}, 3.5, rg), {3.5, 3.5}, 0, 0));
  EXPECT_TRUE(all_close(eye(2, std::nullopt, rg), {1, 0, 0, 1}, 0, 0));
  EXPECT_FALSE(zeros({2}).requires_grad());
  EXPECT_TRUE(raises([&] { zeros({2}, rg.dtype(kInt64)); }, "only floating tensors can require grad"));
  EXPECT_TRUE(raises([&] { randint(0, 5, {2}, rg.dtype(kInt32)); }, "only floating tensors can require grad"));
}

// set_num_threads holds for every thread of the process, not only the one that called it.
TEST(Tensor, ThreadCountIsProcessWide) {
  const int before = get_num_threads();
  set_num_threads(1);
  int seen = 0;
  std::thread([&] { seen = get_num_threads(); }).join();
  EXPECT_EQ(seen, 1);
  set_num_threads(2);
  std::thread([&] { seen = get_num_threads(); }).join();
  EXPECT_EQ(seen, 2);
  set_num_threads(before);
}

// pin_memory of a tensor that requires grad is a differentiable copy, as in PyTorch.
TEST(Tensor, PinMemoryIsDifferentiable) {
  Tensor a = from_vector<float>({1, 2}).requires_grad_();
  Tensor p = a.pin_memory();
  EXPECT_TRUE(p.requires_grad());
  EXPECT_TRUE(all_close(p, {1, 2}, 0, 0));
  (p * 3).sum().backward();
  EXPECT_TRUE(all_close(a.grad(), {3, 3}, 0, 0));
}

// An allocation past 2^62 bytes is refused, not rounded to a tiny block.
TEST(BadInput, CpuAllocationsPast2To62Bytes) {
  EXPECT_TRUE(raises([] { empty({(int64_t(1) << 61) - 1}, kFloat64); }, "[cpu allocator] out of memory"));
  EXPECT_TRUE(raises([] { empty({(int64_t(1) << 60) + 1}, kFloat32); }, "out of memory"));  // 2^62 + 4 bytes
}

TEST(Tensor, Version) { EXPECT_STREQ(strata::version(), STRATA_VERSION_STRING); }
