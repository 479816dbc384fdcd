// CUDA multi-tensor 8-bit Adam: one block per quantization block. Each thread dequantizes its
// elements' moments into registers, applies the Adam step (kernels/common/optim_math.h), the
// block takes the new absmax of each moment, and the threads requantize to the nearest code of
// the dynamic maps (kernels/common/quant8.h), which sit in shared memory for the binary
// searches. The same per-element code and order of rounding as the CPU's adam8bit_step, so
// the states agree bit for bit up to the compilers' use of fused multiply-adds.
#include "../common/quant8.h"
#include "optim_common.cuh"
#include "optim_ops.h"

namespace strata::cuda_kernels::optim {

namespace {

inline constexpr int k8bitThreads = 256;
inline constexpr int kPerThread = static_cast<int>(quant8::kMaxBlock / k8bitThreads);  // 16

// One step of quant8::block_absmax's maximum, across threads. Its per-element values arrive
// finite (block_absmax leaves NaN and inf out), so this is a plain maximum.
__device__ __forceinline__ float block_max(float acc, float a) { return a > acc ? a : acc; }

// blockDim.x is a multiple of 32, at most k8bitThreads, and blockDim.x * kPerThread >= block.
template <class T>
__global__ void __launch_bounds__(k8bitThreads) adam8bit_kernel(mt::TensorTable<6, AdamExtra> tab,
                                                                math::AdamConsts<T> c, const float* maps) {
  __shared__ float map[2 * quant8::kMapSize];  // signed, then unsigned
  __shared__ float warp_max[2][k8bitThreads / 32];
  for (int i = threadIdx.x; i < 2 * quant8::kMapSize; i += blockDim.x) map[i] = maps[i];
  __syncthreads();
  const float* signed_map = map;
  const float* unsigned_map = map + quant8::kMapSize;

  const mt::Chunk ch = mt::find_chunk(tab);  // ch.index: the quantization block
  T* __restrict__ p = mt::list<T>(tab, 0, ch.t);
  const T* __restrict__ g = mt::list<const T>(tab, 1, ch.t);
  uint8_t* __restrict__ m_codes = mt::list<uint8_t>(tab, 2, ch.t);
  float* __restrict__ m_absmax = mt::list<float>(tab, 3, ch.t);
  uint8_t* __restrict__ v_codes = mt::list<uint8_t>(tab, 4, ch.t);
  float* __restrict__ v_absmax = mt::list<float>(tab, 5, ch.t);
  c.step_size = T(tab.extra[ch.t].step_size);
  c.bc2_sqrt = T(tab.extra[ch.t].bc2_sqrt);
  const int len = static_cast<int>(ch.end - ch.begin);
  const float m_scale = m_absmax[ch.index], v_scale = v_absmax[ch.index];

  T m[kPerThread], v[kPerThread];
  float m_max = 0.0f, v_max = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    m[k] = v[k] = T(0);
    if (j < len) {
      const int64_t i = ch.begin + j;
      quant8::dequantize_block(signed_map, m_codes + i, 1, m_scale, &m[k]);
      quant8::dequantize_block(unsigned_map, v_codes + i, 1, v_scale, &v[k]);
      T pi = p[i];
      math::adam_update(pi, g[i], m[k], v[k], c);
      p[i] = pi;
      m_max = block_max(m_max, quant8::block_absmax(&m[k], 1));
      v_max = block_max(v_max, quant8::block_absmax(&v[k], 1));
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    m_max = block_max(m_max, __shfl_xor_sync(0xffffffffu, m_max, off));
    v_max = block_max(v_max, __shfl_xor_sync(0xffffffffu, v_max, off));
  }
  if (threadIdx.x % 32 == 0) warp_max[0][threadIdx.x / 32] = m_max, warp_max[1][threadIdx.x / 32] = v_max;
  __syncthreads();  // also orders every read of the old scales before thread 0 writes the new
  float m_abs = warp_max[0][0], v_abs = warp_max[1][0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
    m_abs = block_max(m_abs, warp_max[0][w]), v_abs = block_max(v_abs, warp_max[1][w]);

#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < len) {
      const int64_t i = ch.begin + j;
      quant8::quantize_block(signed_map, &m[k], 1, m_abs, m_codes + i);
      quant8::quantize_block(unsigned_map, &v[k], 1, v_abs, v_codes + i);
    }
  }
  if (threadIdx.x == 0) m_absmax[ch.index] = m_abs, v_absmax[ch.index] = v_abs;
}

}  // namespace

template <class T>
cudaError_t adam8bit(const Adam8bitTensor<T>* ts, int64_t count, int64_t block, const float* maps,
                     const math::AdamConsts<double>& c64, cudaStream_t s) {
  if (block < 1 || block > quant8::kMaxBlock) return cudaErrorInvalidValue;
  using Table = mt::TensorTable<6, AdamExtra>;
  const math::AdamConsts<T> c = to_t<T>(c64);
  // whole warps, and no more threads than a block has elements
  const int threads = block >= k8bitThreads ? k8bitThreads : static_cast<int>((block + 31) / 32 * 32);
  return mt::for_each_launch<Table>(
      count, block,
      [&](Table& tab, int slot, int64_t i) {
        mt::set_pointers(tab, slot, ts[i].p, ts[i].g, ts[i].m_codes, ts[i].m_absmax, ts[i].v_codes, ts[i].v_absmax);
        tab.extra[slot] = {ts[i].step_size, ts[i].bc2_sqrt};
        return ts[i].n;
      },
      [&](const Table& tab, unsigned blocks) { adam8bit_kernel<T><<<blocks, threads, 0, s>>>(tab, c, maps); });
}

template cudaError_t adam8bit<float>(const Adam8bitTensor<float>*, int64_t, int64_t, const float*,
                                     const math::AdamConsts<double>&, cudaStream_t);
template cudaError_t adam8bit<double>(const Adam8bitTensor<double>*, int64_t, int64_t, const float*,
                                      const math::AdamConsts<double>&, cudaStream_t);

}  // namespace strata::cuda_kernels::optim
