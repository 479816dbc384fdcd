// Fused CPU optimizer updates over contiguous memory: one pass per parameter reads the
// parameter, its gradient and its state and writes the parameter and the state, with the
// per-element math of kernels/common/optim_math.h. LAMB needs the norms of the weights and
// of the update before it can apply the update, so it takes two passes; the norms are summed
// in fixed chunks, in order, so the result does not depend on the thread count.
//
// The math runs in double whatever the storage type (float or double), so each stored value
// is rounded once from the published rule's float64 result, with two exceptions for float
// parameters: Adam's denominator (Note [Adam denominator in float]) and SGD. 8-bit Adam keeps
// its moments in float, as its codes are decoded to.
//
// Note [SGD in the parameter's type]
// SGD's update is two multiply-adds per element; in double, the conversions to and from the
// stored floats were most of its cost (0.8-0.9x LibTorch's two-pass step at 10M parameters,
// 1.7x in float). Float rounding of the buffer and the parameter stays within the tests'
// 1e-6 of the float64 rule over 200 steps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../common/optim_math.h"
#include "../common/quant8.h"
#include "parallel.h"

namespace strata::cpu {

// Optimizer loops touch 3-5 streams per element: a second thread pays off sooner than for
// plain elementwise ops.
inline constexpr int64_t kOptimGrain = 16384;
inline constexpr int64_t kNormChunk = 65536;

// Note [Optimizer prefetch]
// An update streams 3-7 arrays from memory at once, more than the hardware prefetchers keep
// ahead of: each thread waited on DRAM for part of every pass (AdamW at 10M parameters on 2
// cores: 37.5 -> 44.9 GB/s in bench_ops, 27 -> 47 in a standalone loop). So the loops run in
// chunks of kPrefetchChunk elements, and before each chunk every stream is prefetched
// kPrefetchAhead elements ahead (4 KiB for float), clamped to the thread's range. The chunks
// do not change the order of any arithmetic.
inline constexpr int64_t kPrefetchChunk = 64;
inline constexpr int64_t kPrefetchAhead = 1024;

template <class S>
inline void prefetch_ahead(const S* stream, int64_t i0, int64_t e) {
  constexpr int64_t per_line = std::max<int64_t>(1, 64 / static_cast<int64_t>(sizeof(S)));
  for (int64_t l = 0; l < kPrefetchChunk; l += per_line)
    __builtin_prefetch(stream + std::min(e - 1, i0 + kPrefetchAhead + l));
}

// update(i) for every i in [0, n), on the OpenMP threads, in chunks whose streams are
// prefetched ahead first. A null stream (an optional state) is skipped.
template <class Update, class... S>
inline void for_each_prefetched(int64_t n, const Update& update, const S*... streams) {
  parallel_for(0, n, kOptimGrain, [&](int64_t b, int64_t e) {
    for (int64_t i0 = b; i0 < e; i0 += kPrefetchChunk) {
      ((streams ? prefetch_ahead(streams, i0, e) : void()), ...);
      const int64_t i1 = std::min(e, i0 + kPrefetchChunk);
      for (int64_t i = i0; i < i1; ++i) update(i);
    }
  });
}

// SGD runs in the parameter's own type (Note [SGD in the parameter's type]).
template <class T>
math::SgdConsts<T> sgd_consts_as(const math::SgdConsts<double>& c) {
  return {T(c.lr), T(c.momentum), T(c.one_minus_dampening), T(c.weight_decay), c.nesterov, c.maximize};
}

template <class T>
void sgd_step(T* p, const T* g, int64_t n, const math::SgdConsts<double>& cd) {
  const math::SgdConsts<T> c = sgd_consts_as<T>(cd);
  for_each_prefetched(n, [&](int64_t i) { math::sgd_update(p[i], g[i], c); }, p, g);
}

template <class T>
void sgd_momentum_step(T* p, const T* g, T* buf, bool first, int64_t n, const math::SgdConsts<double>& cd) {
  const math::SgdConsts<T> c = sgd_consts_as<T>(cd);
  for_each_prefetched(n, [&](int64_t i) { math::sgd_momentum_update(p[i], g[i], buf[i], first, c); }, p, g, buf);
}

// Note [Adam denominator in float]
// The square root and the division of Adam's step are the only costly operations of the
// update: in double, AVX-512 does them 4-8x slower than in float, enough to make the loop
// compute-bound (about 21 GB/s on 2 cores where the memory gives 54). For float parameters
// they run in float on the float-rounded moments: an error of 1e-7 relative of a step of
// size lr, far below the rounding of the stored parameter. The moments and the parameter's
// own update stay in double.
template <class T>
struct AdamStep {
  math::AdamConsts<double> c;
  float inv_bc2_sqrt = static_cast<float>(1 / c.bc2_sqrt), eps = static_cast<float>(c.eps);
  // p from its (already updated) first moment m and denominator moment vhat
  void apply(double& p, double m, double vhat) const {
    if constexpr (std::is_same_v<T, float>) {
      const float ratio = static_cast<float>(m) / (std::sqrt(static_cast<float>(vhat)) * inv_bc2_sqrt + eps);
      p = p * c.decay - c.step_size * static_cast<double>(ratio);
    } else {
      math::adam_apply(p, m, vhat, c);
    }
  }
};

// vmax is null unless AMSGrad.
template <class T>
void adam_step(T* p, const T* g, T* m, T* v, T* vmax, int64_t n, const math::AdamConsts<double>& c) {
  const AdamStep<T> step{c};
  if (vmax) {
    for_each_prefetched(
        n,
        [&](int64_t i) {
          double pi = p[i], mi = m[i], vi = v[i], xi = vmax[i];
          math::adam_moments(math::adam_grad(pi, double(g[i]), c), mi, vi, c);
          xi = (xi >= vi || xi != xi) ? xi : vi;  // NaN-propagating max, as torch.maximum
          step.apply(pi, mi, xi);
          p[i] = T(pi), m[i] = T(mi), v[i] = T(vi), vmax[i] = T(xi);
        },
        p, g, m, v, vmax);
  } else {
    for_each_prefetched(
        n,
        [&](int64_t i) {
          double pi = p[i], mi = m[i], vi = v[i];
          math::adam_moments(math::adam_grad(pi, double(g[i]), c), mi, vi, c);
          step.apply(pi, mi, vi);
          p[i] = T(pi), m[i] = T(mi), v[i] = T(vi);
        },
        p, g, m, v);
  }
}

template <class T>
void adagrad_step(T* p, const T* g, T* sum, int64_t n, const math::AdagradConsts<double>& c) {
  for_each_prefetched(
      n,
      [&](int64_t i) {
        double pi = p[i], si = sum[i];
        math::adagrad_update(pi, double(g[i]), si, c);
        p[i] = T(pi), sum[i] = T(si);
      },
      p, g, sum);
}

// gavg is null unless centered, buf null unless momentum > 0.
template <class T>
void rmsprop_step(T* p, const T* g, T* sq, T* gavg, T* buf, int64_t n, const math::RmspropConsts<double>& c) {
  auto run = [&](auto centered, auto momentum) {
    constexpr bool kC = decltype(centered)::value, kM = decltype(momentum)::value;
    for_each_prefetched(
        n,
        [&](int64_t i) {
          double pi = p[i], si = sq[i], ai = kC ? double(gavg[i]) : 0.0, bi = kM ? double(buf[i]) : 0.0;
          math::rmsprop_update<kC, kM>(pi, double(g[i]), si, ai, bi, c);
          p[i] = T(pi), sq[i] = T(si);
          if constexpr (kC) gavg[i] = T(ai);
          if constexpr (kM) buf[i] = T(bi);
        },
        p, g, sq, gavg, buf);
  };
  using F = std::false_type;
  using Tr = std::true_type;
  if (gavg && buf) run(Tr{}, Tr{});
  else if (gavg) run(Tr{}, F{});
  else if (buf) run(F{}, Tr{});
  else run(F{}, F{});
}

// LAMB pass 1: updates m and v; returns {||p||^2, ||u||^2} with u the update direction.
template <class T>
void lamb_moments_and_norms(const T* p, const T* g, T* m, T* v, int64_t n, const math::LambConsts<double>& c,
                            double& p_sq, double& u_sq) {
  int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> part(static_cast<size_t>(2 * chunks), 0.0);
  parallel_for(0, chunks, std::max<int64_t>(1, kOptimGrain / kNormChunk), [&](int64_t cb, int64_t ce) {
    for (int64_t k = cb; k < ce; ++k) {
      int64_t b = k * kNormChunk, e = std::min(n, b + kNormChunk);
      double ps = 0, us = 0;
      for (int64_t i = b; i < e; ++i) {
        double mi = m[i], vi = v[i];
        math::lamb_moments(double(g[i]), mi, vi, c);
        m[i] = T(mi), v[i] = T(vi);
        // from the stored moments, so that pass 2 recomputes exactly this u
        double u = math::lamb_direction(double(p[i]), double(m[i]), double(v[i]), c);
        ps += double(p[i]) * double(p[i]);
        us += u * u;
      }
      part[2 * k] = ps;
      part[2 * k + 1] = us;
    }
  });
  p_sq = u_sq = 0;
  for (int64_t k = 0; k < chunks; ++k) p_sq += part[2 * k], u_sq += part[2 * k + 1];
}

// LAMB pass 2: p -= scaled_lr * u, u recomputed from the new m, v (bitwise the u of pass 1).
template <class T>
void lamb_apply(T* p, const T* m, const T* v, int64_t n, double scaled_lr, const math::LambConsts<double>& c) {
  for_each_prefetched(
      n, [&](int64_t i) { p[i] = T(double(p[i]) - scaled_lr * math::lamb_direction(double(p[i]), double(m[i]), double(v[i]), c)); },
      p, m, v);
}

// Adam with both moments stored blockwise in 8 bits (kernels/common/quant8.h). Per block:
// dequantize m and v into registers-sized local buffers, apply the Adam step with the fp32
// moments (the parameter sees them before requantization, as in bitsandbytes), then store new
// absmax scales and codes. `block` <= quant8::kMaxBlock.
template <class T>
void adam8bit_step(T* p, const T* g, uint8_t* m_codes, float* m_absmax, uint8_t* v_codes, float* v_absmax,
                   int64_t n, int64_t block, const float* signed_map, const float* unsigned_map,
                   const math::AdamConsts<T>& c) {
  int64_t blocks = (n + block - 1) / block;
  parallel_for(0, blocks, std::max<int64_t>(1, kOptimGrain / block), [&](int64_t kb, int64_t ke) {
    T m[quant8::kMaxBlock], v[quant8::kMaxBlock];
    for (int64_t k = kb; k < ke; ++k) {
      int64_t b = k * block, len = std::min(n, b + block) - b;
      quant8::dequantize_block(signed_map, m_codes + b, len, m_absmax[k], m);
      quant8::dequantize_block(unsigned_map, v_codes + b, len, v_absmax[k], v);
      for (int64_t i = 0; i < len; ++i) math::adam_update(p[b + i], g[b + i], m[i], v[i], c);
      m_absmax[k] = quant8::block_absmax(m, len);
      v_absmax[k] = quant8::block_absmax(v, len);
      quant8::quantize_block(signed_map, m, len, m_absmax[k], m_codes + b);
      quant8::quantize_block(unsigned_map, v, len, v_absmax[k], v_codes + b);
    }
  });
}

}  // namespace strata::cpu
