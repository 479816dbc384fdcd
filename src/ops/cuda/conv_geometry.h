// The geometry and memory layouts of the cuDNN convolutions (src/ops/cuda/conv.cpp): the sizes of
// a 2-d or 3-d problem checked as the CPU launchers check them, the full output size, and the
// dense layouts the operands are handed to cuDNN in.
#pragma once

#include <algorithm>
#include <array>
#include <climits>
#include <type_traits>

#include <strata/nn/functional_conv3d.hpp>
#include <strata/ops/creation.hpp>

namespace strata::cuda_conv {

namespace F = nn::functional;

struct Geometry {
  int64_t n, c, h, w;  // input activation
  int64_t o, kh, kw;   // filter (o, c / groups, [kd,] kh, kw)
  int64_t oh, ow;      // output activation
  int64_t sh, sw, ph, pw, dh, dw, groups;
  int rank = 2;  // spatial dims; the depth's sizes below are those of a 2-d problem unless 3
  int64_t d = 1, kd = 1, od = 1, sd = 1, pd = 0, dd = 1;

  int64_t in_volume() const { return c * d * h * w; }
  int64_t out_volume() const { return o * od * oh * ow; }
};

// The spatial sizes of an (N, C, ...) activation: 1 for the depth of a 4-d one.
inline std::array<int64_t, 3> spatial(const Tensor& t) {
  return t.dim() == 5 ? std::array<int64_t, 3>{t.size(2), t.size(3), t.size(4)}
                      : std::array<int64_t, 3>{1, t.size(2), t.size(3)};
}

// Stride, padding and dilation in (d, h, w) order; the depth's are 1, 0, 1 for a 2-d problem.
struct Window {
  int64_t s[3], p[3], dl[3], groups;
};
inline Window window(const F::Conv2dArgs& a) {
  return {{1, a.stride.h, a.stride.w}, {0, a.padding.h, a.padding.w}, {1, a.dilation.h, a.dilation.w}, a.groups};
}
inline Window window(const F::Conv3dArgs& a) {
  return {{a.stride.d, a.stride.h, a.stride.w}, {a.padding.d, a.padding.h, a.padding.w},
          {a.dilation.d, a.dilation.h, a.dilation.w}, a.groups};
}

inline int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

// The CPU launchers' checks (src/nn/conv.cpp, src/nn/conv3d_native.cpp), and one device and
// dtype for all operands. Args: F::Conv2dArgs (4-d operands) or F::Conv3dArgs (5-d ones).
template <class Args>
inline Geometry geometry(const char* op, const Tensor& x, const Tensor& w, const Tensor& y, const Args& a) {
  constexpr int rank = std::is_same_v<Args, F::Conv3dArgs> ? 3 : 2;
  STRATA_CHECK(x.dim() == rank + 2 && w.dim() == rank + 2 && y.dim() == rank + 2,
               "[{}] kernel needs {}-d operands, got {}, {}, {}", op, rank + 2, x.shape(), w.shape(), y.shape());
  STRATA_CHECK(x.dtype() == w.dtype() && y.dtype() == x.dtype() && x.device() == w.device() &&
                   y.device() == x.device(),
               "[{}] operands must share one dtype and device, got {} {}, {} {}, {} {}", op, x.dtype(), x.device(),
               w.dtype(), w.device(), y.dtype(), y.device());
  const auto in = spatial(x), k = spatial(w), out = spatial(y);
  const Window wd = window(a);
  const Geometry g{x.size(0), x.size(1), in[1], in[2], y.size(1), k[1], k[2], out[1], out[2], wd.s[1], wd.s[2],
                   wd.p[1], wd.p[2], wd.dl[1], wd.dl[2], wd.groups, rank, in[0], k[0], out[0], wd.s[0], wd.p[0],
                   wd.dl[0]};
  STRATA_CHECK(g.groups > 0 && g.c % g.groups == 0 && g.o % g.groups == 0 && w.size(0) == g.o &&
                   w.size(1) * g.groups == g.c && y.size(0) == g.n,
               "[{}] kernel operands do not match: x {}, w {}, y {}, groups {}", op, x.shape(), w.shape(), y.shape(),
               g.groups);
  for (int i = 0; i < 3; ++i) {
    STRATA_CHECK(k[i] > 0 && wd.s[i] > 0 && wd.dl[i] > 0 && wd.p[i] >= 0 && wd.s[i] <= INT_MAX &&
                     wd.dl[i] <= INT_MAX && wd.p[i] <= INT_MAX,
                 "[{}] bad kernel arguments", op);
    STRATA_CHECK(out[i] >= 1 && out[i] <= conv_out(in[i], k[i], wd.s[i], wd.p[i], wd.dl[i]),
                 "[{}] output {} does not fit the input {}", op, y.shape(), x.shape());
  }
  return g;
}

// The geometry cuDNN sees: the full output size.
inline Geometry full_output(Geometry g) {
  g.od = conv_out(g.d, g.kd, g.sd, g.pd, g.dd);
  g.oh = conv_out(g.h, g.kh, g.sh, g.ph, g.dh);
  g.ow = conv_out(g.w, g.kw, g.sw, g.pw, g.dw);
  return g;
}

inline bool full_size(const Tensor& t, const Geometry& full) {
  return spatial(t) == std::array<int64_t, 3>{full.od, full.oh, full.ow};
}

// The first `d, h, w` of t's spatial dims (h, w for a 4-d t).
inline Tensor leading(const Tensor& t, int64_t d, int64_t h, int64_t w) {
  const int64_t first = t.dim() - 2;  // the height's dim
  Tensor r = t.slice(first, 0, h).slice(first + 1, 0, w);
  return t.dim() == 5 ? r.slice(2, 0, d) : r;
}

// ---- layouts ---------------------------------------------------------------------------------

inline bool strictly_channels_last(const Tensor& t) {
  return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(MemoryFormat::ChannelsLast);
}

inline MemoryFormat layout_for(const Tensor& a, const Tensor& b) {
  return strictly_channels_last(a) || strictly_channels_last(b) ? MemoryFormat::ChannelsLast
                                                                 : MemoryFormat::Contiguous;
}

inline Tensor dense(const Tensor& t, MemoryFormat f) { return t.is_contiguous(f) ? t : t.to(f); }

inline Tensor empty_in(const Shape& s, const Tensor& like, MemoryFormat f) {
  const TensorOptions o(like.dtype(), like.device());
  if (f == MemoryFormat::Contiguous) return empty(s, o);
  return empty({s[0], s[2], s[3], s[1]}, o).permute({0, 3, 1, 2});
}

// An output the kernel can write in layout f: `out` itself, or a temporary to copy back.
inline Tensor writable(const Tensor& out, MemoryFormat f) {
  return out.is_contiguous(f) ? out : empty_in(out.shape(), out, f);
}

// The output activation's shape at the full output size of g.
inline Shape full_shape(const Geometry& g) {
  return g.rank == 3 ? Shape{g.n, g.o, g.od, g.oh, g.ow} : Shape{g.n, g.o, g.oh, g.ow};
}

// dy zero-padded at the end of each spatial dim to the full output size of g.
inline Tensor padded_to_full(const Tensor& dy, const Geometry& g, MemoryFormat f) {
  if (full_size(dy, g)) return dy;
  Tensor full = empty_in(full_shape(g), dy, f);
  full.zero_();
  const auto s = spatial(dy);
  leading(full, s[0], s[1], s[2]).copy_(dy);
  return full;
}

}  // namespace strata::cuda_conv
