// CUDA indexing, ordering, triangular-mask and dropout kernels against the CPU kernels on
// fresh random inputs: index_select, gather, scatter (both write orders), scatter_add and
// index_add (atomic and deterministic), tril / triu, sort and topk (NaN, -0.0 and ties, both
// CUB paths and the block top-k), dropout's mask bit for bit, every dtype the CPU registers,
// odd sizes, non-contiguous views, bad indices raising Error with nothing written, and the
// composite ops built on them (embedding, one_hot, cat, stack, split, masked_fill, nonzero,
// masked_select, repeat, flip, roll, randperm and the rest of src/ops/select.cpp,
// rearrange.cpp and combinations.cpp). The sort
// key order is checked on the CPU, so it runs without a GPU; everything else is skipped there.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include <strata/kernels/common/sort_key.h>

#include "cuda/cuda_testing.h"
#include "testing.h"

namespace st = strata;
namespace F = strata::nn::functional;
using st::DType;
using st::Tensor;
using st::cuda_testing::gpu;
using st::cuda_testing::host;
using st::cuda_testing::random;
using st::cuda_testing::rng;

namespace {

const std::vector<DType> kAll = {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16, st::kInt64,
                                 st::kInt32,   st::kInt8,    st::kUInt8,   st::kBool};
const std::vector<DType> kFloat = {st::kFloat32, st::kFloat64, st::kFloat16, st::kBFloat16};
const std::vector<DType> kIndex = {st::kInt64, st::kInt32};

std::string tag(const std::string& what, DType dt) { return what + " " + std::string(st::dtype_name(dt)); }

// Exact equality (NaN equal to NaN, the sign of zero compared too) or, with rel > 0, closeness
// relative to max(1, |cpu value|): cuda_testing::expect_close.
void expect_same(const Tensor& cpu, const Tensor& cuda, const std::string& what, double rel = 0, double atol = 0) {
  st::cuda_testing::expect_close(cpu, cuda, what, rel, atol);
}

// Tolerance of an add whose order differs from the CPU's (atomics).
double add_tol(DType dt) {
  switch (dt) {
    case DType::Float64: return 1e-12;
    case DType::Float32: return 1e-5;
    case DType::Float16: return 1e-2;
    case DType::BFloat16: return 6e-2;
    default: return 0;
  }
}

// Index values uniform in [0, size), repeats likely.
Tensor random_index(const st::Shape& shape, int64_t size, DType dt) {
  Tensor t = st::empty(shape, st::kInt64);
  std::uniform_int_distribution<int64_t> u(0, size - 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_ptr<int64_t>()[i] = u(rng());
  return t.to(dt);
}

// Values for ordering tests: few distinct values (ties), and for floats NaN, +-inf and -0.0.
Tensor ordering_values(const st::Shape& shape, DType dt) {
  Tensor t = st::empty(shape, st::kFloat64);
  std::uniform_int_distribution<int> u(-6, 6), special(0, 15);
  const double kSpecial[] = {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(), -0.0, 0.0};
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = u(rng());
    if (st::is_floating(dt)) {
      v *= 0.25;
      const int s = special(rng());
      if (s < 5) v = kSpecial[s];
    } else if (dt == st::kUInt8) {
      v = v + 6;
    } else if (dt == st::kBool) {
      v = v > 0;
    }
    t.data_ptr<double>()[i] = v;
  }
  return t.to(dt);
}

// Runs f and checks that it raises an Error naming `op` and the bad value.
template <class Fn>
void expect_index_error(Fn f, const std::string& op, int64_t bad, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const st::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[" + op), std::string::npos) << what << ": " << msg;
    EXPECT_NE(msg.find("index " + std::to_string(bad) + " is out of range"), std::string::npos) << what << ": " << msg;
  }
}

struct DeterministicGuard {
  bool before = st::cuda::deterministic();
  explicit DeterministicGuard(bool on) { st::cuda::set_deterministic(on); }
  ~DeterministicGuard() { st::cuda::set_deterministic(before); }
};

}  // namespace

// ---- the sort key (no GPU needed) ----

namespace {

// The CPU sort's order (kernels/cpu/sort.h, less_nan_last): NaN above everything.
template <class C>
bool cpu_less(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

template <class T>
void check_key_order(const std::vector<T>& values, const std::string& what) {
  using C = st::compute_t<T>;
  for (const T& a : values) {
    for (const T& b : values) {
      const auto ka = st::sort_key::order_key(a), kb = st::sort_key::order_key(b);
      const bool lt = cpu_less(static_cast<C>(a), static_cast<C>(b));
      const bool gt = cpu_less(static_cast<C>(b), static_cast<C>(a));
      ASSERT_EQ(ka < kb, lt) << what << ": " << double(static_cast<C>(a)) << " vs " << double(static_cast<C>(b));
      ASSERT_EQ(ka == kb, !lt && !gt) << what << ": " << double(static_cast<C>(a)) << " vs "
                                      << double(static_cast<C>(b));
      const auto da = st::sort_key::sort_key(a, true), db = st::sort_key::sort_key(b, true);
      ASSERT_EQ(da < db, gt) << what << " descending";
    }
  }
}

template <class T>
std::vector<T> float_specials() {
  using C = st::compute_t<T>;
  const C inf = std::numeric_limits<C>::infinity(), nan = std::numeric_limits<C>::quiet_NaN();
  std::vector<C> c = {nan, -nan, inf, -inf, C(0), -C(0), C(1), C(-1), C(0.5), C(-0.5), C(3.25), C(-3.25),
                      C(1e-3), C(-1e-3), C(65504), C(-65504)};
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    c.push_back(std::numeric_limits<C>::denorm_min());
    c.push_back(-std::numeric_limits<C>::denorm_min());
    c.push_back(std::numeric_limits<C>::max());
    c.push_back(std::numeric_limits<C>::lowest());
  } else {
    c.push_back(static_cast<C>(T::from_bits(0x0001)));  // the smallest subnormal
    c.push_back(static_cast<C>(T::from_bits(0x8001)));
    c.push_back(static_cast<C>(T::from_bits(0x7fff)));  // NaNs with other payloads
    c.push_back(static_cast<C>(T::from_bits(0xffff)));
  }
  std::vector<T> out;
  for (C v : c) out.push_back(static_cast<T>(v));
  return out;
}

template <class T>
std::vector<T> int_specials() {
  std::vector<T> v = {T(0), T(1), T(2), std::numeric_limits<T>::max(), std::numeric_limits<T>::min(),
                      T(std::numeric_limits<T>::max() - 1)};
  if constexpr (std::is_signed_v<T>) {
    v.push_back(T(-1));
    v.push_back(T(-2));
    v.push_back(T(std::numeric_limits<T>::min() + 1));
  }
  return v;
}

}  // namespace

TEST(CudaSortKey, OrderMatchesCpuSort) {
  check_key_order(float_specials<float>(), "float32");
  check_key_order(float_specials<double>(), "float64");
  check_key_order(float_specials<st::Half>(), "float16");
  check_key_order(float_specials<st::BFloat16>(), "bfloat16");
  check_key_order(int_specials<int64_t>(), "int64");
  check_key_order(int_specials<int32_t>(), "int32");
  check_key_order(int_specials<int8_t>(), "int8");
  check_key_order(int_specials<uint8_t>(), "uint8");
  check_key_order(std::vector<bool>{false, true}, "bool");
}

// A stable sort of the keys gives the CPU kernel's permutation, ties and NaNs included.
TEST(CudaSortKey, StableKeySortIsTheCpuSort) {
  SEED_TRACE();
  for (bool descending : {false, true}) {
    Tensor x = ordering_values({2000}, st::kFloat32);
    auto [values, indices] = st::sort(x, 0, descending);
    const float* p = x.data_ptr<float>();
    std::vector<int64_t> perm(2000);
    std::iota(perm.begin(), perm.end(), 0);
    std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
      return st::sort_key::sort_key(p[a], descending) < st::sort_key::sort_key(p[b], descending);
    });
    for (int64_t i = 0; i < 2000; ++i) ASSERT_EQ(indices.data_ptr<int64_t>()[i], perm[i]) << "at " << i;
  }
}

// ---- gather and index_select ----

TEST(CudaIndex, IndexSelect) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kAll) {
    for (DType it : kIndex) {
      Tensor x = random({7, 13, 5}, dt, -3, 3);
      Tensor gx = gpu(x);
      for (int64_t dim : {0, 1, 2, -1}) {
        const int64_t size = x.size(dim);
        Tensor idx = random_index({11}, size, it);
        const std::string what = tag("index_select dim " + std::to_string(dim), dt);
        expect_same(st::index_select(x, dim, idx), st::index_select(gx, dim, gpu(idx)), what);
        // non-contiguous input and index
        Tensor xt = x.transpose(0, 2), gxt = gx.transpose(0, 2);
        Tensor long_idx = random_index({22}, xt.size(dim), it);
        Tensor sliced = long_idx.slice(0, 1, 22, 2), gsliced = gpu(long_idx).slice(0, 1, 22, 2);
        expect_same(st::index_select(xt, dim, sliced), st::index_select(gxt, dim, gsliced), what + " strided");
      }
      Tensor scalar = random_index({}, 13, it);  // 0-d index
      expect_same(st::index_select(x, 1, scalar), st::index_select(gx, 1, gpu(scalar)), tag("index_select 0-d", dt));
      Tensor none = st::empty({0}, it);
      expect_same(st::index_select(x, 1, none), st::index_select(gx, 1, gpu(none)), tag("index_select empty", dt));
    }
  }
  // a long gather of rows (embedding-sized)
  Tensor w = random({1000, 129}, st::kFloat32);
  Tensor idx = random_index({4097}, 1000, st::kInt64);
  expect_same(st::index_select(w, 0, idx), st::index_select(gpu(w), 0, gpu(idx)), "index_select rows");
}

TEST(CudaIndex, Gather) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kAll) {
    for (DType it : kIndex) {
      Tensor x = random({9, 7, 5}, dt, -3, 3);
      Tensor gx = gpu(x);
      for (int64_t dim : {0, 1, 2}) {
        st::Shape shape = {4, 6, 3};
        shape[dim] = 11;  // longer than x along dim, smaller elsewhere
        Tensor idx = random_index(shape, x.size(dim), it);
        const std::string what = tag("gather dim " + std::to_string(dim), dt);
        expect_same(st::gather(x, dim, idx), st::gather(gx, dim, gpu(idx)), what);
        // a transposed input with a transposed index
        Tensor xt = x.transpose(0, 2), gxt = gx.transpose(0, 2);  // (5, 7, 9)
        st::Shape ts = {3, 6, 4};
        ts[dim] = 11;
        Tensor idx_c = random_index({ts[2], ts[1], ts[0]}, xt.size(dim), it);
        expect_same(st::gather(xt, dim, idx_c.transpose(0, 2)), st::gather(gxt, dim, gpu(idx_c).transpose(0, 2)),
                    what + " transposed");
      }
    }
  }
}

// ---- scatter, scatter_add, index_add ----

TEST(CudaIndex, ScatterLastWriteWins) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kAll) {
    for (DType it : kIndex) {
      // rows walked per thread (short dim), and sorted writes (a long dim with few rows)
      for (auto [self_shape, index_shape, dim] :
           {std::tuple<st::Shape, st::Shape, int64_t>{{6, 9, 5}, {4, 9, 3}, 0},
            {{6, 9, 5}, {5, 20, 4}, 1},
            {{50, 3}, {400, 3}, 0},
            {{3, 1000}, {2, 5000}, 1}}) {
        Tensor self = random(self_shape, dt, -3, 3);
        st::Shape src_shape = index_shape;
        for (auto& s : src_shape) s += 1;  // src larger than the index
        Tensor src = random(src_shape, dt, -3, 3);
        Tensor idx = random_index(index_shape, self.size(dim), it);
        const std::string what = tag("scatter " + std::to_string(index_shape[dim]), dt);
        expect_same(st::scatter(self, dim, idx, src), st::scatter(gpu(self), dim, gpu(idx), gpu(src)), what);
        expect_same(st::scatter(self, dim, idx, st::Scalar(1)), st::scatter(gpu(self), dim, gpu(idx), st::Scalar(1)),
                    what + " value");
        // into a non-contiguous self, from a transposed src
        Tensor cs = self.transpose(0, 1).contiguous().transpose(0, 1);
        Tensor gs = gpu(self.transpose(0, 1).contiguous()).transpose(0, 1);
        Tensor srct = src.transpose(0, 1).contiguous().transpose(0, 1);
        Tensor gsrct = gpu(src.transpose(0, 1).contiguous()).transpose(0, 1);
        st::scatter_(cs, dim, idx, srct);
        st::scatter_(gs, dim, gpu(idx), gsrct);
        expect_same(cs, gs, what + " strided");
      }
    }
  }
}

TEST(CudaIndex, ScatterAddIndexAdd) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (bool deterministic : {false, true}) {
    DeterministicGuard mode(deterministic);
    for (DType dt : kAll) {
      // deterministic adds follow the CPU's order exactly; atomic ones only to rounding, which
      // follows the size of the partial sums (up to about 3 + 5 * 6 here), not of the result:
      // a sum that cancels to near 0 can be off by several ulps of its partial sums
      const double tol = deterministic ? 0 : add_tol(dt);
      const double atol = deterministic ? 0 : 8 * add_tol(dt);
      const std::string mode_name = deterministic ? " deterministic" : " atomic";
      for (DType it : kIndex) {
        Tensor self = random({6, 9, 5}, dt, -3, 3);
        Tensor src = random({30, 10, 6}, dt, -3, 3);
        Tensor idx = random_index({30, 9, 5}, 6, it);  // many repeats along dim 0
        expect_same(st::scatter_add(self, 0, idx, src), st::scatter_add(gpu(self), 0, gpu(idx), gpu(src)),
                    tag("scatter_add", dt) + mode_name, tol, atol);
        Tensor rows = random_index({41}, 9, it);
        Tensor add = random({6, 41, 5}, dt, -3, 3);
        expect_same(st::index_add(self, 1, rows, add), st::index_add(gpu(self), 1, gpu(rows), gpu(add)),
                    tag("index_add", dt) + mode_name, tol, atol);
        // alpha (a whole number, so integer dtypes take it) on a transposed self
        const st::Scalar alpha = dt == st::kBool ? st::Scalar(true) : st::Scalar(2);
        Tensor selft = self.transpose(0, 2), gselft = gpu(self).transpose(0, 2);
        Tensor add_t = random({5, 41, 6}, dt, -3, 3);
        expect_same(st::index_add(selft, 1, rows, add_t, alpha), st::index_add(gselft, 1, gpu(rows), gpu(add_t), alpha),
                    tag("index_add alpha transposed", dt) + mode_name, add_tol(dt), atol);
      }
    }
  }
  // a fractional alpha and one add per element (no order to differ in): the 16-bit result is
  // cur + alpha * src in float rounded once, as on the CPU. Whether a compiler contracts that
  // into an FMA may still move a result that lies on a rounding boundary by one ulp (rare);
  // rounding alpha * src to 16 bits first moved a large share of them.
  for (DType dt : {st::kFloat16, st::kBFloat16}) {
    Tensor self = random({7, 3000}, dt, -3, 3), src = random({7, 3000}, dt, -3, 3);
    Tensor rows = st::arange(6, -1, -1, st::TensorOptions(st::kInt64));
    const std::vector<double> want = st::testing::values(st::index_add(self, 0, rows, src, 0.3));
    const std::vector<double> got = st::testing::values(st::index_add(gpu(self), 0, gpu(rows), gpu(src), 0.3));
    const double ulp = dt == st::kFloat16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    size_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_LE(std::fabs(got[i] - want[i]), ulp * std::fabs(want[i]) + 1e-30) << tag("index_add alpha 0.3", dt) << i;
      differ += got[i] != want[i];
    }
    EXPECT_LE(differ, want.size() / 200) << tag("index_add alpha 0.3", dt);
  }
  // deterministic mode gives one result on every run
  DeterministicGuard mode(true);
  Tensor self = st::zeros({17, 33}, st::TensorOptions(st::kFloat32).device(st::Device::cuda()));
  Tensor src = gpu(random({5000, 33}, st::kFloat32));
  Tensor idx = gpu(random_index({5000}, 17, st::kInt64));
  Tensor first = host(st::index_add(self, 0, idx, src));
  for (int run = 0; run < 3; ++run) expect_same(first.to(st::Device::cuda()), st::index_add(self, 0, idx, src), "rerun");
}

TEST(CudaIndex, BadIndicesRaiseAndWriteNothing) {
  SKIP_WITHOUT_GPU();
  for (DType it : kIndex) {
    for (int64_t bad : {int64_t(17), int64_t(-3)}) {
      Tensor self = gpu(random({5, 4}, st::kFloat32));
      Tensor before = host(self);
      Tensor idx_h = random_index({3, 4}, 5, st::kInt64);
      idx_h.data_ptr<int64_t>()[7] = bad;
      Tensor idx = gpu(idx_h.to(it));
      Tensor row_h = random_index({6}, 5, st::kInt64);
      row_h.data_ptr<int64_t>()[4] = bad;
      Tensor rows = gpu(row_h.to(it));
      Tensor src = gpu(random({6, 4}, st::kFloat32));
      const std::string what = "index " + std::to_string(bad) + " " + std::string(st::dtype_name(it));
      expect_index_error([&] { st::index_select(self, 0, rows); }, "index_select", bad, what);
      expect_index_error([&] { st::gather(self, 0, idx); }, "gather", bad, what);
      expect_index_error([&] { st::scatter_(self, 0, idx, src); }, "scatter", bad, what);
      expect_index_error([&] { st::scatter_(self, 0, idx, st::Scalar(7)); }, "scatter", bad, what);
      expect_index_error([&] { st::scatter_add_(self, 0, idx, src); }, "scatter_add", bad, what);
      expect_index_error([&] { st::index_add_(self, 0, rows, src); }, "index_add", bad, what);
      expect_index_error([&] { F::embedding(rows, self); }, "", bad, what);
      expect_same(before, self, what + ": self unchanged");
    }
  }
}

// ---- tril / triu ----

TEST(CudaIndex, TrilTriu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kAll) {
    for (st::Shape shape : {st::Shape{5, 7}, st::Shape{3, 4, 6}, st::Shape{2, 3, 33, 31}, st::Shape{1, 1}}) {
      Tensor x = random(shape, dt, -3, 3);
      Tensor gx = gpu(x);
      for (int64_t diagonal : {-100, -2, 0, 1, 3, 100}) {
        const std::string what = tag("diagonal " + std::to_string(diagonal), dt);
        expect_same(st::tril(x, diagonal), st::tril(gx, diagonal), "tril " + what);
        expect_same(st::triu(x, diagonal), st::triu(gx, diagonal), "triu " + what);
        expect_same(st::tril(x.transpose(-1, -2), diagonal), st::tril(gx.transpose(-1, -2), diagonal),
                    "tril transposed " + what);
        expect_same(st::triu(x.slice(-1, 0, x.size(-1), 2), diagonal),
                    st::triu(gx.slice(-1, 0, x.size(-1), 2), diagonal), "triu sliced " + what);
      }
    }
  }
}

// ---- sort and topk ----

TEST(CudaIndex, Sort) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  // segmented sort (many slices), one long slice, a few long slices, odd sizes
  const std::vector<std::pair<st::Shape, int64_t>> cases = {
      {{1}, 0}, {{1000}, 0}, {{7, 33}, 1}, {{33, 7}, 0}, {{3000, 50}, 1}, {{100003}, 0}, {{2, 70001}, 1}};
  for (DType dt : kAll) {
    for (const auto& [shape, dim] : cases) {
      Tensor x = ordering_values(shape, dt);
      Tensor gx = gpu(x);
      for (bool descending : {false, true}) {
        const std::string what = tag("sort " + std::to_string(x.numel()) + (descending ? " desc" : " asc"), dt);
        auto [cv, ci] = st::sort(x, dim, descending);
        auto [gv, gi] = st::sort(gx, dim, descending);
        expect_same(cv, gv, what + " values");
        expect_same(ci, gi, what + " indices");
      }
    }
    // a transposed input, sorted along its non-contiguous dim
    Tensor m = ordering_values({31, 45}, dt);
    auto [cv, ci] = st::sort(m.t(), 1, true);
    auto [gv, gi] = st::sort(gpu(m).t(), 1, true);
    expect_same(cv, gv, tag("sort transposed values", dt));
    expect_same(ci, gi, tag("sort transposed indices", dt));
  }
}

TEST(CudaIndex, Topk) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kAll) {
    for (st::Shape shape : {st::Shape{300}, st::Shape{5, 300}, st::Shape{64, 1000}, st::Shape{3, 70001}}) {
      Tensor x = ordering_values(shape, dt);
      Tensor gx = gpu(x);
      const int64_t n = x.size(-1);
      for (int64_t k : {int64_t(1), int64_t(5), int64_t(16), int64_t(17), int64_t(40), n}) {
        for (bool largest : {true, false}) {
          const std::string what =
              tag("topk k=" + std::to_string(k) + " n=" + std::to_string(n) + (largest ? " largest" : " smallest"), dt);
          auto [cv, ci] = st::topk(x, k, -1, largest);
          auto [gv, gi] = st::topk(gx, k, -1, largest);
          expect_same(cv, gv, what + " values");
          expect_same(ci, gi, what + " indices");
        }
      }
      // along dim 0 of a transposed view
      Tensor xt = x.dim() == 2 ? x.t() : x, gxt = x.dim() == 2 ? gx.t() : gx;
      auto [cv, ci] = st::topk(xt, 3, 0, true);
      auto [gv, gi] = st::topk(gxt, 3, 0, true);
      expect_same(cv, gv, tag("topk dim 0 values", dt));
      expect_same(ci, gi, tag("topk dim 0 indices", dt));
    }
  }
}

// ---- dropout ----

// The same generator state gives the CPU's mask bit for bit: with x = 1 the output is the
// mask itself (0 or 1 / (1 - p)), and for random x the products match exactly too.
TEST(CudaIndex, DropoutMaskMatchesCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kFloat) {
    for (int64_t n : {1, 3, 7, 1023, 65537}) {
      for (double p : {0.1, 0.5, 0.9}) {
        const uint64_t seed = 77 + n;
        st::Generator g1(seed), g2(seed);
        Tensor ones = st::ones({n}, st::TensorOptions(dt));
        const std::string what = tag("dropout n=" + std::to_string(n) + " p=" + std::to_string(p), dt);
        expect_same(F::dropout(ones, p, true, &g1), F::dropout(gpu(ones), p, true, &g2), what + " mask");
        Tensor x = random({n}, dt, -3, 3);
        expect_same(F::dropout(x, p, true, &g1), F::dropout(gpu(x), p, true, &g2), what + " output");
        Tensor m = random({n, 3}, dt, -3, 3);  // a non-contiguous input
        expect_same(F::dropout(m.t(), p, true, &g1), F::dropout(gpu(m).t(), p, true, &g2), what + " transposed");
      }
    }
  }
}

// ---- ops composed of these kernels ----

TEST(CudaIndex, ComposedOps) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  // embedding forward (index_select) and backward (index_add), with a padding index
  for (DType dt : {st::kFloat32, st::kFloat64}) {
    Tensor w = random({50, 17}, dt);
    Tensor gw = gpu(w);
    w.requires_grad_();
    gw.requires_grad_();
    Tensor ids = random_index({4, 33}, 50, st::kInt64);
    Tensor out = F::embedding(ids, w, 3), gout = F::embedding(gpu(ids), gw, 3);
    expect_same(out, gout, tag("embedding", dt));
    Tensor g = random(out.shape(), dt);
    out.backward(g);
    gout.backward(gpu(g));
    expect_same(w.grad(), gw.grad(), tag("embedding grad", dt), add_tol(dt));
  }
  Tensor classes = random_index({7, 5}, 9, st::kInt64);
  expect_same(st::one_hot(classes, 9), st::one_hot(gpu(classes), 9), "one_hot");
  expect_same(st::one_hot(classes), st::one_hot(gpu(classes)), "one_hot inferred");
  for (DType dt : kAll) {
    Tensor a = random({3, 5}, dt), b = random({4, 5}, dt), c = random({3, 5}, dt);
    expect_same(st::cat({a, b}, 0), st::cat({gpu(a), gpu(b)}, 0), tag("cat", dt));
    expect_same(st::cat({a.t(), c.t()}, 1), st::cat({gpu(a).t(), gpu(c).t()}, 1), tag("cat transposed", dt));
    expect_same(st::stack({a, c}, 1), st::stack({gpu(a), gpu(c)}, 1), tag("stack", dt));
    auto parts = st::split(b, 3, 0);
    auto gparts = st::split(gpu(b), 3, 0);
    ASSERT_EQ(parts.size(), gparts.size());
    for (size_t i = 0; i < parts.size(); ++i) expect_same(parts[i].contiguous(), gparts[i].contiguous(), tag("split", dt));
    Tensor mask = random({3, 5}, st::kBool);
    expect_same(st::masked_fill(a, mask, 1), st::masked_fill(gpu(a), gpu(mask), 1), tag("masked_fill", dt));
  }
}

// ---- past 2^31 elements ----

// 64-bit offsets: a gather whose output has more than 2^31 elements, and tril over a matrix
// of more than 2^31 elements (uint8 keeps this near 7 GB).
// The ops composed from others (src/ops/select.cpp, rearrange.cpp, combinations.cpp) run on
// the device and give the CPU's results; randperm's permutation is the CPU's for the same seed.
TEST(CudaIndex, ComposedSelectionsAndRearrangements) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : kAll) {
    Tensor x = random({5, 7, 3}, dt, -2, 2);
    if (dt != st::kBool) x = x * (random({5, 7, 3}, st::kFloat32, 0, 1) > 0.5).to(dt);  // zeros to skip
    Tensor gx = gpu(x);
    expect_same(st::nonzero(x), st::nonzero(gx), tag("nonzero", dt));
    expect_same(st::nonzero(x.transpose(0, 2)), st::nonzero(gx.transpose(0, 2)), tag("nonzero transposed", dt));
    const Tensor mask = random({7, 1}, st::kFloat32, 0, 1) > 0.3;
    expect_same(st::masked_select(x, mask), st::masked_select(gx, gpu(mask)), tag("masked_select", dt));
    expect_same(st::any(x, 1), st::any(gx, 1), tag("any", dt));
    expect_same(st::all(x, 2, true), st::all(gx, 2, true), tag("all", dt));
    expect_same(st::repeat(x, {2, 1, 3}), st::repeat(gx, {2, 1, 3}), tag("repeat", dt));
    expect_same(st::repeat_interleave(x, 3, 1), st::repeat_interleave(gx, 3, 1), tag("repeat_interleave", dt));
    expect_same(st::flip(x, {0, 2}), st::flip(gx, {0, 2}), tag("flip", dt));
    expect_same(st::roll(x, {2, -5}, {0, 1}), st::roll(gx, {2, -5}, {0, 1}), tag("roll", dt));
  }
  for (DType dt : kFloat) {
    Tensor v = random({64}, dt, -3, 3);
    v = st::where(random({64}, st::kFloat32, 0, 1) > 0.8, std::numeric_limits<double>::infinity(), v);
    v = st::where(random({64}, st::kFloat32, 0, 1) > 0.8, std::nan(""), v);
    expect_same(st::isnan(v), st::isnan(gpu(v)), tag("isnan", dt));
    expect_same(st::isfinite(v), st::isfinite(gpu(v)), tag("isfinite", dt));
    expect_same(st::nan_to_num(v), st::nan_to_num(gpu(v)), tag("nan_to_num", dt));
    const Tensor end = random({64}, dt, -3, 3);
    expect_same(st::lerp(v, end, 0.3), st::lerp(gpu(v), gpu(end), 0.3), tag("lerp", dt));
  }
  st::Generator a(9), b(9);
  expect_same(st::randperm(1000, st::kInt64, &a),
              st::randperm(1000, st::TensorOptions(st::kInt64).device(st::Device::cuda()), &b), "randperm");
  // masked_select's gradient on the device
  Tensor w = random({4, 6}, st::kFloat64, -1, 1), gw = gpu(w);
  w.requires_grad_(), gw.requires_grad_();
  const Tensor keep = random({4, 6}, st::kFloat32, 0, 1) > 0.5;
  (st::masked_select(w, keep) * 3).sum().backward();
  (st::masked_select(gw, gpu(keep)) * 3).sum().backward();
  expect_same(w.grad(), gw.grad(), "masked_select backward");
}

// The statistics and advanced-indexing ops (src/ops/statistics.cpp, unique.cpp,
// advanced_index.cpp, diagonal.cpp) give the CPU's results and gradients on the device.
TEST(CudaIndex, StatisticsAndAdvancedIndexingMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (DType dt : {st::kFloat32, st::kFloat64, st::kInt64, st::kInt32}) {
    const Tensor raw = ordering_values({6, 9}, dt);
    const Tensor x = st::where(st::eq(raw, 0), 0, raw);  // -0.0 and 0.0 would be one value of either sign
    const Tensor gx = gpu(x);
    const st::MedianResult m = st::median(x, 1), gm = st::median(gx, 1);
    expect_same(m.values, gm.values, tag("median", dt));
    expect_same(m.indices, gm.indices, tag("median indices", dt));
    const st::MedianResult n = st::nanmedian(x.t(), 1, true), gn = st::nanmedian(gx.t(), 1, true);
    expect_same(n.values, gn.values, tag("nanmedian", dt));
    expect_same(n.indices, gn.indices, tag("nanmedian indices", dt));
    expect_same(st::median(x), st::median(gx), tag("median of all", dt));
    const st::UniqueResult u = st::unique(x, true, true, true), gu = st::unique(gx, true, true, true);
    expect_same(u.values, gu.values, tag("unique", dt));
    expect_same(u.inverse, gu.inverse, tag("unique inverse", dt));
    expect_same(u.counts, gu.counts, tag("unique counts", dt));
    const Tensor rows = st::clamp(x, -1, 1);  // repeated rows likely
    const st::UniqueResult ud = st::unique(rows, true, true, true, 1);
    const st::UniqueResult gud = st::unique(gpu(rows), true, true, true, 1);
    expect_same(ud.values, gud.values, tag("unique dim", dt));
    expect_same(ud.inverse, gud.inverse, tag("unique dim inverse", dt));
    const st::UniqueResult c = st::unique_consecutive(rows, true, true);
    const st::UniqueResult gc = st::unique_consecutive(gpu(rows), true, true);
    expect_same(c.values, gc.values, tag("unique_consecutive", dt));
    expect_same(c.counts, gc.counts, tag("unique_consecutive counts", dt));
    const Tensor sorted = std::get<0>(st::sort(x.flatten())), probes = ordering_values({4, 5}, dt);
    expect_same(st::searchsorted(sorted, probes), st::searchsorted(gpu(sorted), gpu(probes)), tag("searchsorted", dt));
    expect_same(st::bucketize(probes, sorted, true), st::bucketize(gpu(probes), gpu(sorted), true),
                tag("bucketize", dt));
    const Tensor i = random_index({4, 2}, 6, st::kInt64), j = random_index({2}, 9, st::kInt32);
    expect_same(st::index(x, {i, j}), st::index(gx, {gpu(i), gpu(j)}), tag("index", dt));
    const Tensor mask = random({6, 9}, st::kFloat32, 0, 1) > 0.5;
    expect_same(st::index(x, {mask}), st::index(gx, {gpu(mask)}), tag("index mask", dt));
    const Tensor v = random({4, 2}, dt, -3, 3);
    expect_same(st::index_put(x, {i, j}, v), st::index_put(gx, {gpu(i), gpu(j)}, gpu(v)), tag("index_put", dt));
    expect_same(st::index_put(x, {i, j}, v, true), st::index_put(gx, {gpu(i), gpu(j)}, gpu(v), true),
                tag("index_put accumulate", dt), add_tol(dt));
    expect_same(st::diagonal(x, 2), st::diagonal(gx, 2), tag("diagonal", dt));
    expect_same(st::diag(x.t(), -1), st::diag(gx.t(), -1), tag("diag", dt));
    expect_same(st::trace(x), st::trace(gx), tag("trace", dt));
  }
  for (DType dt : {st::kFloat32, st::kFloat64}) {
    const Tensor x = ordering_values({5, 8}, dt), gx = gpu(x);
    const Tensor q = random({3}, dt, 0, 1);
    const double rel = dt == st::kFloat32 ? 1e-6 : 1e-12;
    for (const char* mode : {"linear", "lower", "higher", "midpoint", "nearest"}) {
      expect_same(st::quantile(x, q, 1, false, mode), st::quantile(gx, gpu(q), 1, false, mode),
                  tag(std::string("quantile ") + mode, dt), rel);
      expect_same(st::nanquantile(x, 0.3, std::nullopt, true, mode),
                  st::nanquantile(gx, 0.3, std::nullopt, true, mode), tag(std::string("nanquantile ") + mode, dt),
                  rel);
    }
  }
  // gradients through median, quantile, index, index_put and diag on the device
  Tensor w = random({5, 6}, st::kFloat64, -1, 1), gw = gpu(w), v = random({3}, st::kFloat64), gv = gpu(v);
  for (Tensor* t : {&w, &gw, &v, &gv}) t->requires_grad_();
  const Tensor rows = random_index({3}, 5, st::kInt64), cols = random_index({3}, 6, st::kInt64);
  const Tensor q = st::tensor({0.2, 0.9}).to(st::kFloat64);
  auto loss = [&](const Tensor& a, const Tensor& b, const Tensor& r, const Tensor& c, const Tensor& qq) {
    return st::median(a, 1).values.sum() + st::median(a) + st::quantile(a, qq, 0).sum() +
           st::index(a, {r, c}).square().sum() + st::index_put(a, {r, c}, b).square().sum() +
           st::index_put(a, {r}, b.unsqueeze(1), true).sum() + st::diag(a, 1).square().sum();
  };
  loss(w, v, rows, cols, q).backward();
  loss(gw, gv, gpu(rows), gpu(cols), gpu(q)).backward();
  expect_same(w.grad(), gw.grad(), "statistics and indexing backward (x)", 1e-12);
  expect_same(v.grad(), gv.grad(), "statistics and indexing backward (values)", 1e-12);
}

TEST(CudaIndex, MoreThan2To31Elements) {
  SKIP_WITHOUT_GPU();
  const int64_t cols = (int64_t(1) << 30) + 7;
  const int64_t need = 5 * cols + (int64_t(1) << 30);
  st::cuda::DeviceProperties prop = st::cuda::get_device_properties(0);
  if (prop.total_memory - st::cuda::memory_stats(0).reserved_bytes < need)
    GTEST_SKIP() << "needs about " << need / (1 << 20) << " MiB of free device memory";
  auto u8 = st::TensorOptions(st::kUInt8).device(st::Device::cuda());
  {
    Tensor x = st::cat({st::full({1, cols}, 3, u8), st::full({1, cols}, 5, u8)}, 0);  // (2, cols)
    Tensor idx_h = st::empty({3}, st::kInt64);
    idx_h.data_ptr<int64_t>()[0] = 0;
    idx_h.data_ptr<int64_t>()[1] = 1;
    idx_h.data_ptr<int64_t>()[2] = 0;
    Tensor idx = gpu(idx_h);
    Tensor out = st::index_select(x, 0, idx);  // (3, cols): rows 0, 1, 0
    Tensor tail = host(out.slice(1, cols - 4, cols).contiguous());
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(tail.data_ptr<uint8_t>()[r * 4 + j], r == 1 ? 5 : 3);
  }
  {
    const int64_t side = 46349;  // side^2 > 2^31
    Tensor m = st::full({side, side}, 1, u8);
    Tensor lower = st::tril(m, -1);
    Tensor corner = host(lower.slice(0, side - 2, side).slice(1, side - 3, side).contiguous());
    const uint8_t want[2][3] = {{1, 0, 0}, {1, 1, 0}};
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(corner.data_ptr<uint8_t>()[r * 3 + c], want[r][c]);
  }
}
