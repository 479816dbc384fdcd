// The reference convolution: im2col + GEMM per image and group, for f32 and f64 arrays in
// any strided layout. It is the path for f64 (which oneDNN lacks), for builds without
// oneDNN, and for problems oneDNN has no fast kernel for.
//
// Shapes per image n and group g (Cg = c_in / groups, Og = c_out / groups, P = h_out*w_out,
// K = Cg*kh*kw):
//   forward           dst_g (Og, P)  = W_g (Og, K) * col_g (K, P)
//   backward data     col_g (K, P)   = W_g^T (K, Og) * dst_g (Og, P), then col2im into src
//   backward weights  dW_g (Og, K)  += dst_g (Og, P) * col_g^T (P, K)
// A channel slab of an NCHW array is a row-major (rows, P) matrix; of an NHWC array, a
// transposed one. Both are read and written in place; other layouts go through a packed copy.
#include <algorithm>
#include <optional>
#include <stdexcept>
#include <vector>

#include "conv.h"
#include "gemm.h"
#include "parallel.h"

namespace strata::cpu {

namespace {

template <class T> constexpr GemmType gemm_type_of() { return sizeof(T) == 8 ? GemmType::F64 : GemmType::F32; }

template <class T> T* at(const Array4& a, int64_t n, int64_t c, int64_t h, int64_t w) {
  return static_cast<T*>(a.data) + n * a.stride[0] + c * a.stride[1] + h * a.stride[2] + w * a.stride[3];
}

// The (rows, h*w) matrix of channels [c0, c0 + rows) of image n, as a GEMM operand read in
// place, when the strides allow it (see matmul's in_place_layout for the same rule).
template <class T>
std::optional<GemmInput> channel_matrix(const Array4& a, int64_t n, int64_t c0, int64_t rows, int64_t h, int64_t w) {
  const int64_t cols = h * w;
  if (h > 1 && w > 1 && a.stride[2] != w * a.stride[3]) return std::nullopt;  // spatial dims do not merge
  const int64_t sc = a.stride[1], sp = w > 1 ? a.stride[3] : a.stride[2];
  const void* base = at<T>(a, n, c0, 0, 0);
  if ((cols <= 1 || sp == 1) && (rows <= 1 || sc >= std::max<int64_t>(cols, 1)))
    return GemmInput{base, rows <= 1 ? std::max<int64_t>(cols, 1) : sc, 0, false};
  if ((rows <= 1 || sc == 1) && (cols <= 1 || sp >= std::max<int64_t>(rows, 1)))
    return GemmInput{base, cols <= 1 ? std::max<int64_t>(rows, 1) : sp, 0, true};
  return std::nullopt;
}

// Copies channels [c0, c0 + rows) of image n between a strided array and a packed (rows, P) buffer.
template <class T>
void pack_channels(const Array4& a, int64_t n, int64_t c0, int64_t rows, int64_t h, int64_t w, T* buf, bool to_buf) {
  parallel_for(0, rows, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(h * w, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          T* s = at<T>(a, n, c0 + r, y, x);
          T* d = buf + (r * h + y) * w + x;
          if (to_buf) *d = *s;
          else *s = *d;
        }
  });
}

// C = A * B + beta * C into channels [c0, c0 + rows) of image n of `out` (rows, P).
template <class T>
void gemm_into(const Array4& out, int64_t n, int64_t c0, int64_t rows, int64_t h, int64_t w, const GemmInput& a,
               const GemmInput& b, int64_t k, double beta, std::vector<T>& tmp) {
  const int64_t cols = h * w;
  GemmProblem p;
  p.type = gemm_type_of<T>();
  p.k = k;
  p.beta = beta;
  auto m = channel_matrix<T>(out, n, c0, rows, h, w);
  if (m && !m->trans) {
    p.m = rows, p.n = cols, p.a = a, p.b = b;
    p.c = GemmOutput{const_cast<void*>(m->data), m->ld, 0};
    gemm(p);
  } else if (m) {  // stored transposed: C^T = B^T * A^T
    p.m = cols, p.n = rows;
    p.a = GemmInput{b.data, b.ld, 0, !b.trans};
    p.b = GemmInput{a.data, a.ld, 0, !a.trans};
    p.c = GemmOutput{const_cast<void*>(m->data), m->ld, 0};
    gemm(p);
  } else {
    tmp.resize(static_cast<size_t>(rows * cols));
    if (beta != 0) pack_channels<T>(out, n, c0, rows, h, w, tmp.data(), true);
    p.m = rows, p.n = cols, p.a = a, p.b = b;
    p.c = GemmOutput{tmp.data(), std::max<int64_t>(cols, 1), 0};
    gemm(p);
    pack_channels<T>(out, n, c0, rows, h, w, tmp.data(), false);
  }
}

// Channels [c0, c0 + rows) of image n as a GEMM operand: in place, or packed into buf.
template <class T>
GemmInput channels_operand(const Array4& a, int64_t n, int64_t c0, int64_t rows, int64_t h, int64_t w,
                           std::vector<T>& buf) {
  if (auto m = channel_matrix<T>(a, n, c0, rows, h, w)) return *m;
  buf.resize(static_cast<size_t>(rows * h * w));
  pack_channels<T>(a, n, c0, rows, h, w, buf.data(), true);
  return GemmInput{buf.data(), std::max<int64_t>(h * w, 1), 0, false};
}

// col (K, P) for group channels [c0, c0 + Cg) of image n.
template <class T>
void im2col(const ConvGeometry& g, const Array4& src, int64_t n, int64_t c0, T* col) {
  const int64_t cg = g.c_in / g.groups, kk = g.kh * g.kw, P = g.h_out * g.w_out;
  parallel_for(0, cg * kk, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(P, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t ci = r / kk, p = (r / g.kw) % g.kh, q = r % g.kw;
      const T* plane = at<T>(src, n, c0 + ci, 0, 0);
      T* out = col + r * P;
      for (int64_t oy = 0; oy < g.h_out; ++oy) {
        const int64_t iy = oy * g.stride_h - g.pad_h + p * g.dil_h;
        T* row = out + oy * g.w_out;
        if (iy < 0 || iy >= g.h_in) {
          std::fill(row, row + g.w_out, T(0));
          continue;
        }
        for (int64_t ox = 0; ox < g.w_out; ++ox) {
          const int64_t ix = ox * g.stride_w - g.pad_w + q * g.dil_w;
          row[ox] = ix >= 0 && ix < g.w_in ? plane[iy * src.stride[2] + ix * src.stride[3]] : T(0);
        }
      }
    }
  });
}

// src[n, c0 + ...] += col2im(col); each thread owns whole channels, so no two write one element.
template <class T>
void col2im_add(const ConvGeometry& g, const T* col, const Array4& src, int64_t n, int64_t c0) {
  const int64_t cg = g.c_in / g.groups, kk = g.kh * g.kw, P = g.h_out * g.w_out;
  parallel_for(0, cg, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(kk * P, 1)), [&](int64_t b, int64_t e) {
    for (int64_t ci = b; ci < e; ++ci) {
      T* plane = at<T>(src, n, c0 + ci, 0, 0);
      for (int64_t pq = 0; pq < kk; ++pq) {
        const int64_t p = pq / g.kw, q = pq % g.kw;
        const T* in = col + (ci * kk + pq) * P;
        for (int64_t oy = 0; oy < g.h_out; ++oy) {
          const int64_t iy = oy * g.stride_h - g.pad_h + p * g.dil_h;
          if (iy < 0 || iy >= g.h_in) continue;
          for (int64_t ox = 0; ox < g.w_out; ++ox) {
            const int64_t ix = ox * g.stride_w - g.pad_w + q * g.dil_w;
            if (ix >= 0 && ix < g.w_in) plane[iy * src.stride[2] + ix * src.stride[3]] += in[oy * g.w_out + ox];
          }
        }
      }
    }
  });
}

// weight (c_out, Cg, kh, kw), strided <-> packed row-major (c_out, K).
template <class T>
void pack_weight(const ConvGeometry& g, const Array4& w, T* packed, bool to_packed) {
  const int64_t cg = g.c_in / g.groups;
  for (int64_t o = 0; o < g.c_out; ++o)
    for (int64_t i = 0; i < cg; ++i)
      for (int64_t p = 0; p < g.kh; ++p)
        for (int64_t q = 0; q < g.kw; ++q) {
          T* s = at<T>(w, o, i, p, q);
          T* d = packed + ((o * cg + i) * g.kh + p) * g.kw + q;
          if (to_packed) *d = *s;
          else *s = *d;
        }
}

template <class T>
void fill_array(const Array4& a, int64_t n, int64_t c, int64_t h, int64_t w) {
  parallel_for(0, n * c, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(h * w, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) *at<T>(a, r / c, r % c, y, x) = T(0);
  });
}

template <class T>
void forward(const ConvProblem& pr) {
  const ConvGeometry& g = pr.g;
  const int64_t cg = g.c_in / g.groups, og = g.c_out / g.groups, K = cg * g.kh * g.kw, P = g.h_out * g.w_out;
  if (g.n == 0 || g.c_out == 0 || P == 0) return;
  std::vector<T> w(static_cast<size_t>(g.c_out * K)), col(static_cast<size_t>(K * P)), tmp;
  pack_weight<T>(g, pr.weight, w.data(), true);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      im2col<T>(g, pr.src, n, gi * cg, col.data());
      GemmInput a{w.data() + gi * og * K, std::max<int64_t>(K, 1), 0, false};
      GemmInput b{col.data(), std::max<int64_t>(P, 1), 0, false};
      gemm_into<T>(pr.dst, n, gi * og, og, g.h_out, g.w_out, a, b, K, 0.0, tmp);
    }
  if (!pr.bias) return;
  const T* bias = static_cast<const T*>(pr.bias);
  parallel_for(0, g.n * g.c_out, std::max<int64_t>(1, kDefaultGrain / P), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t y = 0; y < g.h_out; ++y)
        for (int64_t x = 0; x < g.w_out; ++x) *at<T>(pr.dst, r / g.c_out, r % g.c_out, y, x) += bias[r % g.c_out];
  });
}

template <class T>
void backward_data(const ConvProblem& pr) {
  const ConvGeometry& g = pr.g;
  const int64_t cg = g.c_in / g.groups, og = g.c_out / g.groups, K = cg * g.kh * g.kw, P = g.h_out * g.w_out;
  fill_array<T>(pr.src, g.n, g.c_in, g.h_in, g.w_in);
  if (g.n == 0 || K == 0 || P == 0) return;
  std::vector<T> w(static_cast<size_t>(g.c_out * K)), col(static_cast<size_t>(K * P)), buf;
  pack_weight<T>(g, pr.weight, w.data(), true);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      GemmProblem p;
      p.type = gemm_type_of<T>();
      p.m = K, p.n = P, p.k = og;
      p.a = GemmInput{w.data() + gi * og * K, K, 0, true};  // W_g^T (K, Og)
      p.b = channels_operand<T>(pr.dst, n, gi * og, og, g.h_out, g.w_out, buf);
      p.c = GemmOutput{col.data(), P, 0};
      gemm(p);
      col2im_add<T>(g, col.data(), pr.src, n, gi * cg);
    }
}

template <class T>
void backward_weights(const ConvProblem& pr) {
  const ConvGeometry& g = pr.g;
  const int64_t cg = g.c_in / g.groups, og = g.c_out / g.groups, K = cg * g.kh * g.kw, P = g.h_out * g.w_out;
  std::vector<T> dw(static_cast<size_t>(g.c_out * K), T(0)), col(static_cast<size_t>(K * P)), buf;
  if (P > 0 && K > 0)
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t gi = 0; gi < g.groups; ++gi) {
        im2col<T>(g, pr.src, n, gi * cg, col.data());
        GemmProblem p;
        p.type = gemm_type_of<T>();
        p.m = og, p.n = K, p.k = P, p.beta = 1;
        p.a = channels_operand<T>(pr.dst, n, gi * og, og, g.h_out, g.w_out, buf);
        p.b = GemmInput{col.data(), P, 0, true};  // col^T (P, K)
        p.c = GemmOutput{dw.data() + gi * og * K, K, 0};
        gemm(p);
      }
  pack_weight<T>(g, pr.weight, dw.data(), false);
  if (!pr.bias) return;
  T* db = static_cast<T*>(pr.bias);
  parallel_for(0, g.c_out, 1, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      double s = 0;
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t y = 0; y < g.h_out; ++y)
          for (int64_t x = 0; x < g.w_out; ++x) s += static_cast<double>(*at<T>(pr.dst, n, o, y, x));
      db[o] = static_cast<T>(s);
    }
  });
}

// The int8 layers keep their own reference (src/quant/qconv.cpp).
void check_float(const ConvProblem& p) {
  if (p.type == ConvType::U8S8) throw std::invalid_argument("[conv2d] the reference takes float32 or float64 only");
}

}  // namespace

void conv_forward_ref(const ConvProblem& p) {
  check_float(p);
  p.type == ConvType::F64 ? forward<double>(p) : forward<float>(p);
}
void conv_backward_data_ref(const ConvProblem& p) {
  check_float(p);
  p.type == ConvType::F64 ? backward_data<double>(p) : backward_data<float>(p);
}
void conv_backward_weights_ref(const ConvProblem& p) {
  check_float(p);
  p.type == ConvType::F64 ? backward_weights<double>(p) : backward_weights<float>(p);
}

void conv_forward(const ConvProblem& p) {
  if (!conv_forward_dnnl(p)) conv_forward_ref(p);
}
void conv_backward_data(const ConvProblem& p) {
  if (!conv_backward_data_dnnl(p)) conv_backward_data_ref(p);
}
void conv_backward_weights(const ConvProblem& p) {
  if (!conv_backward_weights_dnnl(p)) conv_backward_weights_ref(p);
}

}  // namespace strata::cpu
