// CUDA sort and topk along one dim, in the CPU's order (kernels/cpu/sort.h): every value is
// turned into an unsigned key (kernels/common/sort_key.h) whose stable ascending sort is
// that order, ties kept in position order. Two paths:
//  - small k (topk with k <= kMaxBlockTopK): one block per slice keeps each thread's best k
//    (key, position) pairs, then merges the threads' lists pairwise in shared memory;
//  - otherwise the slices' keys and positions are copied into contiguous buffers and sorted
//    with CUB (DeviceSegmentedSort for many slices, DeviceRadixSort per slice for a few long
//    ones), and the first k of each slice are written out.
// Values are read back from x at the sorted positions, so they are x's exact bits.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include "../common/sort_key.h"
#include "elementwise.cuh"
#include "index_ops.h"

namespace strata::cuda_kernels {

namespace {

using sort_key::key_t;

constexpr int kMaxBlockTopK = 16;
constexpr int64_t kLongSlice = 65536;  // slices at least this long, when few, get a device-wide sort each
constexpr int64_t kFewSlices = 64;

// 32-bit outer offsets and slice numbers (the offsets along the dim are 64-bit anyway); the
// slice number plus the grid stride (at most 2^24, grid_for's cap) must stay below 2^31 too.
constexpr int64_t kInt32Positions = (int64_t(1) << 31) - (int64_t(1) << 24);
bool use_int32(const StridedLoop<3>& outer) { return outer.numel < kInt32Positions && fits_int32(outer); }

// ---- small k: block top-k ----

// (key, position) order: the key first, then the earlier position.
template <class K>
__device__ __forceinline__ bool before(K ka, int64_t pa, K kb, int64_t pb) {
  return ka < kb || (ka == kb && pa < pb);
}

// One block per slice (grid-strided over slices). Dynamic shared memory: blockDim.x lists of
// k (position, key) pairs; unused entries hold (max key, max position), after every real one.
template <class T, class Index>
__global__ void topk_block_kernel(int64_t slices, OffsetCalc<3, Index> calc, SliceDim d, int k, bool descending,
                                  const T* __restrict__ x, T* __restrict__ values, int64_t* __restrict__ indices) {
  using K = key_t<T>;
  extern __shared__ int64_t shared_pos[];
  K* shared_key = reinterpret_cast<K*>(shared_pos + blockDim.x * k);
  const int tid = threadIdx.x;
  for (int64_t slice = blockIdx.x; slice < slices; slice += gridDim.x) {
    Index off[3];
    calc.get(static_cast<Index>(slice), off);
    const T* xs = x + off[0];
    // this thread's best k, ascending; positions rise along the scan, so a new element
    // goes after the equal keys already held
    K lk[kMaxBlockTopK];
    int64_t lp[kMaxBlockTopK];
    int count = 0;
    for (int64_t j = tid; j < d.n; j += blockDim.x) {
      const K key = sort_key::sort_key(xs[j * d.x_stride], descending);
      if (count == k && !(key < lk[k - 1])) continue;
      int at = count < k ? count++ : k - 1;
      while (at > 0 && key < lk[at - 1]) {
        lk[at] = lk[at - 1];
        lp[at] = lp[at - 1];
        --at;
      }
      lk[at] = key;
      lp[at] = j;
    }
    int64_t* my_pos = shared_pos + tid * k;
    K* my_key = shared_key + tid * k;
    for (int t = 0; t < k; ++t) {
      my_key[t] = t < count ? lk[t] : K(~K(0));
      my_pos[t] = t < count ? lp[t] : INT64_MAX;
    }
    __syncthreads();
    // pairwise merges: after the round of width w, list tid (tid % 2w == 0) holds the best k of 2w lists
    for (int w = 1; w < blockDim.x; w *= 2) {
      if (tid % (2 * w) == 0 && tid + w < blockDim.x) {
        const int64_t* bp = shared_pos + (tid + w) * k;
        const K* bk = shared_key + (tid + w) * k;
        int a = 0, b = 0;
        for (int t = 0; t < k; ++t) {
          if (before(bk[b], bp[b], my_key[a], my_pos[a])) {
            lk[t] = bk[b];
            lp[t] = bp[b++];
          } else {
            lk[t] = my_key[a];
            lp[t] = my_pos[a++];
          }
        }
        for (int t = 0; t < k; ++t) {
          my_key[t] = lk[t];
          my_pos[t] = lp[t];
        }
      }
      __syncthreads();
    }
    if (tid < k) {
      const int64_t p = shared_pos[tid];
      values[off[1] + tid * d.v_stride] = xs[p * d.x_stride];
      indices[off[2] + tid * d.i_stride] = p;
    }
    __syncthreads();  // list 0 is read before the next slice overwrites it
  }
}

template <class T, class Index>
cudaError_t topk_small(const StridedLoop<3>& outer, const SliceDim& d, int k, bool descending, cudaStream_t s,
                       const T* x, T* values, int64_t* indices) {
  int threads = 32;  // a warp at least; up to 128 threads when the slice is long enough to use them
  while (threads < 128 && threads < d.n) threads *= 2;
  const size_t shared = static_cast<size_t>(threads) * k * (sizeof(int64_t) + sizeof(key_t<T>));
  const int64_t slices = outer.numel;
  const int grid = static_cast<int>(slices < 65536 ? slices : 65536);
  topk_block_kernel<T, Index><<<grid, threads, shared, s>>>(slices, make_calc<3, Index>(outer), d, k, descending, x,
                                                            values, indices);
  return cudaGetLastError();
}

// ---- any k: sort whole slices ----

// keys[i], pos[i] for flat i = slice * n + j: the key of x's element j of the slice, and j.
template <class T, class Index>
__global__ void slice_keys_kernel(int64_t total, OffsetCalc<3, Index> calc, SliceDim d, bool descending,
                                  const T* __restrict__ x, key_t<T>* __restrict__ keys, int64_t* __restrict__ pos) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t slice = i / d.n, j = i - slice * d.n;
    Index off[3];
    calc.get(static_cast<Index>(slice), off);
    keys[i] = sort_key::sort_key(x[off[0] + j * d.x_stride], descending);
    pos[i] = j;
  }
}

__global__ void slice_offsets_kernel(int64_t slices, int64_t n, int64_t* offsets) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i <= slices; i += step) offsets[i] = i * n;
}

// The first k sorted positions of each slice -> values (read from x) and indices.
template <class T, class Index>
__global__ void write_sorted_kernel(int64_t total, int64_t k, OffsetCalc<3, Index> calc, SliceDim d,
                                    const int64_t* __restrict__ sorted, const T* __restrict__ x,
                                    T* __restrict__ values, int64_t* __restrict__ indices) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t slice = i / k, j = i - slice * k;
    const int64_t p = sorted[slice * d.n + j];
    Index off[3];
    calc.get(static_cast<Index>(slice), off);
    values[off[1] + j * d.v_stride] = x[off[0] + p * d.x_stride];
    indices[off[2] + j * d.i_stride] = p;
  }
}

template <class T, class Index>
cudaError_t sort_full(const StridedLoop<3>& outer, const SliceDim& d, int64_t k, bool descending, cudaStream_t s,
                      const T* x, T* values, int64_t* indices, const Scratch& scratch) {
  using K = key_t<T>;
  const int64_t slices = outer.numel, n = d.n, total = slices * n;
  const auto calc = make_calc<3, Index>(outer);
  K* keys = static_cast<K*>(scratch.get(2 * total * sizeof(K)));
  int64_t* pos = static_cast<int64_t*>(scratch.get(2 * total * sizeof(int64_t)));
  slice_keys_kernel<<<grid_for(total), kThreads, 0, s>>>(total, calc, d, descending, x, keys, pos);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const int64_t* sorted = nullptr;
  size_t temp_bytes = 0;
  if (slices == 1 || (n >= kLongSlice && slices <= kFewSlices)) {
    // a device-wide radix sort per slice; results gathered into the second position buffer
    int64_t* out_pos = pos + total;
    {
      cub::DoubleBuffer<K> kb(keys, keys + total);
      cub::DoubleBuffer<int64_t> vb(pos, out_pos);
      if (cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, kb, vb, n, 0, int(sizeof(K) * 8), s);
          e != cudaSuccess)
        return e;
    }
    void* temp = scratch.get(temp_bytes);
    for (int64_t slice = 0; slice < slices; ++slice) {
      const int64_t at = slice * n;
      cub::DoubleBuffer<K> kb(keys + at, keys + total + at);
      cub::DoubleBuffer<int64_t> vb(pos + at, out_pos + at);
      if (cudaError_t e = cub::DeviceRadixSort::SortPairs(temp, temp_bytes, kb, vb, n, 0, int(sizeof(K) * 8), s);
          e != cudaSuccess)
        return e;
      if (vb.Current() != out_pos + at) {
        if (cudaError_t e = cudaMemcpyAsync(out_pos + at, vb.Current(), n * sizeof(int64_t), cudaMemcpyDeviceToDevice, s);
            e != cudaSuccess)
          return e;
      }
    }
    sorted = out_pos;
  } else {
    int64_t* offsets = static_cast<int64_t*>(scratch.get((slices + 1) * sizeof(int64_t)));
    slice_offsets_kernel<<<grid_for(slices + 1), kThreads, 0, s>>>(slices, n, offsets);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    {
      cub::DoubleBuffer<K> kb(keys, keys + total);
      cub::DoubleBuffer<int64_t> vb(pos, pos + total);
      if (cudaError_t e = cub::DeviceSegmentedSort::StableSortPairs(nullptr, temp_bytes, kb, vb, total, slices, offsets,
                                                                    offsets + 1, s);
          e != cudaSuccess)
        return e;
    }
    void* temp = scratch.get(temp_bytes);
    cub::DoubleBuffer<K> kb(keys, keys + total);
    cub::DoubleBuffer<int64_t> vb(pos, pos + total);
    if (cudaError_t e = cub::DeviceSegmentedSort::StableSortPairs(temp, temp_bytes, kb, vb, total, slices, offsets,
                                                                  offsets + 1, s);
        e != cudaSuccess)
      return e;
    sorted = vb.Current();
  }
  const int64_t written = slices * k;
  write_sorted_kernel<<<grid_for(written), kThreads, 0, s>>>(written, k, calc, d, sorted, x, values, indices);
  return cudaGetLastError();
}

}  // namespace

template <class T>
cudaError_t sort_slices(const StridedLoop<3>& outer, const SliceDim& d, int64_t k, bool descending, cudaStream_t s,
                        const T* x, T* values, int64_t* indices, const Scratch& scratch) {
  if (outer.numel == 0 || k == 0 || d.n == 0) return cudaSuccess;
  const bool narrow = use_int32(outer);
  if (k <= kMaxBlockTopK && k < d.n) {
    return narrow ? topk_small<T, int32_t>(outer, d, static_cast<int>(k), descending, s, x, values, indices)
                  : topk_small<T, int64_t>(outer, d, static_cast<int>(k), descending, s, x, values, indices);
  }
  return narrow ? sort_full<T, int32_t>(outer, d, k, descending, s, x, values, indices, scratch)
                : sort_full<T, int64_t>(outer, d, k, descending, s, x, values, indices, scratch);
}

#define STRATA_SORT(T)                                                                                         \
  template cudaError_t sort_slices<T>(const StridedLoop<3>&, const SliceDim&, int64_t, bool, cudaStream_t,     \
                                      const T*, T*, int64_t*, const Scratch&);
STRATA_SORT(bool)
STRATA_SORT(uint8_t)
STRATA_SORT(int8_t)
STRATA_SORT(int32_t)
STRATA_SORT(int64_t)
STRATA_SORT(Half)
STRATA_SORT(BFloat16)
STRATA_SORT(float)
STRATA_SORT(double)
#undef STRATA_SORT

}  // namespace strata::cuda_kernels
