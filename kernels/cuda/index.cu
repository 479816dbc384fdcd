// CUDA gather (also index_select), scatter, scatter-add (also index_add) and the check that
// finds an out-of-range index before anything is written. Offsets come from the StridedLoop
// offset calculator of elementwise.cuh (32-bit when every offset fits); the part an index
// value contributes is always computed in 64 bits.
//
// Note [Scatter write order]: the CPU writes colliding positions in order along the dim, so
// the last one wins. Here each thread walks whole rows along the dim when that is short or
// there are enough rows to fill the GPU; otherwise the writes are sorted by destination
// (stable radix sort of (offset, position)) and only the last of each run is written. Both
// give the CPU's result. Adds use atomics instead, in no fixed order, except float adds in
// deterministic mode (cuda::set_deterministic), which take the sorted path and sum each run
// in order.
#include <cstring>
#include <type_traits>

#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../common/convert.h"
#include "elementwise.cuh"
#include "index_ops.h"

namespace strata::cuda_kernels {

namespace {

// 32-bit positions also need i + the grid stride (at most 2^24, grid_for's cap) below 2^31.
constexpr int64_t kInt32Positions = (int64_t(1) << 31) - (int64_t(1) << 24);
template <int N>
bool use_int32(const StridedLoop<N>& loop) {
  return loop.numel < kInt32Positions && fits_int32(loop);
}

// ---- index validation ----

template <class I, class Index>
__global__ void find_bad_index_kernel(Index n, OffsetCalc<1, Index> calc, const I* __restrict__ index, int64_t size,
                                      unsigned long long* first) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Index off[1];
    calc.get(i, off);
    const int64_t v = static_cast<int64_t>(index[off[0]]);
    if (v < 0 || v >= size) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

// result[0] holds the first bad position (all ones when none); adds its value as result[1].
template <class I, class Index>
__global__ void report_bad_index_kernel(OffsetCalc<1, Index> calc, const I* __restrict__ index, int64_t* result) {
  const unsigned long long pos = static_cast<unsigned long long>(result[0]);
  if (pos == ~0ull) {
    result[0] = -1;
    result[1] = 0;
    return;
  }
  Index off[1];
  calc.get(static_cast<Index>(pos), off);
  result[1] = static_cast<int64_t>(index[off[0]]);
}

// ---- gather ----

template <class T, class I, class Index>
__global__ void gather_kernel(Index n, OffsetCalc<3, Index> calc, T* __restrict__ out, const T* __restrict__ x,
                              const I* __restrict__ index, int64_t x_dim_stride) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Index off[3];
    calc.get(i, off);
    out[off[0]] = x[static_cast<int64_t>(off[1]) + static_cast<int64_t>(index[off[2]]) * x_dim_stride];
  }
}

// ---- scatter: rows walked in order (Note [Scatter write order]) ----

template <class T, class I, class Index>
__global__ void scatter_rows_kernel(Index n, OffsetCalc<3, Index> calc, ScatterDim d, T* self,
                                    const I* __restrict__ index, const T* src) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Index off[3];
    calc.get(i, off);
    T* s = self + off[0];
    const I* ix = index + off[1];
    const T* v = src + off[2];
    for (int64_t j = 0; j < d.size; ++j) s[static_cast<int64_t>(ix[j * d.index]) * d.self] = v[j * d.src];
  }
}

// ---- scatter: writes sorted by destination (Note [Scatter write order]) ----

template <class I, class Index>
__global__ void scatter_keys_kernel(Index n, OffsetCalc<3, Index> calc, const I* __restrict__ index,
                                    int64_t self_dim_stride, uint64_t* __restrict__ keys, int64_t* __restrict__ pos) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Index off[3];
    calc.get(i, off);
    keys[i] = static_cast<uint64_t>(static_cast<int64_t>(off[0]) +
                                    static_cast<int64_t>(index[off[1]]) * self_dim_stride);
    pos[i] = i;
  }
}

// keys sorted ascending, positions in order within equal keys: the last of a run wins.
template <class T, class Index>
__global__ void scatter_last_kernel(int64_t n, OffsetCalc<3, Index> calc, const uint64_t* __restrict__ keys,
                                    const int64_t* __restrict__ pos, T* self, const T* src) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    if (i + 1 < n && keys[i + 1] == keys[i]) continue;
    Index off[3];
    calc.get(static_cast<Index>(pos[i]), off);
    self[keys[i]] = src[off[2]];
  }
}

// The first of each run adds the run's values in position order, rounding to T after each
// add as the CPU does: the CPU's result, the same on every run.
template <class T, class A, class Index>
__global__ void scatter_sum_runs_kernel(int64_t n, OffsetCalc<3, Index> calc, const uint64_t* __restrict__ keys,
                                        const int64_t* __restrict__ pos, T* self, const T* src, A alpha) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint64_t key = keys[i];
    if (i > 0 && keys[i - 1] == key) continue;
    T acc = self[key];
    for (int64_t j = i; j < n && keys[j] == key; ++j) {
      Index off[3];
      calc.get(static_cast<Index>(pos[j]), off);
      acc = static_cast<T>(static_cast<A>(acc) + alpha * static_cast<A>(src[off[2]]));
    }
    self[key] = acc;
  }
}

// Sorts the writes of `full` by destination: keys (self offsets, all below self_extent)
// ascending and, within equal keys, positions in order (the radix sort is stable).
template <class I, class Index>
cudaError_t sort_writes(const StridedLoop<3>& full, const OffsetCalc<3, Index>& calc, cudaStream_t s, const I* index,
                        int64_t self_dim_stride, int64_t self_extent, const Scratch& scratch, const uint64_t*& keys,
                        const int64_t*& pos) {
  const int64_t n = full.numel;
  auto* key_buf = static_cast<uint64_t*>(scratch.get(2 * n * sizeof(uint64_t)));
  auto* pos_buf = static_cast<int64_t*>(scratch.get(2 * n * sizeof(int64_t)));
  scatter_keys_kernel<I, Index><<<grid_for(n), kThreads, 0, s>>>(static_cast<Index>(n), calc, index, self_dim_stride,
                                                                 key_buf, pos_buf);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  int end_bit = 1;
  while (end_bit < 64 && (uint64_t(1) << end_bit) < static_cast<uint64_t>(self_extent)) ++end_bit;
  size_t temp_bytes = 0;
  {
    cub::DoubleBuffer<uint64_t> k(key_buf, key_buf + n);
    cub::DoubleBuffer<int64_t> v(pos_buf, pos_buf + n);
    if (cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, k, v, n, 0, end_bit, s); e != cudaSuccess)
      return e;
  }
  void* temp = scratch.get(temp_bytes);
  cub::DoubleBuffer<uint64_t> k(key_buf, key_buf + n);
  cub::DoubleBuffer<int64_t> v(pos_buf, pos_buf + n);
  if (cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, k, v, n, 0, end_bit, s); e != cudaSuccess)
    return e;
  keys = k.Current();
  pos = v.Current();
  return cudaSuccess;
}

template <class T, class I, class Index>
cudaError_t scatter_sorted(const StridedLoop<3>& full, int64_t self_dim_stride, cudaStream_t s, T* self,
                           const I* index, const T* src, int64_t self_extent, const Scratch& scratch) {
  const auto calc = make_calc<3, Index>(full);
  const uint64_t* keys = nullptr;
  const int64_t* pos = nullptr;
  if (cudaError_t e = sort_writes(full, calc, s, index, self_dim_stride, self_extent, scratch, keys, pos);
      e != cudaSuccess)
    return e;
  scatter_last_kernel<T, Index><<<grid_for(full.numel), kThreads, 0, s>>>(full.numel, calc, keys, pos, self, src);
  return cudaGetLastError();
}

template <class T, class I, class A, class Index>
cudaError_t scatter_add_sorted(const StridedLoop<3>& full, int64_t self_dim_stride, cudaStream_t s, T* self,
                               const I* index, const T* src, A alpha, int64_t self_extent, const Scratch& scratch) {
  const auto calc = make_calc<3, Index>(full);
  const uint64_t* keys = nullptr;
  const int64_t* pos = nullptr;
  if (cudaError_t e = sort_writes(full, calc, s, index, self_dim_stride, self_extent, scratch, keys, pos);
      e != cudaSuccess)
    return e;
  scatter_sum_runs_kernel<T, A, Index>
      <<<grid_for(full.numel), kThreads, 0, s>>>(full.numel, calc, keys, pos, self, src, alpha);
  return cudaGetLastError();
}

// ---- scatter-add: one atomic add per index element ----

// Atomic read-modify-write of a 1- or 2-byte value through the aligned 32-bit word holding it.
template <class T, class F>
__device__ void atomic_update_narrow(T* p, F f) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2, "narrow types only");
  using U = std::conditional_t<sizeof(T) == 1, uint8_t, uint16_t>;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~uintptr_t(3));
  const unsigned shift = static_cast<unsigned>(addr & 3) * 8;
  const unsigned mask = static_cast<unsigned>(U(~U(0))) << shift;
  unsigned old = *word, assumed;
  do {
    assumed = old;
    const U cur_bits = static_cast<U>((assumed & mask) >> shift);
    T cur;
    memcpy(&cur, &cur_bits, sizeof(T));
    const T next = f(cur);
    U next_bits;
    memcpy(&next_bits, &next, sizeof(T));
    old = atomicCAS(word, assumed, (assumed & ~mask) | (static_cast<unsigned>(next_bits) << shift));
  } while (old != assumed);
}

// dst += alpha * v, rounded as the CPU rounds (kernels/cpu/gather_scatter.h).
__device__ __forceinline__ void atomic_add_scaled(bool* dst, bool v, bool alpha) {
  if (alpha && v) *dst = true;  // every writer stores the same value: no read-modify-write needed
}
__device__ __forceinline__ void atomic_add_scaled(float* dst, float v, float alpha) { atomicAdd(dst, alpha * v); }
__device__ __forceinline__ void atomic_add_scaled(double* dst, double v, double alpha) { atomicAdd(dst, alpha * v); }
__device__ __forceinline__ void atomic_add_scaled(int32_t* dst, int32_t v, int32_t alpha) {
  // unsigned arithmetic wraps as the CPU's int32 result does, without signed overflow
  atomicAdd(reinterpret_cast<unsigned int*>(dst), static_cast<unsigned int>(alpha) * static_cast<unsigned int>(v));
}
__device__ __forceinline__ void atomic_add_scaled(int64_t* dst, int64_t v, int64_t alpha) {
  atomicAdd(reinterpret_cast<unsigned long long*>(dst),
            static_cast<unsigned long long>(alpha) * static_cast<unsigned long long>(v));
}
template <class T>  // int8_t, uint8_t
__device__ __forceinline__ std::enable_if_t<sizeof(T) == 1 && !std::is_same_v<T, bool>> atomic_add_scaled(T* dst, T v,
                                                                                                         T alpha) {
  const int add = static_cast<int>(alpha) * static_cast<int>(v);
  atomic_update_narrow(dst, [add](T cur) { return static_cast<T>(static_cast<int>(cur) + add); });
}
// 16-bit floats: the hardware add when alpha is 1 (the addend is then exact in the type);
// otherwise cur + alpha * v in float, rounded to the type once (rounding the addend to it
// first would round twice), as an FMA: what the CPU's contracted float math gives.
__device__ __forceinline__ void atomic_add_scaled(Half* dst, Half v, float alpha) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  if (alpha == 1.0f) {
    atomicAdd(reinterpret_cast<__half*>(dst), __float2half_rn(static_cast<float>(v)));
    return;
  }
#endif
  const float x = static_cast<float>(v);
  atomic_update_narrow(dst, [x, alpha](Half cur) { return Half(__fmaf_rn(alpha, x, static_cast<float>(cur))); });
}
__device__ __forceinline__ void atomic_add_scaled(BFloat16* dst, BFloat16 v, float alpha) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (alpha == 1.0f) {
    atomicAdd(reinterpret_cast<__nv_bfloat16*>(dst), __float2bfloat16_rn(static_cast<float>(v)));
    return;
  }
#endif
  const float x = static_cast<float>(v);
  atomic_update_narrow(dst, [x, alpha](BFloat16 cur) {
    return BFloat16(__fmaf_rn(alpha, x, static_cast<float>(cur)));
  });
}

template <class T, class I, class A, class Index>
__global__ void scatter_add_kernel(Index n, OffsetCalc<3, Index> calc, T* self, const I* __restrict__ index,
                                   const T* __restrict__ src, int64_t self_dim_stride, A alpha) {
  const Index step = Index(gridDim.x) * blockDim.x;
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Index off[3];
    calc.get(i, off);
    T* dst = self + (static_cast<int64_t>(off[0]) + static_cast<int64_t>(index[off[1]]) * self_dim_stride);
    atomic_add_scaled(dst, src[off[2]], alpha);
  }
}

// Rows of the scatter walked per thread when the row is short or the rows alone fill the GPU.
constexpr int64_t kShortRow = 32;
constexpr int64_t kManyRows = 65536;

}  // namespace

template <class I>
cudaError_t find_bad_index(const StridedLoop<1>& loop, cudaStream_t s, const I* index, int64_t size,
                           int64_t* result) {
  if (cudaError_t e = cudaMemsetAsync(result, 0xff, 2 * sizeof(int64_t), s); e != cudaSuccess) return e;
  auto* first = reinterpret_cast<unsigned long long*>(result);
  const int64_t n = loop.numel;
  if (use_int32(loop)) {
    const auto calc = make_calc<1, int32_t>(loop);
    find_bad_index_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<int32_t>(n), calc, index, size, first);
    report_bad_index_kernel<<<1, 1, 0, s>>>(calc, index, result);
  } else {
    const auto calc = make_calc<1, int64_t>(loop);
    find_bad_index_kernel<<<grid_for(n), kThreads, 0, s>>>(n, calc, index, size, first);
    report_bad_index_kernel<<<1, 1, 0, s>>>(calc, index, result);
  }
  return cudaGetLastError();
}

template <class T, class I>
cudaError_t gather(const StridedLoop<3>& loop, cudaStream_t s, T* out, const T* x, const I* index,
                   int64_t x_dim_stride) {
  const int64_t n = loop.numel;
  if (n == 0) return cudaSuccess;
  if (use_int32(loop))
    gather_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<int32_t>(n), make_calc<3, int32_t>(loop), out, x,
                                                    index, x_dim_stride);
  else
    gather_kernel<<<grid_for(n), kThreads, 0, s>>>(n, make_calc<3, int64_t>(loop), out, x, index, x_dim_stride);
  return cudaGetLastError();
}

template <class T, class I>
cudaError_t scatter(const StridedLoop<3>& outer, const StridedLoop<3>& full, const ScatterDim& d, cudaStream_t s,
                    T* self, const I* index, const T* src, int64_t self_extent, const Scratch& scratch) {
  if (full.numel == 0) return cudaSuccess;
  const int64_t rows = outer.numel;
  if (d.size <= kShortRow || rows >= kManyRows || self_extent < 0) {
    if (use_int32(outer))
      scatter_rows_kernel<<<grid_for(rows), kThreads, 0, s>>>(static_cast<int32_t>(rows), make_calc<3, int32_t>(outer),
                                                              d, self, index, src);
    else
      scatter_rows_kernel<<<grid_for(rows), kThreads, 0, s>>>(rows, make_calc<3, int64_t>(outer), d, self, index, src);
    return cudaGetLastError();
  }
  if (use_int32(full)) return scatter_sorted<T, I, int32_t>(full, d.self, s, self, index, src, self_extent, scratch);
  return scatter_sorted<T, I, int64_t>(full, d.self, s, self, index, src, self_extent, scratch);
}

template <class T, class I, class A>
cudaError_t scatter_add(const StridedLoop<3>& full, cudaStream_t s, T* self, const I* index, const T* src,
                        int64_t self_dim_stride, A alpha, bool deterministic, int64_t self_extent,
                        const Scratch& scratch) {
  const int64_t n = full.numel;
  if (n == 0) return cudaSuccess;
  // integer and bool adds give one result in any order; only floats need the sorted path
  if constexpr (is_reduced_float_v<T> || std::is_floating_point_v<T>) {
    if (deterministic && self_extent >= 0) {
      if (use_int32(full))
        return scatter_add_sorted<T, I, A, int32_t>(full, self_dim_stride, s, self, index, src, alpha, self_extent,
                                                    scratch);
      return scatter_add_sorted<T, I, A, int64_t>(full, self_dim_stride, s, self, index, src, alpha, self_extent,
                                                  scratch);
    }
  }
  if (use_int32(full))
    scatter_add_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<int32_t>(n), make_calc<3, int32_t>(full), self,
                                                        index, src, self_dim_stride, alpha);
  else
    scatter_add_kernel<<<grid_for(n), kThreads, 0, s>>>(n, make_calc<3, int64_t>(full), self, index, src,
                                                        self_dim_stride, alpha);
  return cudaGetLastError();
}

// Explicit instances: moves per element size, adds per dtype, both index dtypes.
#define STRATA_INDEX_MOVE(T, I)                                                                                   \
  template cudaError_t gather<T, I>(const StridedLoop<3>&, cudaStream_t, T*, const T*, const I*, int64_t);        \
  template cudaError_t scatter<T, I>(const StridedLoop<3>&, const StridedLoop<3>&, const ScatterDim&,             \
                                     cudaStream_t, T*, const I*, const T*, int64_t, const Scratch&);
#define STRATA_INDEX_ADD(T, I)                                                                                    \
  template cudaError_t scatter_add<T, I, compute_t<T>>(const StridedLoop<3>&, cudaStream_t, T*, const I*,         \
                                                       const T*, int64_t, compute_t<T>, bool, int64_t,           \
                                                       const Scratch&);
#define STRATA_INDEX_ALL(I)                                                                                       \
  template cudaError_t find_bad_index<I>(const StridedLoop<1>&, cudaStream_t, const I*, int64_t, int64_t*);       \
  STRATA_INDEX_MOVE(uint8_t, I) STRATA_INDEX_MOVE(uint16_t, I)                                                    \
  STRATA_INDEX_MOVE(uint32_t, I) STRATA_INDEX_MOVE(uint64_t, I)                                                   \
  STRATA_INDEX_ADD(bool, I) STRATA_INDEX_ADD(uint8_t, I) STRATA_INDEX_ADD(int8_t, I)                              \
  STRATA_INDEX_ADD(int32_t, I) STRATA_INDEX_ADD(int64_t, I) STRATA_INDEX_ADD(Half, I)                             \
  STRATA_INDEX_ADD(BFloat16, I) STRATA_INDEX_ADD(float, I) STRATA_INDEX_ADD(double, I)
STRATA_INDEX_ALL(int32_t)
STRATA_INDEX_ALL(int64_t)
#undef STRATA_INDEX_ALL
#undef STRATA_INDEX_ADD
#undef STRATA_INDEX_MOVE

}  // namespace strata::cuda_kernels
