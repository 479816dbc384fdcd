// index_select, gather, scatter, scatter_add, index_add, one_hot, tril and triu against
// float64 references written with plain loops: value and index dtypes, negative dims, strided
// layouts, zero-size dims, repeated indices, thread-count independence, and bad input (each
// an Error that names the op and leaves the destination as it was).
#include <algorithm>
#include <initializer_list>
#include <string>

#include "testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::Layout;
using strata::testing::unravel;
using strata::testing::values;
using strata::testing::with_layout;

namespace {

const Layout kLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Sliced};
const DType kValueTypes[] = {kFloat32, kFloat64, kBFloat16, kInt64, kInt32, kUInt8, kBool};
const DType kAddTypes[] = {kFloat32, kFloat64, kInt64, kInt32};

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t f = 0;
  for (size_t d = 0; d < s.size(); ++d) f = f * s[d] + idx[d];
  return f;
}

Tensor random_values(const Shape& s, DType t, Generator& g) {
  if (t == kBool) return randint(0, 2, s, TensorOptions(kInt64), &g).to(kBool);
  if (is_integral(t)) return randint(t == kUInt8 ? 0 : -20, 20, s, TensorOptions(t), &g);
  Tensor x = empty(s, kFloat64);
  uniform_(x, -5, 5, &g);
  return x.to(t);
}

Tensor random_index(const Shape& s, int64_t high, DType t, Generator& g) {
  if (high <= 0) return zeros(s, TensorOptions(t));  // only valid when s is empty
  return randint(0, high, s, TensorOptions(t), &g);
}

std::vector<int64_t> ints(const Tensor& t) {
  std::vector<double> v = values(t);
  return std::vector<int64_t>(v.begin(), v.end());
}

// Runs f, which must raise strata::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no strata::Error raised";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// The shape of an index for a scatter / gather on `s` along d: a little smaller than s in the
// other dims, `along` long in d.
Shape index_shape(const Shape& s, int64_t d, int64_t along) {
  Shape is = s;
  for (size_t k = 0; k < is.size(); ++k)
    if (static_cast<int64_t>(k) != d && is[k] > 1) is[k] -= 1;
  if (!is.empty()) is[d] = along;
  return is;
}

const std::vector<Shape> kShapes = {{6}, {4, 5}, {3, 4, 5}, {2, 3, 0}, {}};

}  // namespace

TEST(IndexSelect, MatchesReference) {
  Generator g(1);
  for (const Shape& xs : kShapes) {
    const int64_t nd = std::max<int64_t>(static_cast<int64_t>(xs.size()), 1);
    for (int64_t dim = -nd; dim < nd; ++dim) {
      const int64_t d = dim < 0 ? dim + nd : dim;
      const int64_t size = xs.empty() ? 1 : xs[d];
      for (DType t : kValueTypes)
        for (DType it : {kInt64, kInt32})
          for (Layout lx : kLayouts)
            for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(-1)}) {  // -1: a 0-d index
              if (size == 0 && n != 0) continue;
              if (xs.empty() && n != 1 && n != -1) continue;
              Shape ishape = n < 0 ? Shape{} : Shape{n};
              Tensor x = with_layout(random_values(xs, t, g), lx);
              Tensor index = with_layout(random_index(ishape, size, it, g), Layout::Sliced);
              SCOPED_TRACE(fmt::format("x {} dim {} {} index {} {} {}", xs, dim, t, ishape, it,
                                       strata::testing::layout_name(lx)));
              Tensor out = index_select(x, dim, index);
              Shape want_shape = xs;
              if (!xs.empty()) want_shape[d] = n < 0 ? 1 : n;
              ASSERT_EQ(out.shape(), want_shape);
              ASSERT_EQ(out.dtype(), t);
              ASSERT_TRUE(out.is_contiguous());
              std::vector<double> xv = values(x), want(static_cast<size_t>(numel_of(want_shape)));
              std::vector<int64_t> iv = ints(index);
              for (size_t i = 0; i < want.size(); ++i) {
                auto idx = unravel(static_cast<int64_t>(i), want_shape);
                if (!idx.empty()) idx[d] = iv[idx[d]];
                want[i] = xv[xs.empty() ? 0 : ravel(idx, xs)];
              }
              ASSERT_TRUE(all_close(out, want, 0, 0));
            }
    }
  }
}

TEST(Gather, MatchesReference) {
  Generator g(2);
  for (const Shape& xs : kShapes) {
    const int64_t nd = std::max<int64_t>(static_cast<int64_t>(xs.size()), 1);
    for (int64_t dim = -nd; dim < nd; ++dim) {
      const int64_t d = dim < 0 ? dim + nd : dim;
      const int64_t size = xs.empty() ? 1 : xs[d];
      for (DType t : kValueTypes)
        for (DType it : {kInt64, kInt32})
          for (Layout lx : kLayouts)
            for (Layout li : kLayouts) {
              Shape is = index_shape(xs, d, size == 0 ? 0 : 3);
              Tensor x = with_layout(random_values(xs, t, g), lx);
              Tensor index = with_layout(random_index(is, size, it, g), li);
              SCOPED_TRACE(fmt::format("x {} dim {} {} index {} {} {} {}", xs, dim, t, is, it,
                                       strata::testing::layout_name(lx), strata::testing::layout_name(li)));
              Tensor out = gather(x, dim, index);
              ASSERT_EQ(out.shape(), is);
              ASSERT_EQ(out.dtype(), t);
              std::vector<double> xv = values(x), want(static_cast<size_t>(numel_of(is)));
              std::vector<int64_t> iv = ints(index);
              for (size_t i = 0; i < want.size(); ++i) {
                auto idx = unravel(static_cast<int64_t>(i), is);
                if (!idx.empty()) idx[d] = iv[i];
                want[i] = xv[xs.empty() ? 0 : ravel(idx, xs)];
              }
              ASSERT_TRUE(all_close(out, want, 0, 0));
            }
    }
  }
}

// scatter (last write along the dim wins) and scatter_add (accumulates) with a src larger
// than the index and an index longer than self along the dim, so indices repeat.
TEST(Scatter, MatchesReference) {
  Generator g(3);
  for (const Shape& xs : kShapes) {
    const int64_t nd = std::max<int64_t>(static_cast<int64_t>(xs.size()), 1);
    for (int64_t dim = -nd; dim < nd; ++dim) {
      const int64_t d = dim < 0 ? dim + nd : dim;
      const int64_t size = xs.empty() ? 1 : xs[d];
      for (bool add : {false, true})
        for (DType t : kValueTypes)
          for (DType it : {kInt64, kInt32})
            for (Layout l : kLayouts) {
              if (add && t == kBool) continue;
              Shape is = index_shape(xs, d, size == 0 ? 0 : size + 2);
              Shape ss = is;
              for (auto& v : ss) v += 1;
              Tensor x = with_layout(random_values(xs, t, g), l);
              Tensor index = with_layout(random_index(is, size, it, g), l);
              Tensor src = with_layout(random_values(ss, t, g), l);
              SCOPED_TRACE(fmt::format("{} x {} dim {} {} index {} {} {}", add ? "scatter_add" : "scatter", xs, dim,
                                       t, is, it, strata::testing::layout_name(l)));
              std::vector<double> want = values(x), sv = values(src);
              std::vector<int64_t> iv = ints(index);
              for (int64_t i = 0; i < numel_of(is); ++i) {
                auto idx = unravel(i, is);
                auto dst = idx;
                if (!dst.empty()) dst[d] = iv[i];
                double v = sv[xs.empty() ? 0 : ravel(idx, ss)];
                double& w = want[xs.empty() ? 0 : ravel(dst, xs)];
                w = add ? w + v : v;
              }
              if (is_integral(t) && t == kUInt8)
                for (double& w : want) w = static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(w)));
              double tol = t == kFloat32 ? 1e-5 : t == kBFloat16 ? 0.1 : 1e-12;
              Tensor out = add ? scatter_add(x, dim, index, src) : scatter(x, dim, index, src);
              ASSERT_EQ(out.shape(), xs);
              ASSERT_EQ(out.dtype(), t);
              ASSERT_TRUE(all_close(out, want, 0, is_integral(t, true) ? 0 : tol));
              // in place on the strided tensor itself
              Tensor self = x.clone();
              Tensor strided = with_layout(self, l);
              if (add) scatter_add_(strided, dim, index, src);
              else scatter_(strided, dim, index, src);
              ASSERT_TRUE(all_close(strided, want, 0, is_integral(t, true) ? 0 : tol));
            }
    }
  }
}

TEST(Scatter, ScalarValue) {
  Generator g(4);
  for (DType t : {kFloat32, kInt64, kBool}) {
    Tensor x = random_values({4, 6}, t, g);
    Tensor index = from_vector<int64_t>({0, 5, 5, 2, 1, 3}, Shape{3, 2});
    Tensor out = scatter(x, 1, index, Scalar(1));
    std::vector<double> want = values(x);
    std::vector<int64_t> iv = ints(index);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 2; ++j) want[i * 6 + iv[i * 2 + j]] = 1;
    EXPECT_TRUE(all_close(out, want, 0, 0)) << fmt::format("{}", t);
  }
  // a source that aliases the destination reads the values from before the call
  Tensor x = arange(6, kFloat32).view({6});
  Tensor index = from_vector<int64_t>({5, 4, 3, 2, 1, 0});
  scatter_(x, 0, index, x);
  EXPECT_TRUE(all_close(x, {5, 4, 3, 2, 1, 0}, 0, 0));
}

TEST(IndexAdd, MatchesReference) {
  Generator g(5);
  for (const Shape& xs : kShapes) {
    const int64_t nd = std::max<int64_t>(static_cast<int64_t>(xs.size()), 1);
    for (int64_t dim = -nd; dim < nd; ++dim) {
      const int64_t d = dim < 0 ? dim + nd : dim;
      const int64_t size = xs.empty() ? 1 : xs[d];
      for (DType t : kAddTypes)
        for (DType it : {kInt64, kInt32})
          for (Layout l : kLayouts)
            for (int64_t n : {int64_t(0), int64_t(1), int64_t(9)}) {
              if (size == 0 && n != 0) continue;
              if (xs.empty() && n != 1) continue;
              Shape ss = xs;
              if (!ss.empty()) ss[d] = n;
              Tensor x = with_layout(random_values(xs, t, g), l);
              Tensor index = with_layout(random_index({n}, size, it, g), Layout::Sliced);
              if (xs.empty()) index = zeros({}, TensorOptions(it));
              Tensor src = with_layout(random_values(ss, t, g), l);
              Scalar alpha = is_floating(t) ? Scalar(0.5) : Scalar(3);
              SCOPED_TRACE(fmt::format("x {} dim {} {} n {} {} {}", xs, dim, t, n, it,
                                       strata::testing::layout_name(l)));
              std::vector<double> want = values(x), sv = values(src);
              std::vector<int64_t> iv = ints(index);
              for (int64_t i = 0; i < numel_of(ss); ++i) {
                auto idx = unravel(i, ss);
                if (!idx.empty()) idx[d] = iv[idx[d]];
                want[xs.empty() ? 0 : ravel(idx, xs)] += alpha.to_double() * sv[i];
              }
              Tensor out = index_add(x, dim, index, src, alpha);
              ASSERT_EQ(out.shape(), xs);
              ASSERT_TRUE(all_close(out, want, 0, is_integral(t) ? 0 : 1e-5));
              Tensor self = x.clone();
              index_add_(self, dim, index, src, alpha);
              ASSERT_TRUE(all_close(self, want, 0, is_integral(t) ? 0 : 1e-5));
            }
    }
  }
}

// Accumulation order is fixed (increasing along the dim), so float32 results equal a
// sequential float32 loop bit for bit, with any number of threads.
TEST(IndexAdd, DeterministicAcrossThreadCounts) {
  Generator g(6);
  const int64_t V = 100, D = 256, N = 5000;
  Tensor src = random_values({N, D}, kFloat32, g);
  Tensor index = random_index({N}, V, kInt64, g);
  std::vector<float> ref(V * D, 0.0f);
  const float* sp = src.data_ptr<float>();
  const int64_t* ip = index.data_ptr<int64_t>();
  for (int64_t j = 0; j < N; ++j)
    for (int64_t c = 0; c < D; ++c) ref[ip[j] * D + c] += sp[j * D + c];
  const int saved = get_num_threads();
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    Tensor out = index_add(zeros({V, D}), 0, index, src);
    const float* op = out.data_ptr<float>();
    ASSERT_TRUE(std::equal(ref.begin(), ref.end(), op)) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(ScatterAdd, DeterministicAcrossThreadCounts) {
  Generator g(7);
  const int64_t R = 64, C = 50, K = 4096;
  Tensor src = random_values({R, K}, kFloat32, g);
  Tensor index = random_index({R, K}, C, kInt64, g);
  std::vector<float> ref(R * C, 0.0f);
  const float* sp = src.data_ptr<float>();
  const int64_t* ip = index.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < K; ++k) ref[r * C + ip[r * K + k]] += sp[r * K + k];
  const int saved = get_num_threads();
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    Tensor out = scatter_add(zeros({R, C}), 1, index, src);
    ASSERT_TRUE(std::equal(ref.begin(), ref.end(), out.data_ptr<float>())) << threads << " threads";
    // the transposed problem walks the other loop order
    Tensor out_t = scatter_add(zeros({C, R}), 0, index.t(), src.t());
    ASSERT_TRUE(all_close(out_t.t(), std::vector<double>(ref.begin(), ref.end()), 0, 0)) << threads << " threads";
  }
  set_num_threads(saved);
}

TEST(OneHot, MatchesReference) {
  Generator g(8);
  for (DType it : {kInt64, kInt32})
    for (const Shape& s : {Shape{}, Shape{7}, Shape{3, 4}, Shape{0, 2}})
      for (int64_t classes : {int64_t(-1), int64_t(6)}) {
        if (classes < 0 && numel_of(s) == 0) continue;
        Tensor ix = with_layout(random_index(s, 6, it, g), Layout::Transposed);
        Tensor out = one_hot(ix, classes);
        std::vector<int64_t> iv = ints(ix);
        int64_t c = classes >= 0 ? classes : *std::max_element(iv.begin(), iv.end()) + 1;
        Shape want_shape = s;
        want_shape.push_back(c);
        ASSERT_EQ(out.shape(), want_shape);
        ASSERT_EQ(out.dtype(), kInt64);
        std::vector<double> want(static_cast<size_t>(numel_of(want_shape)), 0.0);
        for (size_t i = 0; i < iv.size(); ++i) want[i * c + iv[i]] = 1;
        ASSERT_TRUE(all_close(out, want, 0, 0)) << fmt::format("{} {}", s, it);
      }
}

TEST(Triangular, MatchesReference) {
  Generator g(9);
  for (const Shape& s : {Shape{4, 6}, Shape{5, 3}, Shape{2, 3, 4, 5}, Shape{3, 0, 2}, Shape{1, 1}})
    for (DType t : kValueTypes)
      for (Layout l : kLayouts)
        for (int64_t diag : {int64_t(-2), int64_t(-1), int64_t(0), int64_t(1), int64_t(3), int64_t(100)})
          for (bool upper : {false, true}) {
            Tensor x = with_layout(random_values(s, t, g), l);
            Tensor out = upper ? triu(x, diag) : tril(x, diag);
            ASSERT_EQ(out.shape(), s);
            ASSERT_EQ(out.dtype(), t);
            std::vector<double> want = values(x);
            const int64_t R = s[s.size() - 2], C = s.back();
            for (size_t i = 0; i < want.size(); ++i) {
              int64_t col = static_cast<int64_t>(i) % C, row = (static_cast<int64_t>(i) / C) % std::max<int64_t>(R, 1);
              bool keep = upper ? col - row >= diag : col - row <= diag;
              if (!keep) want[i] = 0;
            }
            ASSERT_TRUE(all_close(out, want, 0, 0)) << fmt::format("{} {} diag {} {}", s, t, diag, upper ? "triu" : "tril");
          }
}

TEST(IndexErrors, BadIndicesNameTheOpValueDimAndSize) {
  Tensor x = arange(20, kFloat32).view({4, 5});
  expect_error([&] { gather(x, 1, from_vector<int64_t>({0, 7}, Shape{1, 2})); }, {"[gather]", "7", "dim 1", "size 5"});
  expect_error([&] { gather(x, 1, from_vector<int64_t>({0, -1}, Shape{1, 2})); }, {"[gather]", "-1", "dim 1"});
  expect_error([&] { gather(x, -2, from_vector<int64_t>({4}, Shape{1, 1})); }, {"[gather]", "4", "dim 0", "size 4"});
  expect_error([&] { index_select(x, 0, from_vector<int64_t>({1, 4})); }, {"[index_select]", "4", "dim 0", "size 4"});
  expect_error([&] { index_select(x, 1, from_vector<int32_t>({-1})); }, {"[index_select]", "-1", "dim 1"});
  expect_error([&] { one_hot(from_vector<int64_t>({0, -2}), 3); }, {"[one_hot]", "-2"});
  expect_error([&] { one_hot(from_vector<int64_t>({0, 3}), 3); }, {"[one_hot]", "3"});
  // the out-of-place forms name themselves, not the in-place form they run
  Tensor bad = from_vector<int64_t>({5}), src = zeros({1});
  expect_error([&] { scatter(zeros({3}), 0, bad, src); }, {"[scatter]", "5"});
  expect_error([&] { scatter(zeros({3}), 0, bad, Scalar(1.0)); }, {"[scatter]", "5"});
  expect_error([&] { scatter_add(zeros({3}), 0, bad, src); }, {"[scatter_add]", "5"});
  expect_error([&] { index_add(zeros({3}), 0, bad, src); }, {"[index_add]", "5"});
  expect_error([&] { scatter_(x, 1, from_vector<int64_t>({9}, Shape{1, 1}), x); }, {"[scatter_]", "9"});
}

TEST(IndexErrors, HugeExpandedIndexIsCheckedByItsStoredValues) {
  // 2^40 positions that all hold one stored value: refused as fast as a one-element index
  const int64_t huge = int64_t(1) << 40;
  Tensor bad = from_vector<int64_t>({7}).expand({huge});
  expect_error([&] { index_select(zeros({3}), 0, bad); }, {"[index_select]", "7", "size 3"});
  Tensor wide = zeros({3, 1}).expand({3, huge});
  expect_error([&] { gather(wide, 0, from_vector<int64_t>({-4}, Shape{1, 1}).expand({2, huge})); }, {"[gather]", "-4"});
  // a broadcast row still has every stored value checked
  Tensor row = from_vector<int64_t>({0, 1, 2, 3}, Shape{1, 4}).expand({huge, 4});
  expect_error([&] { gather(zeros({1, 3}).expand({huge, 3}), 1, row); }, {"[gather]", "3", "size 3"});
}

TEST(IndexErrors, BadArguments) {
  Tensor x = arange(20, kFloat32).view({4, 5});
  Tensor i2 = zeros({2, 2}, TensorOptions(kInt64));
  Tensor i1 = zeros({2}, TensorOptions(kInt64));
  // index dtype
  for (DType bad : {kFloat32, kBool, kUInt8, kInt8}) {
    Tensor bi = zeros({2, 2}, TensorOptions(bad));
    EXPECT_THROW(gather(x, 0, bi), Error) << fmt::format("{}", bad);
    EXPECT_THROW(index_select(x, 0, bi.view({4})), Error) << fmt::format("{}", bad);
    EXPECT_THROW(scatter(x, 0, bi, x), Error) << fmt::format("{}", bad);
    EXPECT_THROW(scatter_add(x, 0, bi, x), Error) << fmt::format("{}", bad);
    EXPECT_THROW(index_add(x, 0, bi.view({4}), x), Error) << fmt::format("{}", bad);
    EXPECT_THROW(one_hot(bi), Error) << fmt::format("{}", bad);
  }
  EXPECT_THROW(gather(x, 0, Tensor()), Error);
  EXPECT_THROW(gather(Tensor(), 0, i2), Error);
  // dims
  EXPECT_THROW(gather(x, 2, i2), Error);
  EXPECT_THROW(gather(x, -3, i2), Error);
  EXPECT_THROW(index_select(x, 2, i1), Error);
  EXPECT_THROW(scatter(x, 5, i2, x), Error);
  EXPECT_THROW(index_add(x, -3, i1, zeros({2, 5})), Error);
  // ranks and shapes
  EXPECT_THROW(gather(x, 0, i1), Error);                                 // fewer dims
  EXPECT_THROW(gather(x, 0, zeros({1, 6}, TensorOptions(kInt64))), Error);  // larger in dim 1
  EXPECT_THROW(index_select(x, 0, i2), Error);                           // 2-d index
  EXPECT_THROW(scatter(x, 0, zeros({2, 2, 1}, TensorOptions(kInt64)), x), Error);
  EXPECT_THROW(scatter(x, 0, i2, zeros({1, 2})), Error);                 // index larger than src
  EXPECT_THROW(scatter(x, 0, zeros({2, 6}, TensorOptions(kInt64)), zeros({2, 6})), Error);  // larger than self
  EXPECT_THROW(scatter(x, 0, i2, zeros({2, 2}, TensorOptions(kFloat64))), Error);           // src dtype
  EXPECT_THROW(scatter_add(x, 0, i2, zeros({2, 2}, TensorOptions(kInt64))), Error);
  EXPECT_THROW(index_add(x, 0, i1, zeros({3, 5})), Error);               // src size along dim != index size
  EXPECT_THROW(index_add(x, 0, i1, zeros({2, 4})), Error);               // src size in another dim
  EXPECT_THROW(index_add(x, 0, i2, zeros({4, 5})), Error);               // 2-d index
  EXPECT_THROW(index_add(x, 0, i1, zeros({2, 5}, TensorOptions(kFloat64))), Error);
  EXPECT_THROW(index_add(zeros({4, 5}, TensorOptions(kInt64)), 0, i1, zeros({2, 5}, TensorOptions(kInt64)), 0.5),
               Error);  // float alpha for an integer tensor
  EXPECT_THROW(index_select(full({}, 1.0), 0, zeros({2}, TensorOptions(kInt64))), Error);  // 0-d input
  // one_hot
  EXPECT_THROW(one_hot(zeros({0}, TensorOptions(kInt64))), Error);  // cannot infer classes
  EXPECT_THROW(one_hot(i1, -2), Error);
  // tril / triu need matrices
  EXPECT_THROW(tril(arange(4, kFloat32)), Error);
  EXPECT_THROW(triu(full({}, 1.0)), Error);
  EXPECT_THROW(tril(Tensor()), Error);
}

TEST(IndexErrors, FailedInPlaceWritesNothing) {
  Generator g(10);
  Tensor base = random_values({6, 8}, kFloat32, g);
  // the one bad index comes last, after many valid ones
  std::vector<int64_t> iv(6 * 8, 1);
  iv.back() = 8;
  Tensor bad = from_vector(iv, Shape{6, 8});
  Tensor src = random_values({6, 8}, kFloat32, g);
  std::vector<double> before = values(base);
  Tensor self = base.clone();
  EXPECT_THROW(scatter_(self, 1, bad, src), Error);
  EXPECT_TRUE(all_close(self, before, 0, 0));
  EXPECT_THROW(scatter_(self, 1, bad, Scalar(3.0)), Error);
  EXPECT_TRUE(all_close(self, before, 0, 0));
  EXPECT_THROW(scatter_add_(self, 1, bad, src), Error);
  EXPECT_TRUE(all_close(self, before, 0, 0));
  iv = {0, 1, 2, 3, 4, 5, 6, -1};
  EXPECT_THROW(index_add_(self, 1, from_vector(iv), src), Error);
  EXPECT_TRUE(all_close(self, before, 0, 0));
  // a destination whose elements share memory is refused before any write
  Tensor expanded = zeros({1, 8}).expand({6, 8});
  EXPECT_THROW(scatter_add_(expanded, 1, zeros({6, 8}, TensorOptions(kInt64)), src), Error);
  EXPECT_TRUE(all_close(expanded, std::vector<double>(48, 0.0), 0, 0));
}
