// Per-channel kernels of batch normalization on raw pointers. The data is viewed as
// (N, C, S) with element strides (S: the spatial dims merged): NCHW data has S stride 1,
// channels-last data C stride 1. Two primitives make up the forward and the backward:
//
//   channel_sums    s1[c] = sum (u - su[c]),  s2[c] = sum (u - su[c]) * (v - sv[c])
//                   over n and s, accumulated in double (one pass over u and v)
//   channel_affine  out = a[c] * u + b[c] * v + k[c]   (v optional; one pass)
//
// Forward (training): channel_sums(x, x, shift) gives mean and variance (the shift, one
// sample of the channel, keeps the sum of squares from cancelling), then channel_affine
// normalizes. Backward: channel_sums(gy, x, 0, mean) gives sum(gy) and sum(gy * (x - mean)),
// then channel_affine forms the input gradient. After a fused ReLU, both take the forward's
// output as u's mask: u is read as ReluBackward(u, mask), so the ReLU's gradient is never
// written out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "../common/activation_grad_math.h"
#include "../common/half.h"
#include "../common/unary_math.h"
#include "parallel.h"

namespace strata::cpu {

struct ChannelShape {
  int64_t n = 0, c = 0, s = 0;
};

/// Element strides of an (N, C, S) view.
struct ChannelStrides {
  int64_t n = 0, c = 0, s = 0;
};

namespace bn_detail {

inline bool channels_inner(const ChannelShape& sh, const ChannelStrides& st) { return st.c == 1 || sh.c == 1; }

// At most this many chunks of rows: enough to keep any thread count busy.
inline constexpr int64_t kMaxChunks = 64;

// Splits `rows` into chunks and runs f(chunk, begin, end) on each, the chunks spread over the
// threads. The split depends on the sizes alone, never on the thread count, so partial sums
// combined in chunk order give the same statistics whatever set_num_threads says.
template <class F>
int64_t run_chunks(int64_t rows, int64_t row_len, const F& f) {
  const int64_t by_work = std::max<int64_t>(1, rows * std::max<int64_t>(row_len, 1) / kDefaultGrain);
  const int64_t chunks = std::max<int64_t>(1, std::min({kMaxChunks, rows, by_work}));
  parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) f(k, rows * k / chunks, rows * (k + 1) / chunks);
  });
  return chunks;
}

// Note [Float channel sums]
// For float data with unit spatial stride, a row's sums run in float over runs of kFloatRun
// elements (16 lanes, at most 64 elements per lane) whose totals join the double sums: one
// float vector pass instead of converting every element to double, which made the sums 3x
// slower than the affine pass. The shifts are used in float: su must be a float value (it
// is x[c] or zero), and the rounding of sv to float is corrected exactly in double, since
// sum (u - su)(v - sv) = sum (u - su)(v - fv) + (fv - sv) * sum (u - su).
inline constexpr int64_t kFloatRun = 1024;

template <bool kMasked>
inline void float_row_sums(const float* u, const float* mask, const float* v, int64_t n, double ku, double kv,
                           double& s1, double& s2) {
  using F16 = float __attribute__((vector_size(64)));
  const float fu = static_cast<float>(ku), fv = static_cast<float>(kv);
  double r1 = 0, r2 = 0;
  int64_t i = 0;
  while (i + 16 <= n) {
    const int64_t end = std::min(n, i + kFloatRun);
    F16 a = {}, b = {};
    for (; i + 16 <= end; i += 16) {
      F16 x, y;
      std::memcpy(&x, u + i, sizeof x);
      std::memcpy(&y, v + i, sizeof y);
      if constexpr (kMasked) {
        F16 m;
        std::memcpy(&m, mask + i, sizeof m);
        x = m > 0.f ? x : F16{};
      }
      x -= fu;
      y -= fv;
      a += x;
      b += x * y;
    }
    for (int l = 0; l < 16; ++l) r1 += a[l], r2 += b[l];
  }
  for (; i < n; ++i) {
    const double du = static_cast<double>(math::relu_masked(u, kMasked ? mask : nullptr, i)) - fu;
    r1 += du;
    r2 += du * (static_cast<double>(v[i]) - fv);
  }
  s1 += r1;
  s2 += r2 + (static_cast<double>(fv) - kv) * r1;
}

}  // namespace bn_detail

/// u and v share the strides st; su / sv are per-channel shifts (null: zero). s2 may be null.
/// With u_mask (u's strides), u is read as ReluBackward(u, u_mask).
template <class T>
void channel_sums(const T* u, const T* v, const ChannelShape& sh, const ChannelStrides& st, const double* su,
                  const double* sv, double* s1, double* s2, const T* u_mask = nullptr) {
  const int64_t C = sh.c;
  std::fill(s1, s1 + C, 0.0);
  if (s2) std::fill(s2, s2 + C, 0.0);
  if (sh.n * sh.s == 0 || C == 0) return;
  std::vector<double> zero(static_cast<size_t>(C), 0.0);
  const double* shift_u = su ? su : zero.data();
  const double* shift_v = sv ? sv : zero.data();
  const int64_t max_chunks = bn_detail::kMaxChunks;
  std::vector<double> part(static_cast<size_t>(2 * C * max_chunks), 0.0);
  int64_t chunks;
  if (bn_detail::channels_inner(sh, st)) {
    // rows are (n, s) positions, each holding C contiguous channels
    chunks = bn_detail::run_chunks(sh.n * sh.s, C, [&](int64_t k, int64_t b, int64_t e) {
      double* a1 = part.data() + 2 * C * k;
      double* a2 = a1 + C;
      for (int64_t r = b; r < e; ++r) {
        const int64_t off = (r / sh.s) * st.n + (r % sh.s) * st.s;
        const T* ur = u + off;
        const T* vr = v + off;
        const T* mr = u_mask ? u_mask + off : nullptr;
        for (int64_t c = 0; c < C; ++c) {
          const double du = static_cast<double>(math::relu_masked(ur, mr, c * st.c)) - shift_u[c];
          a1[c] += du;
          a2[c] += du * (static_cast<double>(vr[c * st.c]) - shift_v[c]);
        }
      }
    });
  } else {
    // rows are (n, c) lines of S elements
    chunks = bn_detail::run_chunks(sh.n * C, sh.s, [&](int64_t k, int64_t b, int64_t e) {
      double* a1 = part.data() + 2 * C * k;
      double* a2 = a1 + C;
      for (int64_t r = b; r < e; ++r) {
        const int64_t c = r % C, off = (r / C) * st.n + c * st.c;
        const T* ur = u + off;
        const T* vr = v + off;
        const T* mr = u_mask ? u_mask + off : nullptr;
        const double ku = shift_u[c], kv = shift_v[c];
        if constexpr (std::is_same_v<T, float>) {
          if (st.s == 1 && static_cast<double>(static_cast<float>(ku)) == ku) {
            if (mr) bn_detail::float_row_sums<true>(ur, mr, vr, sh.s, ku, kv, a1[c], a2[c]);
            else bn_detail::float_row_sums<false>(ur, nullptr, vr, sh.s, ku, kv, a1[c], a2[c]);
            continue;
          }
        }
        double l1[8] = {}, l2[8] = {};  // independent lanes, so the loop vectorizes
        int64_t i = 0;
        if (st.s == 1) {
          for (; i + 8 <= sh.s; i += 8)
            for (int l = 0; l < 8; ++l) {
              const double du = static_cast<double>(math::relu_masked(ur, mr, i + l)) - ku;
              l1[l] += du;
              l2[l] += du * (static_cast<double>(vr[i + l]) - kv);
            }
        }
        for (; i < sh.s; ++i) {
          const double du = static_cast<double>(math::relu_masked(ur, mr, i * st.s)) - ku;
          l1[0] += du;
          l2[0] += du * (static_cast<double>(vr[i * st.s]) - kv);
        }
        for (int l = 0; l < 8; ++l) a1[c] += l1[l], a2[c] += l2[l];
      }
    });
  }
  for (int64_t k = 0; k < chunks; ++k)
    for (int64_t c = 0; c < C; ++c) {
      s1[c] += part[2 * C * k + c];
      if (s2) s2[c] += part[2 * C * k + C + c];
    }
}

/// What the forward may fuse after its affine pass: a residual added (same strides as the
/// data; null: none) and a ReLU.
template <class T>
struct ChannelEpilogue {
  const T* residual = nullptr;
  bool relu = false;
};

/// out = a[c] * u + b[c] * v + k[c], with u, v and out sharing the strides st; v and b may
/// be null (the term is dropped). Coefficients are in T's compute type. The epilogue then
/// adds its residual and applies its ReLU, in the same pass. With u_mask (u's strides), u is
/// read as ReluBackward(u, u_mask).
template <class T>
void channel_affine(const T* u, const T* v, T* out, const ChannelShape& sh, const ChannelStrides& st,
                    const compute_t<T>* a, const compute_t<T>* b, const compute_t<T>* k,
                    const ChannelEpilogue<T>& epilogue = {}, const T* u_mask = nullptr) {
  using C = compute_t<T>;
  if (sh.n * sh.s == 0 || sh.c == 0) return;
  const bool with_v = v != nullptr && b != nullptr;
  const T* res = epilogue.residual;
  const bool relu = epilogue.relu, plain = !res && !relu;
  // one element at offset o of channel c, the general form
  auto value = [&](int64_t o, C ac, C bc, C kc) {
    const C uo = math::relu_masked(u, u_mask, o);
    C r = with_v ? ac * uo + bc * static_cast<C>(v[o]) + kc : ac * uo + kc;
    if (res) r += static_cast<C>(res[o]);
    return T(relu ? math::Relu{}(r) : r);
  };
  if (bn_detail::channels_inner(sh, st)) {
    parallel_for(0, sh.n * sh.s, std::max<int64_t>(1, kDefaultGrain / sh.c), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t off = (r / sh.s) * st.n + (r % sh.s) * st.s;
        const T* ur = u + off;
        T* o = out + off;
        if (plain && with_v && u_mask) {  // the backward after a ReLU
          const T *vr = v + off, *mr = u_mask + off;
          for (int64_t c = 0; c < sh.c; ++c)
            o[c * st.c] =
                T(a[c] * math::relu_masked(ur, mr, c * st.c) + b[c] * static_cast<C>(vr[c * st.c]) + k[c]);
        } else if (plain && with_v) {  // the backward
          const T* vr = v + off;
          for (int64_t c = 0; c < sh.c; ++c)
            o[c * st.c] = T(a[c] * static_cast<C>(ur[c * st.c]) + b[c] * static_cast<C>(vr[c * st.c]) + k[c]);
        } else if (plain && !u_mask) {  // the plain forward
          for (int64_t c = 0; c < sh.c; ++c) o[c * st.c] = T(a[c] * static_cast<C>(ur[c * st.c]) + k[c]);
        } else {
          for (int64_t c = 0; c < sh.c; ++c)
            o[c * st.c] = value(off + c * st.c, a[c], with_v ? b[c] : C(0), k[c]);
        }
      }
    });
    return;
  }
  parallel_for(0, sh.n * sh.c, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(sh.s, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t c = r % sh.c, off = (r / sh.c) * st.n + c * st.c;
      const C ac = a[c], bc = with_v ? b[c] : C(0), kc = k[c];
      const T* ur = u + off;
      T* o = out + off;
      if (st.s != 1 || (with_v && !plain) || (u_mask && !(with_v && plain))) {
        for (int64_t i = 0; i < sh.s; ++i) o[i * st.s] = value(off + i * st.s, ac, bc, kc);
        continue;
      }
      // contiguous runs, the common case, in loops the compiler vectorizes
      if (with_v && u_mask) {
        const T *vr = v + off, *mr = u_mask + off;
        for (int64_t i = 0; i < sh.s; ++i) {
          const C gi = math::ReluBackward{}(static_cast<C>(ur[i]), static_cast<C>(mr[i]));
          o[i] = T(ac * gi + bc * static_cast<C>(vr[i]) + kc);
        }
      } else if (with_v) {
        const T* vr = v + off;
        for (int64_t i = 0; i < sh.s; ++i) o[i] = T(ac * static_cast<C>(ur[i]) + bc * static_cast<C>(vr[i]) + kc);
      } else if (res) {
        const T* rr = res + off;
        if (relu) {
          for (int64_t i = 0; i < sh.s; ++i)
            o[i] = T(math::Relu{}(ac * static_cast<C>(ur[i]) + kc + static_cast<C>(rr[i])));
        } else {
          for (int64_t i = 0; i < sh.s; ++i) o[i] = T(ac * static_cast<C>(ur[i]) + kc + static_cast<C>(rr[i]));
        }
      } else if (relu) {
        for (int64_t i = 0; i < sh.s; ++i) o[i] = T(math::Relu{}(ac * static_cast<C>(ur[i]) + kc));
      } else {
        for (int64_t i = 0; i < sh.s; ++i) o[i] = T(ac * static_cast<C>(ur[i]) + kc);
      }
    }
  });
}

}  // namespace strata::cpu
