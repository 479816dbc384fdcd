// Multi-tensor launches, as apex's multi_tensor_apply: one kernel updates many tensors. The
// tensors of a launch travel in the kernel's argument, a TensorTable: for each tensor its
// pointers (parameter, grad, states), its length, per-tensor scalars and the index of its
// first chunk. Every CUDA block takes one chunk (`chunk` consecutive elements of one tensor)
// and finds its tensor by binary search over those indices. Tensors beyond kMaxTensors go in
// further launches, so the table stays within the 4 KB kernel-parameter limit of every GPU.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace strata::cuda_kernels::multi_tensor {

inline constexpr int kMaxTensors = 36;
inline constexpr int kMaxArgBytes = 4096 - 512;  // room left for the kernel's other arguments

struct NoExtra {};

// kLists pointers per tensor (list 0 is the parameter), and Extra: per-tensor scalars.
template <int kLists, class Extra>
struct TensorTable {
  void* ptrs[kLists][kMaxTensors];
  int64_t numel[kMaxTensors];
  int64_t first_chunk[kMaxTensors + 1];  // tensor t has chunks [first_chunk[t], first_chunk[t + 1])
  Extra extra[kMaxTensors];
  int64_t chunk;       // elements per chunk
  int64_t chunk_base;  // index of this launch's chunk 0 among all chunks of the call
  int count;
};

// The elements [begin, end) of tensor `t` that this block owns; `index` is the chunk's index
// within the tensor.
struct Chunk {
  int t;
  int64_t index, begin, end;
};

template <class Table>
__device__ __forceinline__ Chunk find_chunk(const Table& tab) {
  const int64_t c = blockIdx.x;
  int lo = 0, hi = tab.count - 1;  // the last tensor whose first chunk is <= c
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tab.first_chunk[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  Chunk ch;
  ch.t = lo;
  ch.index = c - tab.first_chunk[lo];
  ch.begin = ch.index * tab.chunk;
  const int64_t end = ch.begin + tab.chunk;
  ch.end = end < tab.numel[lo] ? end : tab.numel[lo];
  return ch;
}

template <class T, class Table>
__device__ __forceinline__ T* list(const Table& tab, int k, int t) {
  return static_cast<T*>(tab.ptrs[k][t]);
}

/// Writes the pointers of one tensor into `slot`, in list order (list 0 first).
template <class Table, class... P>
inline void set_pointers(Table& tab, int slot, P*... ptrs) {
  int k = 0;
  ((tab.ptrs[k++][slot] = const_cast<void*>(static_cast<const void*>(ptrs))), ...);
}

/// Fills tables with the `count` items and launches once per full table and once for the rest.
/// fill(table, slot, i) writes item i's pointers and extra into `slot` and returns its length;
/// items of length 0 are left out. launch(table, blocks) launches the kernel (one block per
/// chunk). Returns the first launch error.
template <class Table, class Fill, class Launch>
cudaError_t for_each_launch(int64_t count, int64_t chunk, Fill fill, Launch launch) {
  static_assert(sizeof(Table) <= kMaxArgBytes, "a tensor table must fit in the kernel's arguments");
  constexpr int64_t kMaxBlocks = 0x7fffffff;  // gridDim.x
  Table tab{};
  tab.chunk = chunk;
  int64_t done_chunks = 0;
  auto flush = [&]() -> cudaError_t {
    if (tab.count == 0) return cudaSuccess;
    const int64_t blocks = tab.first_chunk[tab.count];
    launch(tab, static_cast<unsigned>(blocks));
    done_chunks += blocks;
    tab = Table{};
    tab.chunk = chunk;
    tab.chunk_base = done_chunks;
    return cudaGetLastError();
  };
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = fill(tab, tab.count, i);
    if (n <= 0) continue;
    const int64_t chunks = (n + chunk - 1) / chunk;
    if (chunks > kMaxBlocks) return cudaErrorInvalidValue;
    if (tab.first_chunk[tab.count] + chunks > kMaxBlocks) {  // the grid would overflow: launch first
      if (cudaError_t err = flush(); err != cudaSuccess) return err;
      fill(tab, 0, i);
    }
    const int s = tab.count;
    tab.numel[s] = n;
    tab.first_chunk[s + 1] = tab.first_chunk[s] + chunks;
    tab.count = s + 1;
    if (tab.count == kMaxTensors)
      if (cudaError_t err = flush(); err != cudaSuccess) return err;
  }
  return flush();
}

}  // namespace strata::cuda_kernels::multi_tensor
