// The one CPU driver for reductions over any set of dims. The caller describes the input as
// a ReducePlan (kernels/common/reduce_plan.h): kept dims (one per output element) and reduced
// dims, each sorted innermost first by input stride and coalesced. Two loop shapes cover every
// case (Note [Reduce loops]); the result depends on the shape only, never on the thread count.
// The faster paths for one contiguous run are in reduce_runs.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include "../common/reduce_ops.h"
#include "../common/reduce_plan.h"
#include "../common/strided_loop.h"
#include "parallel.h"
#include "reduce_runs.h"

namespace strata::cpu {

// Note [Reduce loops]
// Inner: the innermost memory dim is reduced (row sums, softmax denominators, full sums).
// Each output walks its reduced elements with kLanes<Op> independent accumulators (32, or 64
// for float32 sums: Note [Float sum vectors]), so the contiguous case compiles to SIMD without
// reassociating floating point. A long reduction is cut into fixed blocks of kReduceBlock
// elements whose partials are combined in order, which lets one output use many threads and
// keeps the result thread-count independent.
// Outer: the innermost memory dim is kept (sum over dim 0 of an (N, C) tensor, the bias
// gradient). Whole rows of up to kReduceCols outputs are accumulated at once, vectorised
// across outputs; when there are few such rows the reduced dims are cut into blocks too.
inline constexpr int64_t kReduceBlock = 16384;
inline constexpr int64_t kReduceCols = 256;

// Note [Float lanes]
// An op may name a Lane type narrower than its Acc (SumReduce of float32: float lanes, double
// Acc). Lanes then hold short runs only, about kReduceLaneRows values each (up to twice that
// when rows are a little longer than the lane count, their tails landing in the first lanes):
// an inner reduction keeps kFloatSumLanes of them (Note [Float sum vectors]) and is cut into
// blocks of kFloatSumLanes * kReduceLaneRows elements (not kReduceBlock), and the outer loop
// folds kReduceLaneRows rows into its lanes, before adding them to the Acc. Runs that short
// keep float32 sums within 1e-6 of float64 even when nothing cancels (ten million 0.1s:
// tests/core/test_reduce.cpp), at float speed; runs of 512 drifted to 4e-6.
inline constexpr int64_t kReduceLaneRows = 64;

template <class Op, class = void> struct lane_of { using type = typename Op::Acc; };
template <class Op> struct lane_of<Op, std::void_t<typename Op::Lane>> { using type = typename Op::Lane; };
template <class Op> using lane_t = typename lane_of<Op>::type;
template <class Op> inline constexpr bool kFloatLanes = !std::is_same_v<lane_t<Op>, typename Op::Acc>;
// The lanes an inner reduction keeps per output.
template <class Op> inline constexpr int kLanes = kFloatLanes<Op> ? kFloatSumLanes : kReduceLanes;

using strata::ReducePlan;  // kernels/common/reduce_plan.h, shared with the CUDA kernels

// Walks the multi-index of `n` dims (innermost first), tracking offsets in two stride sets.
struct Odometer {
  int n = 0;
  const int64_t* size = nullptr;
  const int64_t* sa = nullptr;
  const int64_t* sb = nullptr;
  int64_t idx[kMaxLoopDims] = {};
  int64_t a = 0, b = 0;

  Odometer(int n_, const int64_t* size_, const int64_t* sa_, const int64_t* sb_)
      : n(n_), size(size_), sa(sa_), sb(sb_ ? sb_ : sa_) {}
  void seek(int64_t i) {
    a = b = 0;
    for (int d = 0; d < n; ++d) {
      idx[d] = i % size[d];
      i /= size[d];
      a += idx[d] * sa[d];
      b += idx[d] * sb[d];
    }
  }
  void next() {
    for (int d = 0; d < n; ++d) {
      a += sa[d];
      b += sb[d];
      if (++idx[d] < size[d]) return;
      a -= size[d] * sa[d];
      b -= size[d] * sb[d];
      idx[d] = 0;
    }
  }
};

namespace detail {

// Folds m elements p[0], p[s], ... (reduced indices r0, r0+1, ...) into the lanes.
// Note [Lane loops]: `#pragma GCC unroll 1` keeps gcc from unrolling the 16-lane loop before
// the vectoriser sees it; unrolled, only sums become SIMD (through SLP), while a kept loop
// becomes one vector operation per step for max, min and the other selects too.
// The lanes are copied into a local array for the row: through the caller's pointer gcc kept
// them in memory, a load and a store per step that made sums 3x slower per core.
template <class T, class Op, class Acc>
inline void fold_row(Acc* lane_out, const T* p, int64_t m, int64_t s, const Op& op, int64_t o, int64_t r0) {
  constexpr int L = kLanes<Op>;
  if constexpr (std::is_same_v<Op, math::SumReduce<float>> && std::is_same_v<Acc, float>) {
    if (s == 1) return fold_float_sum(lane_out, p, m);
  }
  if constexpr (extreme_of<Op>::direction != 0) {
    if (s == 1 && m >= 2 * L) return fold_extreme_run(lane_out, p, m, op);  // Note [Extreme runs]
  }
  Acc lane[L];
  for (int l = 0; l < L; ++l) lane[l] = lane_out[l];
  int64_t i = 0;
  if (s == 1) {
    for (; i + L <= m; i += L) {
#pragma GCC unroll 1
      for (int l = 0; l < L; ++l) lane[l] = math::fold_element(op, lane[l], p[i + l], o, r0 + i + l);
    }
  } else {
    for (; i + L <= m; i += L) {
#pragma GCC unroll 1
      for (int l = 0; l < L; ++l) lane[l] = math::fold_element(op, lane[l], p[(i + l) * s], o, r0 + i + l);
    }
  }
  for (int l = 0; l < L && i + l < m; ++l) lane[l] = math::fold_element(op, lane[l], p[(i + l) * s], o, r0 + i + l);
  for (int l = 0; l < L; ++l) lane_out[l] = lane[l];
}

// The same for (value, index) lanes of argmax / argmin, split into a value array and an index
// array for the duration of the row, which is the layout the vectoriser can handle; a long
// contiguous run takes fold_arg_run (Note [Extreme runs]).
template <class T, class Op, class C>
inline void fold_row(math::ValueIndex<C>* lane, const T* p, int64_t m, int64_t s, const Op& op, int64_t o,
                     int64_t r0) {
  constexpr int L = kReduceLanes;
  if (s == 1 && m >= 2 * L) return fold_arg_run(lane, p, m, op, r0);
  C val[L];
  int64_t idx[L];
  for (int l = 0; l < L; ++l) {
    val[l] = lane[l].value;
    idx[l] = lane[l].index;
  }
  auto step = [&](int l, T x, int64_t r) {
    math::ValueIndex<C> a = math::fold_element(op, math::ValueIndex<C>{val[l], idx[l]}, x, o, r);
    val[l] = a.value;
    idx[l] = a.index;
  };
  int64_t i = 0;
  if (s == 1) {
    for (; i + L <= m; i += L) {
#pragma GCC unroll 1
      for (int l = 0; l < L; ++l) step(l, p[i + l], r0 + i + l);
    }
  } else {
    for (; i + L <= m; i += L) {
#pragma GCC unroll 1
      for (int l = 0; l < L; ++l) step(l, p[(i + l) * s], r0 + i + l);
    }
  }
  for (int l = 0; l < L && i + l < m; ++l) step(l, p[(i + l) * s], r0 + i + l);
  for (int l = 0; l < L; ++l) lane[l] = {val[l], idx[l]};
}

// The reduction of output `o` (whose elements start at `base`) over reduced indices [rb, re).
// Rows shorter than the lane count fold into one accumulator: lanes would only add overhead.
template <class T, class Op>
typename Op::Acc reduce_span(const ReducePlan& p, const T* base, const Op& op, int64_t o, int64_t rb, int64_t re) {
  using Acc = typename Op::Acc;
  const int64_t n0 = p.nred ? p.red_size[0] : 1, s0 = p.nred ? p.red_in[0] : 0;
  Odometer rows(p.nred > 1 ? p.nred - 1 : 0, p.red_size + 1, p.red_in + 1, nullptr);
  rows.seek(rb / n0);
  int64_t col = rb % n0;
  if constexpr (extreme_of<Op>::direction != 0) {
    // one contiguous run: no lanes to set up and combine (Note [Extreme runs])
    if (p.nred == 1 && s0 == 1 && re - rb >= 2 * kReduceLanes) {
      Acc acc = op.identity();
      fold_row(&acc, base + rb, re - rb, 1, op, o, rb);  // only lane 0 is touched
      return acc;
    }
  }
  if constexpr (std::is_same_v<Op, math::SumReduce<float>>) {
    if (p.nred == 1 && s0 == 1 && re - rb >= kReduceLanes) return sum_float_run(base + rb, re - rb);
  }
  if (n0 < kReduceLanes) {
    Acc acc = op.identity();
    for (int64_t r = rb; r < re; rows.next()) {
      const T* row = base + rows.a;
      for (; col < n0 && r < re; ++col, ++r) acc = math::fold_element(op, acc, row[col * s0], o, r);
      col = 0;
    }
    return acc;
  }
  using Lane = lane_t<Op>;
  Lane lane[kLanes<Op>];
  for (auto& v : lane) v = static_cast<Lane>(op.identity());
  for (int64_t r = rb; r < re; rows.next()) {
    int64_t m = std::min(n0 - col, re - r);
    fold_row(lane, base + rows.a + col * s0, m, s0, op, o, r);
    r += m;
    col = 0;
  }
  for (int w = kLanes<Op> / 2; w > 0; w /= 2)  // a tree: short dependency chains
    for (int l = 0; l < w; ++l) lane[l] = static_cast<Lane>(op.combine(lane[l], lane[l + w]));
  return static_cast<Acc>(lane[0]);
}

// Room for n partial results of a blocked reduction, kept per calling thread and reused: a
// fresh allocation per call (half a megabyte for a column sum of (4096, 1000)) was mapped and
// zeroed by the kernel each time, a fifth of that sum's time. A plain array: std::vector<bool>
// would pack bits that threads write concurrently.
template <class Acc>
Acc* partial_scratch(int64_t n) {
  thread_local std::unique_ptr<Acc[]> buffer;
  thread_local int64_t capacity = 0;
  if (n > capacity) {
    buffer.reset(new Acc[static_cast<size_t>(n)]);
    capacity = n;
  }
  return buffer.get();
}

template <class T, class Op, class Store>
void reduce_inner(const ReducePlan& p, const T* in, const Op& op, const Store& store) {
  using Acc = typename Op::Acc;
  constexpr int64_t block = kFloatLanes<Op> ? kFloatSumLanes * kReduceLaneRows : kReduceBlock;
  const int64_t R = p.num_red;
  const int64_t nblk = R > block ? (R + block - 1) / block : 1;
  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(1, std::min(R, block)));
  if (nblk == 1) {
    parallel_for(0, p.num_out, grain, [&](int64_t ob, int64_t oe) {
      Odometer out(p.nkept, p.kept_size, p.kept_in, p.kept_out);
      out.seek(ob);
      for (int64_t o = ob; o < oe; ++o, out.next()) store(out.b, o, reduce_span(p, in + out.a, op, o, 0, R));
    });
    return;
  }
  Acc* partial = partial_scratch<Acc>(p.num_out * nblk);
  parallel_for(0, p.num_out * nblk, 1, [&](int64_t tb, int64_t te) {
    Odometer out(p.nkept, p.kept_size, p.kept_in, p.kept_out);
    for (int64_t t = tb; t < te; ++t) {
      int64_t o = t / nblk, b = t % nblk;
      out.seek(o);
      partial[t] = reduce_span(p, in + out.a, op, o, b * block, std::min(R, (b + 1) * block));
    }
  });
  parallel_for(0, p.num_out, std::max<int64_t>(1, kDefaultGrain / nblk), [&](int64_t ob, int64_t oe) {
    Odometer out(p.nkept, p.kept_size, p.kept_in, p.kept_out);
    out.seek(ob);
    for (int64_t o = ob; o < oe; ++o, out.next()) {
      Acc acc = partial[o * nblk];
      for (int64_t b = 1; b < nblk; ++b) acc = op.combine(acc, partial[o * nblk + b]);
      store(out.b, o, acc);
    }
  });
}

template <class T, class Op, class Store>
void reduce_outer(const ReducePlan& p, const T* in, const Op& op, const Store& store) {
  using Acc = typename Op::Acc;
  const int64_t K = p.kept_size[0], ks = p.kept_in[0], kos = p.kept_out[0], R = p.num_red;
  const int64_t Q = p.num_out / K, nchunk = (K + kReduceCols - 1) / kReduceCols, units = Q * nchunk;
  const int64_t width = std::min(K, kReduceCols);
  // Few row groups: split the reduced rows into blocks so that threads share the work.
  int64_t nblk = 1;
  if (units < 16 && R * width > 2 * kReduceBlock) nblk = std::min<int64_t>(64, R * width / kReduceBlock);
  const int64_t rows_per_blk = (R + nblk - 1) / nblk;
  nblk = R > 0 ? (R + rows_per_blk - 1) / rows_per_blk : 1;
  Acc* partial = nblk > 1 ? partial_scratch<Acc>(units * nblk * kReduceCols) : nullptr;

  using Lane = lane_t<Op>;
  // Folds rows [rb, re) (the odometer at rb, left at re) of cw columns into lane[0, cw).
  auto fold_rows = [&](auto* lane, const T* base, Odometer& rows, int64_t rb, int64_t re, int64_t cw, int64_t o0) {
    if constexpr (std::is_same_v<Op, math::SumReduce<float>> && std::is_same_v<decltype(lane), float*>) {
      if (ks == 1 && re - rb <= kReduceLaneRows) {  // Note [Float column sums]
        int64_t row_offset[kReduceLaneRows];
        for (int64_t r = rb; r < re; ++r, rows.next()) row_offset[r - rb] = rows.a;
        return fold_float_columns(lane, base, row_offset, re - rb, cw);
      }
    }
    for (int64_t r = rb; r < re; ++r, rows.next()) {
      const T* row = base + rows.a;
      if (ks == 1) {
        for (int64_t j = 0; j < cw; ++j) lane[j] = math::fold_element(op, lane[j], row[j], o0 + j, r);
      } else {
        for (int64_t j = 0; j < cw; ++j) lane[j] = math::fold_element(op, lane[j], row[j * ks], o0 + j, r);
      }
    }
  };
  auto run = [&](int64_t t, Acc* acc) {  // acc: kReduceCols accumulators of task t
    // tasks run row block by row block, each block's column chunks in turn: consecutive tasks
    // read neighbouring parts of the same rows
    int64_t u = t % units, b = t / units, q = u / nchunk, j0 = (u % nchunk) * kReduceCols;
    int64_t cw = std::min(kReduceCols, K - j0), o0 = q * K + j0;
    Odometer group(p.nkept - 1, p.kept_size + 1, p.kept_in + 1, p.kept_out + 1);
    group.seek(q);
    Odometer rows(p.nred, p.red_size, p.red_in, nullptr);
    int64_t rb = b * rows_per_blk, re = std::min(R, rb + rows_per_blk);
    rows.seek(rb);
    for (int64_t j = 0; j < cw; ++j) acc[j] = op.identity();
    const T* base = in + group.a + j0 * ks;
    if constexpr (std::is_same_v<Lane, Acc>) {
      fold_rows(acc, base, rows, rb, re, cw, o0);
    } else {
      Lane lane[kReduceCols];
      for (int64_t r = rb; r < re; r += kReduceLaneRows) {
        for (int64_t j = 0; j < cw; ++j) lane[j] = static_cast<Lane>(op.identity());
        fold_rows(lane, base, rows, r, std::min(re, r + kReduceLaneRows), cw, o0);
        for (int64_t j = 0; j < cw; ++j) acc[j] = op.combine(acc[j], static_cast<Acc>(lane[j]));
      }
    }
    return std::pair<int64_t, int64_t>(group.b + j0 * kos, cw);
  };

  const int64_t grain = std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(1, rows_per_blk * width));
  parallel_for(0, units * nblk, grain, [&](int64_t tb, int64_t te) {
    Acc acc[kReduceCols];
    for (int64_t t = tb; t < te; ++t) {
      if (nblk > 1) {
        run(t, partial + ((t % units) * nblk + t / units) * kReduceCols);
        continue;
      }
      auto [out_off, cw] = run(t, acc);
      int64_t o0 = (t / nchunk) * K + (t % nchunk) * kReduceCols;
      for (int64_t j = 0; j < cw; ++j) store(out_off + j * kos, o0 + j, acc[j]);
    }
  });
  if (nblk == 1) return;
  // blocks in order, each block's columns side by side: contiguous, and each column still
  // combines its blocks first to last
  parallel_for(0, units, 1, [&](int64_t ub, int64_t ue) {
    Acc acc[kReduceCols];
    for (int64_t u = ub; u < ue; ++u) {
      int64_t q = u / nchunk, j0 = (u % nchunk) * kReduceCols, cw = std::min(kReduceCols, K - j0);
      const Acc* block = partial + u * nblk * kReduceCols;
      for (int64_t j = 0; j < cw; ++j) acc[j] = block[j];
      for (int64_t b = 1; b < nblk; ++b) {
        block += kReduceCols;
        for (int64_t j = 0; j < cw; ++j) acc[j] = op.combine(acc[j], block[j]);
      }
      Odometer group(p.nkept - 1, p.kept_size + 1, p.kept_in + 1, p.kept_out + 1);
      group.seek(q);
      for (int64_t j = 0; j < cw; ++j) store(group.b + (j0 + j) * kos, q * K + j0 + j, acc[j]);
    }
  });
}

}  // namespace detail

/// Reduces `in` as described by `plan`, calling store(out_offset, o, acc) once per output,
/// where out_offset is in output elements and o is the output's index in plan order (kept
/// dims innermost first). store may be called from several threads, for distinct outputs.
template <class T, class Op, class Store>
void reduce(const ReducePlan& plan, const T* in, const Op& op, const Store& store) {
  if (plan.num_out == 0) return;
  if (plan.num_red == 0) {  // empty reduction: every output is the identity
    parallel_for(0, plan.num_out, kDefaultGrain, [&](int64_t ob, int64_t oe) {
      Odometer out(plan.nkept, plan.kept_size, plan.kept_in, plan.kept_out);
      out.seek(ob);
      for (int64_t o = ob; o < oe; ++o, out.next()) store(out.b, o, op.identity());
    });
    return;
  }
  if (plan.outer()) detail::reduce_outer(plan, in, op, store);
  else detail::reduce_inner(plan, in, op, store);
}

}  // namespace strata::cpu
