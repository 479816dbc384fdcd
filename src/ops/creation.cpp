// Factories: constants, ranges, Philox random draws and tensors over user memory.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include <strata/autograd/graph.hpp>
#include <strata/ops/creation.hpp>

#include "autograd/inplace.h"
#include "autograd/views.h"
#include "core/backend.h"
#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/convert.h"
#include "kernels/common/philox.h"
#include "kernels/common/range_math.h"
#include "kernels/cpu/fast_remainder.h"
#include "kernels/cpu/parallel.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

// p[i] = gen(i) over [b, e), out of line (Note [Loops out of line] in kernels/cpu/elementwise.h).
template <class T, class Gen>
__attribute__((noinline)) void fill_span(T* __restrict p, int64_t b, int64_t e, const Gen& gen) {
  for (int64_t i = b; i < e; ++i) p[i] = convert<T>(gen(i));
}

// Kernels below write a contiguous output; callers pass one.
template <class Gen>
void fill_contiguous(Tensor& out, std::string_view op, Gen gen) {
  int64_t n = out.numel();
  dispatch<DTypeSet::Numeric>(out.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(out.data());
    cpu::parallel_for(0, n, 16384, [&](int64_t b, int64_t e) { fill_span(p, b, e, gen); });
  });
}

// Random draws one Philox block at a time (Note [Random stream layout]): gen(block) gives the
// kLanes values of elements [block * kLanes, (block + 1) * kLanes), so each block is computed
// once rather than once per element (four times the rounds, and twice the logarithms and roots
// of the normals: 9.2 and 21.7 ns per element for uniform and normal floats before, on one
// thread). Whole blocks run in a loop of their own, out of line (Note [Loops out of line] in
// kernels/cpu/elementwise.h), which gcc vectorizes across blocks, Philox and the normals'
// log, sine and cosine included, when gen is inlined into it (the generators below are
// always_inline: gcc leaves them out of line otherwise); the lane count of a partial block would
// keep it scalar.
template <int kLanes, class T, class Gen>
__attribute__((noinline)) void fill_whole_blocks(T* __restrict p, int64_t b0, int64_t b1, const Gen& gen) {
  for (int64_t blk = b0; blk < b1; ++blk) {
    const auto values = gen(blk);
    for (int l = 0; l < kLanes; ++l) p[blk * kLanes + l] = convert<T>(values[static_cast<size_t>(l)]);
  }
}

template <int kLanes, class Gen>
void fill_blocks(Tensor& out, std::string_view op, Gen gen) {
  const int64_t n = out.numel(), whole = n / kLanes, tail = n % kLanes;
  dispatch<DTypeSet::Numeric>(out.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(out.data());
    cpu::parallel_for(0, whole + (tail > 0), 16384 / kLanes, [&](int64_t b, int64_t e) {
      fill_whole_blocks<kLanes>(p, b, std::min(e, whole), gen);
      if (e <= whole) return;
      const auto values = gen(whole);  // the partial last block
      for (int64_t l = 0; l < tail; ++l) p[whole * kLanes + l] = convert<T>(values[static_cast<size_t>(l)]);
    });
  });
}

philox::Block block_of(const RandomParams& p, int64_t blk) {
  return philox::philox4x32_10(p.offset + static_cast<uint64_t>(blk), p.seed);
}

// uniform_at's values (kernels/common/philox.h), a block at a time.
void cpu_uniform(const KernelCall& call) {
  const auto& p = call.param<RandomParams>();
  const double scale = p.b - p.a;
  fill_blocks<4>(call.outputs[0], "uniform", [&](int64_t blk) __attribute__((always_inline)) {
    const philox::Block r = block_of(p, blk);
    std::array<double, 4> v;
    for (int l = 0; l < 4; ++l) v[l] = p.a + scale * static_cast<double>(philox::to_unit_float(r.v[l]));
    return v;
  });
}

// normal_at's values, a block (two Box-Muller pairs) at a time.
void cpu_normal(const KernelCall& call) {
  const auto& p = call.param<RandomParams>();
  fill_blocks<4>(call.outputs[0], "normal", [&](int64_t blk) __attribute__((always_inline)) {
    const philox::Block r = block_of(p, blk);
    std::array<float, 4> z;
    philox::box_muller(r.v[0], r.v[1], z[0], z[1]);
    philox::box_muller(r.v[2], r.v[3], z[2], z[3]);
    std::array<double, 4> v;
    for (int l = 0; l < 4; ++l) v[l] = p.a + p.b * static_cast<double>(z[l]);
    return v;
  });
}

// Note [randint remainders]
// randint's element i is low + bits64_at(i) % range. A 64-bit division per element kept the
// whole loop scalar, Philox included: 0.53x LibTorch's randint. Each thread now draws the bits
// of a chunk of blocks in a loop that vectorizes, then takes their remainders without a
// division (cpu::FastRemainder): the same values, element for element.
__attribute__((noinline)) void draw_bits64(uint64_t* __restrict bits, int64_t blocks, const RandomParams& p,
                                           int64_t first_block) {
  for (int64_t b = 0; b < blocks; ++b) {
    const philox::Block r = block_of(p, first_block + b);
    bits[2 * b] = philox::bits64_of(r, 0);
    bits[2 * b + 1] = philox::bits64_of(r, 2);
  }
}

void cpu_randint(const KernelCall& call) {
  const auto& p = call.param<RandomParams>();
  const cpu::FastRemainder remainder(static_cast<uint64_t>(static_cast<int64_t>(p.b) - static_cast<int64_t>(p.a)));
  const int64_t low = static_cast<int64_t>(p.a);
  Tensor& out = call.outputs[0];
  const int64_t n = out.numel(), blocks = (n + 1) / 2;
  dispatch<DTypeSet::Numeric>(out.dtype(), "randint", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* o = static_cast<T*>(out.data());
    cpu::parallel_for(0, blocks, 8192, [&](int64_t b, int64_t e) {
      constexpr int64_t kChunk = 512;  // blocks: 8 KiB of bits, in L1
      uint64_t bits[2 * kChunk];
      for (int64_t c = b; c < e; c += kChunk) {
        const int64_t m = std::min(kChunk, e - c), first = 2 * c, count = std::min(2 * m, n - first);
        draw_bits64(bits, m, p, c);
        for (int64_t i = 0; i < count; ++i) o[first + i] = convert<T>(low + static_cast<int64_t>(remainder(bits[i])));
      }
    });
  });
}

// arange through arange_value alone: without linspace's branches the loop vectorizes (it ran
// element by element at 0.57x LibTorch's).
void cpu_arange(const KernelCall& call) {
  const auto& p = call.param<RangeParams>();
  if (!p.is_linspace) {
    const double start = p.start, step = p.step;
    fill_contiguous(call.outputs[0], "arange", [start, step](int64_t i) __attribute__((always_inline)) {
      return math::arange_value(i, start, step);
    });
    return;
  }
  fill_contiguous(call.outputs[0], "linspace", [&](int64_t i) {
    return math::range_value(i, p.start, p.step, p.end, p.count, p.is_linspace);
  });
}

Generator& gen_or_default(Generator* g) { return g ? *g : default_generator(); }

// Draws into t (any layout): generates contiguous values, then copies if t is strided.
// Fills t in place with the op's draws; `name` is the public in-place op, for its errors.
void draw(OpId op, Tensor& t, RandomParams p, const char* name) {
  detail::check_writable(t, name);
  if (autograd::detail::inplace_records(t)) {  // Note [In-place under autograd]; a leaf is refused there
    autograd::detail::record_overwrite(t, name, [&](Tensor& out) { draw(op, out, p, name); });
    return;
  }
  if (t.numel() == 0) return;
  Tensor out = t.is_contiguous() ? t : detail::make_tensor(t.shape(), t.dtype(), t.device());
  run_kernel(op, out.dtype(), KernelCall{{}, {&out, 1}, &p});
  if (!out.is_same(t)) t.copy_(out);
  t.storage()->bump_version();
}

RandomParams reserve_params(Generator& g, int64_t numel, uint64_t per_block, double a, double b) {
  RandomParams p;
  const RandomDraw draw = g.reserve_draw((static_cast<uint64_t>(numel) + per_block - 1) / per_block);
  p.seed = draw.seed;
  p.offset = draw.offset;
  p.a = a;
  p.b = b;
  p.generator = &g;
  p.blocks = (static_cast<uint64_t>(numel) + per_block - 1) / per_block;
  return p;
}

}  // namespace

namespace detail {
void register_creation_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::uniform, CPU, kFloatDTypes, cpu_uniform);
  table.set(OpId::normal, CPU, kFloatDTypes, cpu_normal);
  table.set(OpId::randint, CPU, kNumericDTypes, cpu_randint);
  table.set(OpId::arange, CPU, kNumericDTypes, cpu_arange);
}

Tensor from_host_bytes(const void* data, size_t count, DType dtype, const Shape& shape) {
  int64_t n = checked_numel(shape, "from_vector");
  STRATA_CHECK(static_cast<size_t>(n) == count, "[from_vector] {} values do not fill shape {} ({} elements)", count,
               shape, n);
  Tensor t = make_tensor(shape, dtype, kCPU);
  if (count) std::memcpy(t.data(), data, count * itemsize(dtype));
  return t;
}
}  // namespace detail

namespace {
// A factory fills its tensor first and makes it a leaf that requires grad last, when its
// options ask for one (an integer dtype then raises, as in PyTorch).
Tensor finish(Tensor t, const TensorOptions& o) {
  if (o.requires_grad_) t.requires_grad_();
  return t;
}
TensorOptions without_grad(TensorOptions o) { return o.requires_grad(false); }
}  // namespace

Tensor empty(const Shape& shape, TensorOptions o) {
  backend::check_device(o.device_, "empty");
  return finish(detail::make_tensor(shape, o.dtype_, o.device_), o);
}

Tensor full(const Shape& shape, Scalar value, TensorOptions o) {
  detail::check_fill_value(value, o.dtype_, "full");
  Tensor t = empty(shape, without_grad(o));
  t.fill_(value);
  return finish(t, o);
}
Tensor zeros(const Shape& shape, TensorOptions o) { return full(shape, 0, o); }
Tensor ones(const Shape& shape, TensorOptions o) { return full(shape, 1, o); }
Tensor scalar_tensor(Scalar value, TensorOptions o) { return full({}, value, o); }

Tensor arange(Scalar end, std::optional<TensorOptions> o) { return arange(0, end, 1, o); }

Tensor arange(Scalar start, Scalar end, Scalar step, std::optional<TensorOptions> o) {
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  STRATA_CHECK(st != 0 && std::isfinite(st), "[arange] step must be finite and non-zero, got {}", st);
  STRATA_CHECK(std::isfinite(s) && std::isfinite(e), "[arange] start {} and end {} must be finite", s, e);
  bool all_int = !start.is_floating() && !end.is_floating() && !step.is_floating();
  TensorOptions opts = o.value_or(TensorOptions(all_int ? kInt64 : kFloat32));
  if (is_integral(opts.dtype_)) {
    // an integer range takes integer arguments, truncated toward zero as PyTorch's int64 arange
    // does: stepping 1.5 from 0 would otherwise give 0, 1, 3 (each value truncated apart)
    s = std::trunc(s), e = std::trunc(e), st = std::trunc(step.to_double());
    STRATA_CHECK(st != 0, "[arange] step {} truncates to 0 for {}", step.to_double(), opts.dtype_);
  }
  STRATA_CHECK((e - s) / st >= 0 || s == e, "[arange] step {} does not move from {} toward {}", st, s, e);
  double count_d = std::ceil((e - s) / st);
  STRATA_CHECK(count_d < 9.2e18, "[arange] range of {} elements is too large", count_d);
  RangeParams p{s, st, static_cast<int64_t>(count_d), e, false};
  if (p.count > 0 && is_integral(opts.dtype_)) {
    // the kernels step in double: integer values must be exact there, and fit the dtype
    const double last = s + static_cast<double>(p.count - 1) * st;
    const auto [lo, hi] = detail::integer_range(opts.dtype_);
    STRATA_CHECK(std::fabs(s) <= 9007199254740992.0 && std::fabs(last) <= 9007199254740992.0,
                 "[arange] integer values past 2^53 are not supported (start {}, end {})", s, e);
    STRATA_CHECK(std::min(s, last) >= static_cast<double>(lo) && std::max(s, last) <= static_cast<double>(hi),
                 "[arange] values from {} to {} do not fit {}", s, last, opts.dtype_);
  }
  Tensor t = empty({p.count}, without_grad(opts));
  if (p.count) run_kernel(OpId::arange, t.dtype(), KernelCall{{}, {&t, 1}, &p});
  return finish(t, opts);
}

Tensor linspace(double start, double end, int64_t steps, TensorOptions o) {
  STRATA_CHECK(steps >= 0, "[linspace] number of steps must be non-negative, got {}", steps);
  STRATA_CHECK(o.dtype_ != kBool, "[linspace] bool output is not supported");
  RangeParams p{start, steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0, steps, end, true};
  Tensor t = empty({steps}, without_grad(o));
  if (steps) run_kernel(OpId::arange, t.dtype(), KernelCall{{}, {&t, 1}, &p});
  return finish(t, o);
}

Tensor eye(int64_t n, std::optional<int64_t> m, TensorOptions o) {
  int64_t cols = m.value_or(n);
  STRATA_CHECK(n >= 0 && cols >= 0, "[eye] sizes must be non-negative, got {} x {}", n, cols);
  Tensor t = zeros({n, cols}, without_grad(o));
  int64_t k = std::min(n, cols);
  if (k > 0) t.as_strided({k}, {cols + 1}, 0).fill_(1);
  return finish(t, o);
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  STRATA_CHECK(low <= high, "[uniform_] low {} is greater than high {}", low, high);
  STRATA_CHECK(is_floating(t.dtype()), "[uniform_] expects a floating tensor, got {}", t.dtype());
  draw(OpId::uniform, t, reserve_params(gen_or_default(gen), t.numel(), 4, low, high), "uniform_");
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  STRATA_CHECK(std >= 0, "[normal_] std must be non-negative, got {}", std);
  STRATA_CHECK(is_floating(t.dtype()), "[normal_] expects a floating tensor, got {}", t.dtype());
  draw(OpId::normal, t, reserve_params(gen_or_default(gen), t.numel(), 4, mean, std), "normal_");
  return t;
}

Tensor rand(const Shape& shape, TensorOptions o, Generator* gen) {
  Tensor t = empty(shape, without_grad(o));
  return finish(uniform_(t, 0, 1, gen), o);
}

Tensor randn(const Shape& shape, TensorOptions o, Generator* gen) {
  Tensor t = empty(shape, without_grad(o));
  return finish(normal_(t, 0, 1, gen), o);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, std::optional<TensorOptions> o, Generator* gen) {
  STRATA_CHECK(low < high, "[randint] low {} must be less than high {}", low, high);
  // the kernels take the bounds as doubles: they must be exact there
  constexpr int64_t kExact = int64_t(1) << 53;
  STRATA_CHECK(low >= -kExact && high <= kExact, "[randint] bounds [{}, {}) must lie within +-2^53", low, high);
  const TensorOptions opts = o.value_or(TensorOptions(kInt64));
  STRATA_CHECK(opts.dtype_ != kBool, "[randint] bool output is not supported");
  const auto [lo, hi] = detail::integer_range(opts.dtype_);
  STRATA_CHECK(low >= lo && high - 1 <= hi && (opts.dtype_ != kFloat16 || (low >= -65504 && high - 1 <= 65504)),
               "[randint] values in [{}, {}) do not fit {}", low, high, opts.dtype_);
  Tensor t = empty(shape, without_grad(opts));
  draw(OpId::randint, t, reserve_params(gen_or_default(gen), t.numel(), 2, double(low), double(high)), "randint");
  return finish(t, opts);
}

namespace {
// make(shape, options) for a tensor like t: a channels-last t gives a channels-last result, as
// PyTorch's preserve_format (its NHWC storage is made, then viewed as NCHW).
// options: t's dtype and device unless given.
template <class Make>
Tensor like(const char* op, const Tensor& t, std::optional<TensorOptions> options, Make make) {
  STRATA_CHECK(t.defined(), "[{}] the tensor is undefined", op);
  const TensorOptions o = options.value_or(TensorOptions(t.dtype(), t.device()));
  if (detail::suggested_format(t) == MemoryFormat::Contiguous) return make(t.shape(), o);
  const Shape& s = t.shape();
  return finish(make(Shape{s[0], s[2], s[3], s[1]}, without_grad(o)).permute({0, 3, 1, 2}), o);
}
}  // namespace

Tensor empty_like(const Tensor& t, std::optional<TensorOptions> o) {
  return like("empty_like", t, o, [](const Shape& s, TensorOptions opts) { return empty(s, opts); });
}
Tensor zeros_like(const Tensor& t, std::optional<TensorOptions> o) {
  return like("zeros_like", t, o, [](const Shape& s, TensorOptions opts) { return zeros(s, opts); });
}
Tensor ones_like(const Tensor& t, std::optional<TensorOptions> o) {
  return like("ones_like", t, o, [](const Shape& s, TensorOptions opts) { return ones(s, opts); });
}
Tensor full_like(const Tensor& t, Scalar value, std::optional<TensorOptions> o) {
  return like("full_like", t, o,
              [value](const Shape& s, TensorOptions opts) { return full(s, value, opts); });
}
Tensor rand_like(const Tensor& t, Generator* gen) {
  return like("rand_like", t, std::nullopt,
              [gen](const Shape& s, TensorOptions opts) { return rand(s, opts, gen); });
}
Tensor randn_like(const Tensor& t, Generator* gen) {
  return like("randn_like", t, std::nullopt,
              [gen](const Shape& s, TensorOptions opts) { return randn(s, opts, gen); });
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter,
                 std::optional<Strides> strides, Device device) {
  STRATA_CHECK(data != nullptr || checked_numel(shape, "from_blob") == 0, "[from_blob] null data for shape {}", shape);
  backend::check_device(device, "from_blob");
  Strides st = strides.value_or(contiguous_strides(shape));
  STRATA_CHECK(st.size() == shape.size(), "[from_blob] shape {} and strides {} differ in length", shape, st);
  int64_t numel = checked_numel(shape, "from_blob");
  int64_t span = 0;  // elements reachable from data
  if (numel > 0) {
    span = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      STRATA_CHECK(st[d] >= 0, "[from_blob] negative stride in {}", st);
      int64_t reach = 0;
      STRATA_CHECK(!__builtin_mul_overflow(shape[d] - 1, st[d], &reach) && !__builtin_add_overflow(span, reach, &span),
                   "[from_blob] shape {} with strides {} reaches past 2^63 elements", shape, st);
    }
    int64_t bytes = 0;
    STRATA_CHECK(!__builtin_mul_overflow(span, static_cast<int64_t>(itemsize(dtype)), &bytes),
                 "[from_blob] shape {} with strides {} spans more than 2^63 bytes of {}", shape, st, dtype);
  }
  auto storage = Storage::wrap(data, static_cast<size_t>(span) * itemsize(dtype), device, std::move(deleter));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = st;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

}  // namespace strata
