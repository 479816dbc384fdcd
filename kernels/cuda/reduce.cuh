// The one CUDA launcher for reductions over any set of dims: reduce(plan, stream, in, op,
// store, scratch) folds the input as the ReducePlan describes with a functor of
// kernels/common/reduce_ops.h (identity, map or fold, combine) and hands each output's
// accumulator to store(out_offset, o, acc), o being the output's index in plan order (the
// order the CPU kernels use, so two-pass ops can keep per-output arrays). Also the warp and
// block combining steps that softmax reuses.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "../common/reduce_ops.h"
#include "../common/reduce_plan.h"
#include "reduce_ops.h"
#include "row_reduce.cuh"

namespace strata::cuda_kernels {

// Note [CUDA reduce layouts]
// A block is (bx, by) threads; each output is folded by one row or one column of it.
// Inner (the innermost memory dim is reduced, or nothing is): x runs along the reduced
// elements and y along outputs, so a warp (bx <= 32, several outputs per warp) or a whole
// block (bx up to 512) folds one output, combining by warp shuffles and then shared memory.
// Outer (the innermost memory dim is kept): x runs along consecutive outputs, whose inputs are
// adjacent in memory, and y splits the reduced elements; columns combine in shared memory.
// Other strides take the same paths with a general offset calculation (any number of dims).
// When there are few outputs for their work, the reduced elements are cut into `split`
// chunks of at least kSplitWork elements per block, one block each, whose partials a second
// kernel combines in a fixed order (runs of chunks, then a butterfly). Every choice depends
// only on the plan, so a result never depends on the GPU it ran on; each
// thread folds its elements in increasing order, which the arg-reductions' fold relies on.
namespace reduce_detail {

inline constexpr int kBlockThreads = 256;
inline constexpr int kMaxInnerLanes = 512;     // threads folding one output in the inner layout
inline constexpr int64_t kSplitWork = 16384;   // fewest elements per block when split
inline constexpr int64_t kTargetBlocks = 1024; // split until about this many blocks run
inline constexpr int64_t kMaxGridX = int64_t(1) << 30;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int pow2_at_least(int64_t n, int cap) {
  int p = 1;
  while (p < n && p < cap) p *= 2;
  return p;
}

struct Config {
  bool outer = false;
  int bx = 1, by = 1;
  int64_t groups = 0;  // blocks of outputs: bx (outer) or by (inner) outputs each
  int64_t split = 1;   // blocks sharing one group's reduced elements (gridDim.y)
  int64_t chunk = 0;   // reduced elements per split
};

inline Config make_config(const ReducePlan& p) {
  Config c;
  const int64_t R = p.num_red, N = p.num_out;
  c.outer = p.outer();
  if (c.outer) {
    c.bx = pow2_at_least(N, 32);
    c.by = pow2_at_least(ceil_div(R, 4), kBlockThreads / c.bx);
    if (c.bx * c.by < kBlockThreads) c.bx = pow2_at_least(N, kBlockThreads / c.by);  // short columns: widen
  } else {
    c.bx = pow2_at_least(ceil_div(R, 4), kMaxInnerLanes);
    c.by = c.bx < kBlockThreads ? kBlockThreads / c.bx : 1;
  }
  const int64_t per_group = c.outer ? c.bx : c.by;  // outputs one block folds
  c.groups = ceil_div(N, per_group);
  // few groups (a bias gradient: 512 column sums over 8192 rows makes 16): split the reduced
  // elements while each block keeps kSplitWork elements and each thread a few loads
  const int64_t lanes = c.outer ? c.by : c.bx;
  const int64_t max_split = std::min(R * per_group / kSplitWork, R / (4 * lanes));
  if (c.groups < kTargetBlocks && max_split >= 2) c.split = std::min(max_split, ceil_div(kTargetBlocks, c.groups));
  c.chunk = ceil_div(R, c.split);
  c.split = ceil_div(R, c.chunk);
  return c;
}

// Whether every index and offset the kernels compute stays below 2^31.
inline bool fits_int32(const ReducePlan& p) {
  constexpr int64_t kMax = int64_t(1) << 31;
  if (p.num_out >= kMax || p.num_red >= kMax) return false;
  auto reach = [](int64_t size, int64_t stride) { return (size > 0 ? size - 1 : 0) * (stride < 0 ? -stride : stride); };
  int64_t in = 0, out = 0;
  for (int d = 0; d < p.nkept; ++d) {
    in += reach(p.kept_size[d], p.kept_in[d]);
    out += reach(p.kept_size[d], p.kept_out[d]);
  }
  for (int d = 0; d < p.nred; ++d) in += reach(p.red_size[d], p.red_in[d]);
  return in < kMax && out < kMax;
}

// Input and output offsets of output o (kept dims innermost first). Unrolled with a break so
// the plan's arrays are read with constant indices, straight from the kernel parameters.
template <class Index>
__device__ __forceinline__ void kept_offsets(const ReducePlan& p, int64_t o, Index& in_off, Index& out_off) {
  Index i = static_cast<Index>(o);
  in_off = 0;
  out_off = 0;
#pragma unroll
  for (int d = 0; d < kMaxLoopDims; ++d) {
    if (d == p.nkept) break;
    const Index size = static_cast<Index>(p.kept_size[d]);
    const Index q = i / size, r = i - q * size;
    in_off += r * static_cast<Index>(p.kept_in[d]);
    out_off += r * static_cast<Index>(p.kept_out[d]);
    i = q;
  }
}

template <class Index>
__device__ __forceinline__ Index reduced_offset(const ReducePlan& p, int64_t r) {
  Index i = static_cast<Index>(r), off = 0;
#pragma unroll
  for (int d = 0; d < kMaxLoopDims; ++d) {
    if (d == p.nred) break;
    const Index size = static_cast<Index>(p.red_size[d]);
    const Index q = i / size;
    off += (i - q * size) * static_cast<Index>(p.red_in[d]);
    i = q;
  }
  return off;
}

// Combines v over threadIdx.x (blockDim.x a power of two, blockDim.x * blockDim.y a multiple
// of 32); every thread of the row receives the result. `smem`: blockDim.y * blockDim.x / 32
// values, free again on return. `combine` must be commutative for every lane of the butterfly
// to end with the same value.
template <class V, class Combine>
__device__ __forceinline__ V block_reduce_x(V v, const Combine& combine, V* smem) {
  const int bx = blockDim.x;
  for (int w = (bx < 32 ? bx : 32) / 2; w > 0; w /= 2) v = combine(v, shfl_xor(v, w));  // row_reduce.cuh
  if (bx <= 32) return v;
  const int nwarps = bx / 32;
  V* row = smem + threadIdx.y * nwarps;
  if (threadIdx.x % 32 == 0) row[threadIdx.x / 32] = v;
  __syncthreads();
  v = row[0];
  for (int k = 1; k < nwarps; ++k) v = combine(v, row[k]);
  __syncthreads();
  return v;
}

// Combines v over threadIdx.y (blockDim.y a power of two) by a tree in shared memory; every
// thread of the column receives the result. `smem`: blockDim.x * blockDim.y values.
template <class V, class Combine>
__device__ __forceinline__ V block_reduce_y(V v, const Combine& combine, V* smem) {
  const int bx = blockDim.x, x = threadIdx.x, y = threadIdx.y;
  smem[y * bx + x] = v;
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s /= 2) {
    if (y < s) smem[y * bx + x] = combine(smem[y * bx + x], smem[(y + s) * bx + x]);
    __syncthreads();
  }
  v = smem[x];
  __syncthreads();
  return v;
}

// Folds elements r, r + step, ... < re of one output into acc, loading eight ahead, for bytes
// in flight (with four, and the old split rule, a 16384 x 16384 float sum ran at 75-84% of an
// H200's copy bandwidth; with eight, the split rule above and the warp finalize below, at
// 100-103%).
template <class Index, class T, class Op, class Acc>
__device__ __forceinline__ Acc fold_span(const ReducePlan& p, const T* __restrict__ base, const Op& op, int64_t o,
                                         int64_t r, int64_t re, int64_t step, Acc acc) {
  constexpr int kAhead = 8;
  if (p.nred <= 1) {  // one reduced dim (or none): offsets without divisions
    const Index s0 = static_cast<Index>(p.red_in[0]);
    for (; r + (kAhead - 1) * step < re; r += kAhead * step) {
      T x[kAhead];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) x[j] = base[static_cast<Index>(r + j * step) * s0];
#pragma unroll
      for (int j = 0; j < kAhead; ++j) acc = math::fold_element(op, acc, x[j], o, r + j * step);
    }
    for (; r < re; r += step) acc = math::fold_element(op, acc, base[static_cast<Index>(r) * s0], o, r);
  } else {
    for (; r < re; r += step) acc = math::fold_element(op, acc, base[reduced_offset<Index>(p, r)], o, r);
  }
  return acc;
}

// One block per (group of outputs, chunk of reduced elements); see Note [CUDA reduce layouts].
// With `partial`, the chunk's accumulator goes to partial[o * split + chunk] instead of store.
template <class Index, class T, class Op, class Store>
__global__ void __launch_bounds__(kMaxInnerLanes)
    reduce_kernel(ReducePlan p, Config c, const T* __restrict__ in, Op op, Store store, typename Op::Acc* partial) {
  using Acc = typename Op::Acc;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Acc* smem = reinterpret_cast<Acc*>(smem_bytes);
  const int out_lane = c.outer ? threadIdx.x : threadIdx.y;
  const int red_lane = c.outer ? threadIdx.y : threadIdx.x;
  const int64_t per_group = c.outer ? blockDim.x : blockDim.y;
  const int64_t step = c.outer ? blockDim.y : blockDim.x;
  const int64_t rb = int64_t(blockIdx.y) * c.chunk;
  const int64_t re = rb + c.chunk < p.num_red ? rb + c.chunk : p.num_red;
  auto combine = [&op](Acc a, Acc b) { return op.combine(a, b); };
  for (int64_t g = blockIdx.x; g < c.groups; g += gridDim.x) {  // uniform across the block
    const int64_t o = g * per_group + out_lane;
    const bool live = o < p.num_out;
    Acc acc = op.identity();
    Index in_off = 0, out_off = 0;
    if (live) {
      kept_offsets<Index>(p, o, in_off, out_off);
      acc = fold_span<Index>(p, in + in_off, op, o, rb + red_lane, re, step, acc);
    }
    acc = c.outer ? block_reduce_y(acc, combine, smem) : block_reduce_x(acc, combine, smem);
    if (live && red_lane == 0) {
      if (partial) partial[o * c.split + blockIdx.y] = acc;
      else store(static_cast<int64_t>(out_off), o, acc);
    }
  }
}

// Combines each output's `split` partials and stores the result; split 0 stores the identity.
// A warp per output (blockDim (32, y)): each lane folds a contiguous run of the partials in
// chunk order and the lanes meet in the butterfly. (A thread per output walked a full sum's
// 1024 partials one memory latency at a time: 10% of the sum's time.)
template <class Index, class Op, class Store>
__global__ void finalize_kernel(ReducePlan p, int64_t split, Op op, Store store,
                                const typename Op::Acc* __restrict__ partial) {
  using Acc = typename Op::Acc;
  const int64_t stride = int64_t(gridDim.x) * blockDim.y;
  const int64_t per_lane = (split + kWarpSize - 1) / kWarpSize;
  const int64_t b0 = threadIdx.x * per_lane, b1 = b0 + per_lane < split ? b0 + per_lane : split;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; o < p.num_out; o += stride) {  // uniform per warp
    Acc acc = op.identity();
    for (int64_t b = b0; b < b1; ++b) acc = op.combine(acc, partial[o * split + b]);
    acc = warp_allreduce(acc, [&op](Acc a, Acc c) { return op.combine(a, c); });
    if (threadIdx.x == 0) {
      Index in_off, out_off;
      kept_offsets<Index>(p, o, in_off, out_off);
      store(static_cast<int64_t>(out_off), o, acc);
    }
  }
}

// Launches finalize_kernel: eight outputs (warps) per block.
template <class Index, class Op, class Store>
void launch_finalize(const ReducePlan& p, int64_t split, const Op& op, const Store& store,
                     const typename Op::Acc* partial, cudaStream_t stream) {
  constexpr int kWarps = kBlockThreads / kWarpSize;
  const int64_t blocks = std::min(ceil_div(p.num_out, kWarps), int64_t(65536));
  finalize_kernel<Index><<<static_cast<unsigned>(blocks), dim3(kWarpSize, kWarps), 0, stream>>>(p, split, op, store,
                                                                                               partial);
}

template <class Index, class T, class Op, class Store>
cudaError_t launch(const ReducePlan& p, cudaStream_t stream, const T* in, const Op& op, const Store& store,
                   const Scratch& scratch) {
  using Acc = typename Op::Acc;
  if (p.num_red == 0) {
    launch_finalize<Index>(p, 0, op, store, static_cast<const Acc*>(nullptr), stream);
    return cudaGetLastError();
  }
  const Config c = make_config(p);
  Acc* partial = nullptr;
  if (c.split > 1) partial = static_cast<Acc*>(scratch.get(static_cast<size_t>(p.num_out * c.split) * sizeof(Acc)));
  const dim3 grid(static_cast<unsigned>(std::min(c.groups, kMaxGridX)), static_cast<unsigned>(c.split));
  const size_t smem = static_cast<size_t>(c.outer ? c.bx * c.by : c.by * (c.bx > 32 ? c.bx / 32 : 0)) * sizeof(Acc);
  reduce_kernel<Index><<<grid, dim3(c.bx, c.by), smem, stream>>>(p, c, in, op, store, partial);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || !partial) return err;
  launch_finalize<Index>(p, c.split, op, store, static_cast<const Acc*>(partial), stream);
  return cudaGetLastError();
}

}  // namespace reduce_detail

/// Reduces `in` as `plan` describes on `stream`, calling store(out_offset, o, acc) once per
/// output on the device. `op` and `store` are plain structs copied to the device (pointers
/// they hold must be device memory). Returns the first launch error.
template <class T, class Op, class Store>
cudaError_t reduce(const ReducePlan& plan, cudaStream_t stream, const T* in, const Op& op, const Store& store,
                   const Scratch& scratch) {
  if (plan.num_out == 0) return cudaSuccess;
  if (reduce_detail::fits_int32(plan)) return reduce_detail::launch<int32_t>(plan, stream, in, op, store, scratch);
  return reduce_detail::launch<int64_t>(plan, stream, in, op, store, scratch);
}

}  // namespace strata::cuda_kernels
