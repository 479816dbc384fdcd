// Fused scaled dot-product attention on the CPU, forward and backward (Note [Fused
// attention] in src/nn/attention_fused.cpp; the per-element math is in
// kernels/common/attention_math.h). q (batch, L, E), k (batch, S, E), v (batch, S, Ev), o and
// its gradient (batch, L, Ev), all non-empty, each where its math::AttentionRows says (rows may
// be strided, columns are adjacent); lse (batch, L) is contiguous, in the compute type.
//
// The forward takes blocks of queries: a block's scores (rows x keys) are one GEMM into a
// buffer that stays in cache, the softmax runs in place, and a second GEMM writes the
// output rows, so no (L, S) tensor reaches memory. A causal block stops at its last row's
// last key, which skips about half the products. Blocks are dealt round-robin over the
// threads, since causal blocks grow in cost along a problem.
//
// The backward runs one problem per thread: its blocks of queries in turn recompute the
// weights from the saved logsumexp and accumulate dk and dv in buffers of the thread's own,
// while dq rows are written whole. (A batch smaller than the thread count leaves threads
// idle, as PyTorch's CPU flash attention does.) 16-bit inputs are converted to float per
// block; float and double are read in place, strided rows included (the GEMMs take their
// leading dims). Dropout multiplies each weight by its factor
// after the softmax (forward) and the products with v by the same factors (backward).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "../common/attention_math.h"
#include "../common/convert.h"
#include "../common/vec_exp.h"
#include "gemm.h"
#include "parallel.h"

namespace strata::cpu {

struct AttentionDims {
  int64_t batch = 0;    // independent problems: the batch and head dims, flattened
  int64_t queries = 0;  // L
  int64_t keys = 0;     // S
  int64_t dim = 0;      // E, of queries and keys
  int64_t value_dim = 0;  // Ev
  double scale = 1;
  bool causal = false;
  double dropout = 0;  // rate of the weights' dropout, drawn from Philox (seed, offset)
  uint64_t seed = 0, offset = 0;
};

// Queries per block: 32, or fewer when the keys are so many that a block's scores would pass
// about 1 MiB. Smaller blocks skip more of a causal mask, larger ones make fewer and larger GEMM
// calls: causal fwd+bwd at 8x12x256x64 took 27.3, 24.9 and 25.3 ms with blocks of 16, 32 and 64
// (2 threads, timed in alternation in one process by a probe outside benchmarks/), and 128 was
// slower still in bench_ops.
inline int64_t attention_block_rows(int64_t keys, int64_t elem_bytes) {
  const int64_t fit = (int64_t{1} << 20) / (std::max<int64_t>(keys, 1) * elem_bytes);
  return std::clamp<int64_t>(fit, 8, 32);
}

namespace detail {

inline constexpr int kAttentionLanes = 16;

// C = alpha A B + beta C for one row-major product in the compute type (A (m, k) or, with
// ta, stored as its transpose; B likewise).
template <class C>
void attention_gemm(int64_t m, int64_t n, int64_t k, const C* a, int64_t lda, bool ta, const C* b, int64_t ldb,
                    bool tb, C* c, int64_t ldc, double alpha, double beta) {
  GemmProblem p;
  p.type = sizeof(C) == 8 ? GemmType::F64 : GemmType::F32;
  p.m = m, p.n = n, p.k = k;
  p.a = GemmInput{a, lda, 0, ta};
  p.b = GemmInput{b, ldb, 0, tb};
  p.c = GemmOutput{c, ldc, 0};
  p.alpha = alpha, p.beta = beta;
  gemm(p);
}

// A block of rows as the compute type, `ld` apart.
template <class C>
struct ComputeRows {
  const C* data;
  int64_t ld;
};

// rows x cols values of T, rows ld apart, as the compute type: src itself when they are the same
// type, else a dense copy in buf.
template <class T, class C>
ComputeRows<C> as_compute(const T* src, int64_t rows, int64_t cols, int64_t ld, std::vector<C>& buf) {
  if constexpr (std::is_same_v<T, C>) {
    return {src, ld};
  } else {
    buf.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) buf[r * cols + j] = static_cast<C>(src[r * ld + j]);
    return {buf.data(), cols};
  }
}

// Dense rows x cols values into rows of dst, ld apart.
template <class T, class C>
void store(const C* src, T* dst, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) dst[r * ld + j] = convert<T>(src[r * cols + j]);
}

// Runs task(t, scratch) for t in [0, tasks), dealt round-robin over the threads; each thread
// keeps one Scratch for all its tasks.
template <class Scratch, class F>
void attention_tasks(int64_t tasks, const F& task) {
  const int64_t workers = std::min<int64_t>(tasks, omp_in_parallel() ? 1 : num_threads());
  parallel_for(0, workers, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      Scratch scratch;
      for (int64_t t = w; t < tasks; t += workers) task(t, scratch);
    }
  });
}

// The softmax of the first n of a row's cols scores, in place, the rest zeroed; returns the
// logsumexp. A NaN score makes the row NaN, as softmax does.
template <class C>
C attention_softmax_row(C* row, int64_t n, int64_t cols) {
  constexpr int L = kAttentionLanes;
  C lane[L];
  for (auto& x : lane) x = row[0];
  int64_t j = 0;
  for (; j + L <= n; j += L) {
#pragma GCC unroll 1  // see Note [Lane loops] in reduce.h
    for (int l = 0; l < L; ++l) lane[l] = row[j + l] > lane[l] ? row[j + l] : lane[l];
  }
  for (; j < n; ++j) lane[0] = row[j] > lane[0] ? row[j] : lane[0];
  C mx = lane[0];
  for (int l = 1; l < L; ++l) mx = lane[l] > mx ? lane[l] : mx;
  for (auto& x : lane) x = C(0);
  for (j = 0; j + L <= n; j += L) {
#pragma GCC unroll 1
    for (int l = 0; l < L; ++l) {
      const C e = math::vec_exp(row[j + l] - mx);
      row[j + l] = e;
      lane[l] += e;
    }
  }
  for (; j < n; ++j) {
    const C e = math::vec_exp(row[j] - mx);
    row[j] = e;
    lane[0] += e;
  }
  for (int h = L / 2; h > 0; h /= 2)
    for (int l = 0; l < h; ++l) lane[l] += lane[l + h];
  const C inv = C(1) / lane[0];
  for (j = 0; j < n; ++j) row[j] *= inv;
  for (; j < cols; ++j) row[j] = C(0);
  return mx + std::log(lane[0]);
}

// Multiplies the first `cols` weights of row `row` of the flattened (batch * L, S) weights
// by their dropout factors (0 or 1 / (1 - rate)). The Philox blocks that lie whole in the row
// run in a loop of four lanes, which vectorizes across blocks (as kernels/cpu/dropout.h); a
// factor computed per weight made dropout cost more than the attention itself.
template <class C>
void attention_dropout_row(C* w, int64_t cols, int64_t row, const AttentionDims& d) {
  const uint64_t e0 = static_cast<uint64_t>(row) * static_cast<uint64_t>(d.keys);
  const C scale = static_cast<C>(1.0 / (1.0 - d.dropout));
  const float rate = static_cast<float>(d.dropout);
  auto one = [&](int64_t j) {
    const uint64_t e = e0 + static_cast<uint64_t>(j);
    w[j] *= math::attention_dropout_factor(philox::philox4x32_10(d.offset + e / 4, d.seed), e, rate, scale);
  };
  int64_t j = 0;
  for (; j < cols && (e0 + static_cast<uint64_t>(j)) % 4 != 0; ++j) one(j);  // up to a block boundary
  const uint64_t first = (e0 + static_cast<uint64_t>(j)) / 4;
  const int64_t whole = (cols - j) / 4;
  C* wb = w + j;
  for (int64_t b = 0; b < whole; ++b) {
    const philox::Block r = philox::philox4x32_10(d.offset + first + static_cast<uint64_t>(b), d.seed);
    for (int l = 0; l < 4; ++l) wb[4 * b + l] *= philox::dropout_factor(r.v[l], rate, scale);
  }
  for (j += 4 * whole; j < cols; ++j) one(j);
}

}  // namespace detail

template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, compute_t<T>* lse, const AttentionDims& d,
                       const math::AttentionLayout& at) {
  using C = compute_t<T>;
  const int64_t L = d.queries, S = d.keys, E = d.dim, Ev = d.value_dim;
  const int64_t block = attention_block_rows(S, sizeof(C)), blocks = (L + block - 1) / block;
  struct Scratch {
    std::vector<C> q, k, v, s, o;
  };
  detail::attention_tasks<Scratch>(d.batch * blocks, [&](int64_t t, Scratch& w) {
    const int64_t b = t / blocks, i0 = t % blocks * block, rows = std::min(block, L - i0);
    const int64_t cols = d.causal ? std::min(i0 + rows, S) : S;  // keys any row of the block attends
    const auto qb = detail::as_compute(q + at.q.offset(b) + i0 * at.q.row_stride, rows, E, at.q.row_stride, w.q);
    const auto kb = detail::as_compute(k + at.k.offset(b), cols, E, at.k.row_stride, w.k);
    const auto vb = detail::as_compute(v + at.v.offset(b), cols, Ev, at.v.row_stride, w.v);
    w.s.resize(static_cast<size_t>(rows * cols));
    detail::attention_gemm<C>(rows, cols, E, qb.data, qb.ld, false, kb.data, kb.ld, true, w.s.data(), cols, d.scale,
                              0);
    for (int64_t r = 0; r < rows; ++r) {
      C* row = w.s.data() + r * cols;
      lse[b * L + i0 + r] = detail::attention_softmax_row(row, math::attention_keys(i0 + r, S, d.causal), cols);
      if (d.dropout > 0) detail::attention_dropout_row(row, cols, b * L + i0 + r, d);
    }
    T* ob = o + at.o.offset(b) + i0 * at.o.row_stride;
    if constexpr (std::is_same_v<T, C>) {
      detail::attention_gemm<C>(rows, Ev, cols, w.s.data(), cols, false, vb.data, vb.ld, false, ob, at.o.row_stride,
                                1, 0);
    } else {
      w.o.resize(static_cast<size_t>(rows * Ev));
      detail::attention_gemm<C>(rows, Ev, cols, w.s.data(), cols, false, vb.data, vb.ld, false, w.o.data(), Ev, 1, 0);
      detail::store(w.o.data(), ob, rows, Ev, at.o.row_stride);
    }
  });
}

template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* go, const compute_t<T>* lse, T* gq,
                        T* gk, T* gv, const AttentionDims& d, const math::AttentionLayout& at) {
  using C = compute_t<T>;
  const int64_t L = d.queries, S = d.keys, E = d.dim, Ev = d.value_dim;
  const int64_t block = attention_block_rows(S, sizeof(C));
  const int64_t attended = d.causal ? std::min(L, S) : S;  // keys past these get no gradient
  struct Scratch {
    std::vector<C> q, k, v, o, go, p, m, pd, ds, gq, gk, gv;
  };
  detail::attention_tasks<Scratch>(d.batch, [&](int64_t b, Scratch& w) {
    const auto kb = detail::as_compute(k + at.k.offset(b), attended, E, at.k.row_stride, w.k);
    const auto vb = detail::as_compute(v + at.v.offset(b), attended, Ev, at.v.row_stride, w.v);
    w.gk.assign(static_cast<size_t>(attended * E), C(0));
    w.gv.assign(static_cast<size_t>(attended * Ev), C(0));
    for (int64_t i0 = 0; i0 < L; i0 += block) {
      const int64_t rows = std::min(block, L - i0), cols = d.causal ? std::min(i0 + rows, S) : S;
      const auto qb = detail::as_compute(q + at.q.offset(b) + i0 * at.q.row_stride, rows, E, at.q.row_stride, w.q);
      const auto ob = detail::as_compute(o + at.o.offset(b) + i0 * at.o.row_stride, rows, Ev, at.o.row_stride, w.o);
      const auto gob =
          detail::as_compute(go + at.go.offset(b) + i0 * at.go.row_stride, rows, Ev, at.go.row_stride, w.go);
      w.p.resize(static_cast<size_t>(rows * cols));
      w.ds.resize(static_cast<size_t>(rows * cols));
      C* p = w.p.data();
      C* ds = w.ds.data();
      detail::attention_gemm<C>(rows, cols, E, qb.data, qb.ld, false, kb.data, kb.ld, true, p, cols, d.scale, 0);
      for (int64_t r = 0; r < rows; ++r) {
        C* row = p + r * cols;
        const int64_t n = math::attention_keys(i0 + r, S, d.causal);
        const C m = lse[b * L + i0 + r];
        for (int64_t j = 0; j < n; ++j) row[j] = math::vec_exp(row[j] - m);
        for (int64_t j = n; j < cols; ++j) row[j] = C(0);
      }
      // with dropout, the factors m once, and pd = p m: the weights o was made of
      const C* pd = p;
      if (d.dropout > 0) {
        w.m.assign(static_cast<size_t>(rows * cols), C(1));
        for (int64_t r = 0; r < rows; ++r)
          detail::attention_dropout_row(w.m.data() + r * cols, cols, b * L + i0 + r, d);
        w.pd.resize(static_cast<size_t>(rows * cols));
        for (int64_t i = 0; i < rows * cols; ++i) w.pd[i] = p[i] * w.m[i];
        pd = w.pd.data();
      }
      // dv += pd^T do, and dp = (do v^T) m (into ds)
      detail::attention_gemm<C>(cols, Ev, rows, pd, cols, true, gob.data, gob.ld, false, w.gv.data(), Ev, 1, 1);
      detail::attention_gemm<C>(rows, cols, Ev, gob.data, gob.ld, false, vb.data, vb.ld, true, ds, cols, 1, 0);
      if (d.dropout > 0)
        for (int64_t i = 0; i < rows * cols; ++i) ds[i] *= w.m[i];
      for (int64_t r = 0; r < rows; ++r) {
        C delta = C(0);
        for (int64_t e = 0; e < Ev; ++e) delta += gob.data[r * gob.ld + e] * ob.data[r * ob.ld + e];
        for (int64_t j = 0; j < cols; ++j)
          ds[r * cols + j] = math::attention_score_grad(p[r * cols + j], ds[r * cols + j], delta);
      }
      // dq = scale ds k, dk += scale ds^T q
      T* gqb = gq + at.gq.offset(b) + i0 * at.gq.row_stride;
      if constexpr (std::is_same_v<T, C>) {
        detail::attention_gemm<C>(rows, E, cols, ds, cols, false, kb.data, kb.ld, false, gqb, at.gq.row_stride,
                                  d.scale, 0);
      } else {
        w.gq.resize(static_cast<size_t>(rows * E));
        detail::attention_gemm<C>(rows, E, cols, ds, cols, false, kb.data, kb.ld, false, w.gq.data(), E, d.scale, 0);
        detail::store(w.gq.data(), gqb, rows, E, at.gq.row_stride);
      }
      detail::attention_gemm<C>(cols, E, rows, ds, cols, true, qb.data, qb.ld, false, w.gk.data(), E, d.scale, 1);
    }
    // keys no query attends get zeros
    w.gk.resize(static_cast<size_t>(S * E), C(0));
    w.gv.resize(static_cast<size_t>(S * Ev), C(0));
    detail::store(w.gk.data(), gk + at.gk.offset(b), S, E, at.gk.row_stride);
    detail::store(w.gv.data(), gv + at.gv.offset(b), S, Ev, at.gv.row_stride);
  });
}

}  // namespace strata::cpu
