// The one CUDA launcher for elementwise kernels: out[i] = f(in0[i], in1[i], ...) over a
// StridedLoop (kernels/common/strided_loop.h, the same merged dims as the CPU driver).
// Contiguous operands take a flat path with 16-byte vector loads/stores when every pointer is
// aligned; otherwise an offset calculator turns the flat index into per-operand offsets, for
// whole 16-byte vectors when every operand's innermost dim allows (vector_loop).
// Indexing is 32-bit unless numel or any reachable offset may pass 2^31. Grid-stride loops,
// so the grid size is bounded and independent of numel.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>

#include "../common/strided_loop.h"

namespace strata::cuda_kernels {

inline constexpr int kThreads = 256;

// Per-operand offsets for a flat index, innermost dim first. Index is int32_t or int64_t.
template <int N, class Index>
struct OffsetCalc {
  int ndim;
  Index shape[kMaxLoopDims];
  Index strides[N][kMaxLoopDims];

  __device__ __forceinline__ void get(Index i, Index (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = 0; d < ndim; ++d) {
      Index q = i / shape[d];
      Index r = i - q * shape[d];
      i = q;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
    }
  }
};

template <class T, int V>
struct alignas(sizeof(T) * V) Vec { T v[V]; };

template <class Out, class F, class... In>
__global__ void flat_kernel(int64_t n, F f, Out* __restrict__ out, const In* __restrict__... in) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) out[i] = f(in[i]...);
}

// V elements per thread per step; the tail (n % V) is done by the plain flat kernel.
template <int V, class Out, class F, class... In>
__global__ void vec_kernel(int64_t nvec, F f, Out* __restrict__ out, const In* __restrict__... in) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += step) {
    Vec<Out, V> o;
    auto load = [i](const auto* p) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(p)>>;
      return reinterpret_cast<const Vec<T, V>*>(p)[i];
    };
    [&](auto... vs) {
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = f(vs.v[j]...);
    }(load(in)...);
    reinterpret_cast<Vec<Out, V>*>(out)[i] = o;
  }
}

template <class Index, class Out, class F, size_t... I, class... In>
__device__ __forceinline__ void strided_body(Index n, const OffsetCalc<1 + sizeof...(In), Index>& calc, F f,
                                             Out* out, std::index_sequence<I...>, const In*... in) {
  constexpr int N = 1 + sizeof...(In);
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Index off[N];
    calc.get(i, off);
    out[off[0]] = f(in[off[I + 1]]...);
  }
}

template <class Index, class Out, class F, class... In>
__global__ void strided_kernel(Index n, OffsetCalc<1 + sizeof...(In), Index> calc, F f, Out* out, const In*... in) {
  strided_body(n, calc, f, out, std::index_sequence_for<In...>{}, in...);
}

// V copies of one value: an input broadcast along the innermost dim.
template <int V, class T>
__device__ __forceinline__ Vec<T, V> splat(T x) {
  Vec<T, V> r;
#pragma unroll
  for (int j = 0; j < V; ++j) r.v[j] = x;
  return r;
}

// The V-element vector of input p at offset off: in units of vectors, or of elements for an
// input broadcast along the innermost dim (bit k of `splats` for input k).
template <int V, class T>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p, int64_t off, bool broadcast) {
  return broadcast ? splat<V>(p[off]) : reinterpret_cast<const Vec<T, V>*>(p)[off];
}

// The strided loop over V-element vectors (see vector_loop).
template <int V, class Index, class Out, class F, size_t... I, class... In>
__device__ __forceinline__ void strided_vec_body(Index n, const OffsetCalc<1 + sizeof...(In), Index>& calc,
                                                 unsigned splats, F f, Out* out, std::index_sequence<I...>,
                                                 const In*... in) {
  constexpr int N = 1 + sizeof...(In);
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Index off[N];
    calc.get(i, off);
    Vec<Out, V> o;
    [&](auto... vs) {
#pragma unroll
      for (int j = 0; j < V; ++j) o.v[j] = f(vs.v[j]...);
    }(load_vec<V>(in, off[I + 1], (splats >> (I + 1)) & 1u)...);
    reinterpret_cast<Vec<Out, V>*>(out)[off[0]] = o;
  }
}

template <int V, class Index, class Out, class F, class... In>
__global__ void strided_vec_kernel(Index n, OffsetCalc<1 + sizeof...(In), Index> calc, unsigned splats, F f,
                                   Out* out, const In*... in) {
  strided_vec_body<V>(n, calc, splats, f, out, std::index_sequence_for<In...>{}, in...);
}

inline constexpr int64_t kMaxBlocks = 65536;

inline int grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  // enough blocks to fill any current GPU many times over; the loop strides past the rest
  return static_cast<int>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <int N, class Index>
OffsetCalc<N, Index> make_calc(const StridedLoop<N>& loop) {
  OffsetCalc<N, Index> c{};
  c.ndim = loop.ndim;
  for (int d = 0; d < loop.ndim; ++d) {
    c.shape[d] = static_cast<Index>(loop.shape[d]);
    for (int k = 0; k < N; ++k) c.strides[k][d] = static_cast<Index>(loop.strides[k][d]);
  }
  return c;
}

// Whether every element offset stays below 2^31 (strides may be negative: bound by |s|), and
// the grid-stride loop's index too: it may step one whole grid past numel before stopping.
template <int N>
bool fits_int32(const StridedLoop<N>& loop) {
  constexpr int64_t kMax = int64_t(1) << 31;
  if (loop.numel >= kMax - kMaxBlocks * kThreads) return false;
  for (int k = 0; k < N; ++k) {
    int64_t reach = 0;
    for (int d = 0; d < loop.ndim; ++d) {
      int64_t s = loop.strides[k][d] < 0 ? -loop.strides[k][d] : loop.strides[k][d];
      reach += (loop.shape[d] - 1) * s;
    }
    if (reach >= kMax) return false;
  }
  return true;
}

// The loop in units of V-element vectors, when every operand runs unit-stride along the
// innermost dim in whole 16-byte-aligned vectors (a transpose that keeps the last dim, such as
// attention's head split and merge), or is an input broadcast along it (stride 0: a scalar, a
// per-row value): dim 0 shrinks V times and the unit-stride operands' other strides, all
// multiples of V, are divided by V; a broadcast input keeps element strides, its bit set in
// `splats`, and is read one element per vector. One offset calculation then serves V elements,
// read and written 16 bytes at a time. False when the loop is not of that kind.
template <int V, int N>
bool vector_loop(const StridedLoop<N>& loop, const void* const (&ptrs)[N], StridedLoop<N>& vec, unsigned& splats) {
  if (V <= 1 || loop.ndim == 0 || loop.shape[0] % V != 0) return false;
  splats = 0;
  for (int k = 0; k < N; ++k) {
    if (k > 0 && loop.strides[k][0] == 0) {
      splats |= 1u << k;
      continue;
    }
    if (loop.strides[k][0] != 1 || !aligned16(ptrs[k])) return false;
    for (int d = 1; d < loop.ndim; ++d)
      if (loop.shape[d] > 1 && loop.strides[k][d] % V != 0) return false;
  }
  vec = loop;
  vec.shape[0] = loop.shape[0] / V;
  vec.numel = loop.numel / V;
  for (int k = 0; k < N; ++k) {
    if (splats >> k & 1u) continue;
    for (int d = 1; d < loop.ndim; ++d) vec.strides[k][d] = loop.strides[k][d] / V;
  }
  return true;
}

/// Applies f elementwise on `stream`; returns the launch's error (cudaGetLastError), which the
/// caller turns into an Error naming the op. f runs on the device: a __host__ __device__
/// functor taking one value per input and returning the output value.
template <class Out, class F, class... In>
cudaError_t elementwise(const StridedLoop<1 + sizeof...(In)>& loop, cudaStream_t stream, Out* out, F f,
                        const In*... in) {
  if (loop.numel == 0) return cudaSuccess;
  const int64_t n = loop.numel;
  if (loop.is_contiguous()) {
    constexpr int kMaxSize = sizeof(Out) > 0 ? sizeof(Out) : 1;
    constexpr int V = 16 / kMaxSize >= 1 ? 16 / kMaxSize : 1;
    bool vec_ok = V > 1 && aligned16(out) && (aligned16(in) && ...) && ((sizeof(In) == sizeof(Out)) && ...);
    int64_t head = 0;
    if (vec_ok && n >= V) {
      int64_t nvec = n / V;
      vec_kernel<V><<<grid_for(nvec), kThreads, 0, stream>>>(nvec, f, out, in...);
      head = nvec * V;
    }
    if (head < n) flat_kernel<<<grid_for(n - head), kThreads, 0, stream>>>(n - head, f, out + head, (in + head)...);
    return cudaGetLastError();
  }
  constexpr int V = 16 / static_cast<int>(sizeof(Out));
  if constexpr (V > 1 && ((sizeof(In) == sizeof(Out)) && ...)) {
    const void* const ptrs[] = {out, in...};
    StridedLoop<1 + sizeof...(In)> vec;
    unsigned splats = 0;
    if (vector_loop<V>(loop, ptrs, vec, splats)) {
      const int64_t nv = vec.numel;
      if (fits_int32(vec))
        strided_vec_kernel<V, int32_t><<<grid_for(nv), kThreads, 0, stream>>>(
            static_cast<int32_t>(nv), make_calc<1 + sizeof...(In), int32_t>(vec), splats, f, out, in...);
      else
        strided_vec_kernel<V, int64_t><<<grid_for(nv), kThreads, 0, stream>>>(
            nv, make_calc<1 + sizeof...(In), int64_t>(vec), splats, f, out, in...);
      return cudaGetLastError();
    }
  }
  if (fits_int32(loop)) {
    strided_kernel<int32_t><<<grid_for(n), kThreads, 0, stream>>>(static_cast<int32_t>(n),
                                                                  make_calc<1 + sizeof...(In), int32_t>(loop), f, out, in...);
  } else {
    strided_kernel<int64_t><<<grid_for(n), kThreads, 0, stream>>>(n, make_calc<1 + sizeof...(In), int64_t>(loop), f,
                                                                  out, in...);
  }
  return cudaGetLastError();
}

}  // namespace strata::cuda_kernels
