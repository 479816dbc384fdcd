// CUDA fused attention (Note [Fused attention] in src/nn/attention_fused.cpp): FlashAttention's
// tiling in float on the CUDA cores, for head dims up to 128 (padded to 32, 64 or 128). Each
// tensor's rows are where its math::AttentionRows says (a block adds its problem's offset once).
//
// Every kernel works on 64 x 64 tiles with 256 threads in a 16 x 16 grid: thread (ty, tx) owns
// tile rows ty*4 .. ty*4+3 and columns tx, tx+16, tx+32, tx+48 (or the head dim's columns
// tx + 16j), so the 16 threads that share a row are one half-warp and reduce it with shuffles.
// Every product is tile_fma: its left operand sits in shared memory transposed ([x][row], rows
// 16-byte aligned, read four rows at once), its right operand with an odd leading dimension
// (65), read across or along rows without bank conflicts.
//
// - forward: a block per (problem, 64 queries) runs over the key tiles (causal: up to its last
//   query) with the online softmax in base 2 (scores pre-scaled by log2 e), keeping o in
//   registers; it writes o and the natural logsumexp.
// - backward: delta = do . o per query; a block per (problem, 64 keys) runs over the query
//   tiles that attend them and accumulates dk and dv; a block per (problem, 64 queries) runs
//   over the key tiles and accumulates dq. Both recompute p from the logsumexp. Two passes
//   recompute the scores twice, but nothing is added atomically, so results are deterministic.
// - dropout: each weight's factor comes from the Philox draw of its element of the flattened
//   (batch, L, S) weights, as functional::dropout's; o and dv use the dropped weights, dp is
//   multiplied by the same factors, and delta = do . o still holds.
//
// Causal query blocks are launched heaviest first (the last queries attend the most keys).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "../common/attention_math.h"
#include "../common/convert.h"
#include "attention_ops.h"

namespace strata::cuda_kernels {

namespace {

constexpr int kTile = static_cast<int>(kAttentionTile);
constexpr int kThreads = 256;
constexpr int kVecLd = kTile + 4;  // leading dim of left operands: rows stay 16-byte aligned
constexpr int kOddLd = kTile + 1;  // leading dim of right operands: conflict-free either way
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Rows [row0, row0 + kTile) of a (rows, D) array, rows rs apart, into dst[d * ld + r] as float;
// zero past the rows and past D (up to kD). Consecutive threads read consecutive d of a row.
template <int kD, class T>
__device__ __forceinline__ void load_transposed(float* dst, int ld, const T* __restrict__ src, int64_t rs,
                                                int64_t row0, int64_t rows, int D) {
  for (int idx = threadIdx.x; idx < kTile * kD; idx += kThreads) {
    const int r = idx / kD, d = idx % kD;
    const int64_t row = row0 + r;
    dst[d * ld + r] = row < rows && d < D ? static_cast<float>(src[row * rs + d]) : 0.f;
  }
}

// acc[i][j] += sum over x < n of a[x * kVecLd + r0 + i] * b[x * bx + (c0 + 16 j) * bc].
template <int NJ>
__device__ __forceinline__ void tile_fma(float (&acc)[4][NJ], const float* a, int r0, const float* b, int bx, int bc,
                                         int c0, int n) {
#pragma unroll 4
  for (int x = 0; x < n; ++x) {
    const float4 av = *reinterpret_cast<const float4*>(a + x * kVecLd + r0);
    float bv[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) bv[j] = b[x * bx + (c0 + 16 * j) * bc];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      acc[0][j] = fmaf(av.x, bv[j], acc[0][j]);
      acc[1][j] = fmaf(av.y, bv[j], acc[1][j]);
      acc[2][j] = fmaf(av.z, bv[j], acc[2][j]);
      acc[3][j] = fmaf(av.w, bv[j], acc[3][j]);
    }
  }
}

// Stores a thread's 4 x 4 values transposed: dst[(c0 + 16 j) * kVecLd + r0 + i] = v[i][j].
__device__ __forceinline__ void store_transposed(float* dst, const float (&v)[4][4], int r0, int c0) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    *reinterpret_cast<float4*>(dst + (c0 + 16 * j) * kVecLd + r0) = make_float4(v[0][j], v[1][j], v[2][j], v[3][j]);
}

// Reduces over the 16 threads of a row (lanes that differ in their low four bits).
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int off = 8; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int off = 8; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

__device__ __forceinline__ bool attends(int64_t query, int64_t key, int64_t L, int64_t S, bool causal) {
  return query < L && key < math::attention_keys(query, S, causal);
}

// The dropout factor of (query, key) of problem bh: 1 without dropout.
__device__ __forceinline__ float dropout_factor(const AttentionDropout& drop, int64_t bh, int64_t query, int64_t key,
                                                int64_t L, int64_t S) {
  if (drop.rate == 0.f) return 1.f;
  const uint64_t e = static_cast<uint64_t>((bh * L + query) * S + key);
  return math::attention_dropout_factor(e, drop.rate, drop.scale, drop.seed, drop.offset);
}

// Writes rows [row0, row0 + kTile) x D of a thread's accumulators (times scale) as T, rows rs
// apart.
template <int NJ, class T>
__device__ __forceinline__ void store_rows(T* __restrict__ dst, int64_t rs, const float (&acc)[4][NJ],
                                           const float* row_scale, int64_t row0, int64_t rows, int D, int ty, int tx) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty * 4 + i;
    if (row >= rows) continue;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      const int d = tx + 16 * j;
      if (d < D) dst[row * rs + d] = convert<T>(acc[i][j] * row_scale[i]);
    }
  }
}

template <int kD> constexpr size_t forward_smem() {
  return sizeof(float) * (kD * kVecLd + 2 * kD * kOddLd + kTile * kVecLd);
}
template <int kD> constexpr size_t backward_smem() {
  return sizeof(float) * (2 * kD * kVecLd + 2 * kD * kOddLd + kTile * kVecLd + 2 * kTile);
}

template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                             T* __restrict__ o, float* __restrict__ lse, int64_t L, int64_t S, int D, float scale2,
                             bool causal, AttentionDropout drop, math::AttentionLayout at) {
  constexpr int NJ = kD / 16;
  extern __shared__ float4 smem4[];
  float* qt = reinterpret_cast<float*>(smem4);  // [kD][kVecLd]
  float* kt = qt + kD * kVecLd;                 // [kD][kOddLd]
  float* vt = kt + kD * kOddLd;                 // [kD][kOddLd]
  float* pt = vt + kD * kOddLd;                 // [key][kVecLd]: p transposed
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t bh = blockIdx.x, q0 = (static_cast<int64_t>(gridDim.y) - 1 - blockIdx.y) * kTile;
  q += at.q.offset(bh), k += at.k.offset(bh), v += at.v.offset(bh), o += at.o.offset(bh), lse += bh * L;
  load_transposed<kD>(qt, kVecLd, q, at.q.row_stride, q0, L, D);
  float m[4], l[4], acc[4][NJ];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; ++j) acc[i][j] = 0.f;
  }
  const int64_t key_end = causal ? (q0 + kTile < S ? q0 + kTile : S) : S;
  for (int64_t k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // the last tile's readers are done
    load_transposed<kD>(kt, kOddLd, k, at.k.row_stride, k0, S, D);
    load_transposed<kD>(vt, kOddLd, v, at.v.row_stride, k0, S, D);
    __syncthreads();
    float s[4][4] = {};
    tile_fma<4>(s, qt, ty * 4, kt, kOddLd, 1, tx, kD);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t query = q0 + ty * 4 + i;
      float mx = m[i];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[i][j] = attends(query, k0 + tx + 16 * j, L, S, causal) ? s[i][j] * scale2 : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      mx = row_max(mx);
      const float base = mx == -INFINITY ? 0.f : mx;  // a row with nothing to attend yet stays at 0
      const float rescale = exp2f(m[i] - base);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) sum += (s[i][j] = exp2f(s[i][j] - base));
      l[i] = l[i] * rescale + row_sum(sum);
      m[i] = mx;
#pragma unroll
      for (int j = 0; j < NJ; ++j) acc[i][j] *= rescale;
      if (drop.rate > 0.f) {  // o is made of the dropped weights; l, the normalizer, of all
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (s[i][j] != 0.f) s[i][j] *= dropout_factor(drop, bh, query, k0 + tx + 16 * j, L, S);
      }
    }
    store_transposed(pt, s, ty * 4, tx);
    __syncthreads();
    tile_fma<NJ>(acc, pt, ty * 4, vt, 1, kOddLd, tx, kTile);
  }
  float inv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) inv[i] = 1.f / l[i];
  store_rows(o, at.o.row_stride, acc, inv, q0, L, D, ty, tx);
  if (tx == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (q0 + ty * 4 + i < L) lse[q0 + ty * 4 + i] = (m[i] + log2f(l[i])) * kLn2;
  }
}

// delta = do . o for each of `rows` queries (L per problem): a warp per query.
template <class T>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(const T* __restrict__ o, const T* __restrict__ go, float* __restrict__ delta,
                           int64_t rows, int64_t L, int D, math::AttentionRows lo, math::AttentionRows lgo) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together
  const int64_t problem = row / L, query = row % L;
  o += lo.offset(problem) + query * lo.row_stride;
  go += lgo.offset(problem) + query * lgo.row_stride;
  float sum = 0.f;
  for (int d = threadIdx.x % 32; d < D; d += 32) sum += static_cast<float>(o[d]) * static_cast<float>(go[d]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (threadIdx.x % 32 == 0) delta[row] = sum;
}

// dk and dv of 64 keys: the query tiles that attend them, p^T and dp^T recomputed per tile.
template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kv_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                 const T* __restrict__ go, const float* __restrict__ lse,
                                 const float* __restrict__ delta, T* __restrict__ gk, T* __restrict__ gv, int64_t L,
                                 int64_t S, int D, float scale2, float scale, bool causal, AttentionDropout drop,
                                 math::AttentionLayout at) {
  constexpr int NJ = kD / 16;
  extern __shared__ float4 smem4[];
  float* kt = reinterpret_cast<float*>(smem4);  // [kD][kVecLd]
  float* vt = kt + kD * kVecLd;                 // [kD][kVecLd]
  float* qt = vt + kD * kVecLd;                 // [kD][kOddLd]
  float* dot = qt + kD * kOddLd;                // [kD][kOddLd]
  float* pt = dot + kD * kOddLd;                // [query][kVecLd]: p^T, then ds^T
  float* lse2 = pt + kTile * kVecLd;            // [query]: lse in base 2
  float* dl = lse2 + kTile;                     // [query]: delta
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t bh = blockIdx.x, k0 = static_cast<int64_t>(blockIdx.y) * kTile;
  q += at.q.offset(bh), k += at.k.offset(bh), v += at.v.offset(bh), go += at.go.offset(bh);
  lse += bh * L, delta += bh * L, gk += at.gk.offset(bh), gv += at.gv.offset(bh);
  load_transposed<kD>(kt, kVecLd, k, at.k.row_stride, k0, S, D);
  load_transposed<kD>(vt, kVecLd, v, at.v.row_stride, k0, S, D);
  float dk[4][NJ] = {}, dv[4][NJ] = {};
  // causal: queries before k0 attend none of these keys
  for (int64_t q0 = causal ? k0 : 0; q0 < L; q0 += kTile) {
    __syncthreads();
    load_transposed<kD>(qt, kOddLd, q, at.q.row_stride, q0, L, D);
    load_transposed<kD>(dot, kOddLd, go, at.go.row_stride, q0, L, D);
    for (int r = threadIdx.x; r < kTile; r += kThreads) {
      lse2[r] = q0 + r < L ? lse[q0 + r] * kLog2e : 0.f;
      dl[r] = q0 + r < L ? delta[q0 + r] : 0.f;
    }
    __syncthreads();
    float p[4][4] = {}, dp[4][4] = {};
    tile_fma<4>(p, kt, ty * 4, qt, kOddLd, 1, tx, kD);   // scores^T (key, query)
    tile_fma<4>(dp, vt, ty * 4, dot, kOddLd, 1, tx, kD);  // dp^T = v . do
    float pd[4][4];  // p^T times the dropout factors: what o was made of
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = tx + 16 * j;
        const bool on = attends(q0 + c, k0 + ty * 4 + i, L, S, causal);
        const float f = on ? dropout_factor(drop, bh, q0 + c, k0 + ty * 4 + i, L, S) : 0.f;
        p[i][j] = on ? exp2f(p[i][j] * scale2 - lse2[c]) : 0.f;
        pd[i][j] = p[i][j] * f;
        dp[i][j] = math::attention_score_grad(p[i][j], dp[i][j] * f, dl[c]);
      }
    store_transposed(pt, pd, ty * 4, tx);
    __syncthreads();
    tile_fma<NJ>(dv, pt, ty * 4, dot, 1, kOddLd, tx, kTile);  // dv += pd^T do
    __syncthreads();
    store_transposed(pt, dp, ty * 4, tx);
    __syncthreads();
    tile_fma<NJ>(dk, pt, ty * 4, qt, 1, kOddLd, tx, kTile);  // dk += ds^T q
  }
  const float scales[4] = {scale, scale, scale, scale}, ones[4] = {1.f, 1.f, 1.f, 1.f};
  store_rows(gk, at.gk.row_stride, dk, scales, k0, S, D, ty, tx);
  store_rows(gv, at.gv.row_stride, dv, ones, k0, S, D, ty, tx);
}

// dq of 64 queries: the key tiles they attend, p and dp recomputed per tile.
template <class T, int kD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_q_kernel(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                const T* __restrict__ go, const float* __restrict__ lse,
                                const float* __restrict__ delta, T* __restrict__ gq, int64_t L, int64_t S, int D,
                                float scale2, float scale, bool causal, AttentionDropout drop,
                                math::AttentionLayout at) {
  constexpr int NJ = kD / 16;
  extern __shared__ float4 smem4[];
  float* qt = reinterpret_cast<float*>(smem4);  // [kD][kVecLd]
  float* dot = qt + kD * kVecLd;                // [kD][kVecLd]
  float* kt = dot + kD * kVecLd;                // [kD][kOddLd]
  float* vt = kt + kD * kOddLd;                 // [kD][kOddLd]
  float* dst = vt + kD * kOddLd;                // [key][kVecLd]: ds transposed
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t bh = blockIdx.x, q0 = (static_cast<int64_t>(gridDim.y) - 1 - blockIdx.y) * kTile;
  q += at.q.offset(bh), k += at.k.offset(bh), v += at.v.offset(bh), go += at.go.offset(bh);
  lse += bh * L, delta += bh * L, gq += at.gq.offset(bh);
  load_transposed<kD>(qt, kVecLd, q, at.q.row_stride, q0, L, D);
  load_transposed<kD>(dot, kVecLd, go, at.go.row_stride, q0, L, D);
  float lse2[4], dl[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t query = q0 + ty * 4 + i;
    lse2[i] = query < L ? lse[query] * kLog2e : 0.f;
    dl[i] = query < L ? delta[query] : 0.f;
  }
  float dq[4][NJ] = {};
  const int64_t key_end = causal ? (q0 + kTile < S ? q0 + kTile : S) : S;
  for (int64_t k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();
    load_transposed<kD>(kt, kOddLd, k, at.k.row_stride, k0, S, D);
    load_transposed<kD>(vt, kOddLd, v, at.v.row_stride, k0, S, D);
    __syncthreads();
    float s[4][4] = {}, dp[4][4] = {};
    tile_fma<4>(s, qt, ty * 4, kt, kOddLd, 1, tx, kD);
    tile_fma<4>(dp, dot, ty * 4, vt, kOddLd, 1, tx, kD);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t query = q0 + ty * 4 + i, key = k0 + tx + 16 * j;
        const bool on = attends(query, key, L, S, causal);
        const float p = on ? exp2f(s[i][j] * scale2 - lse2[i]) : 0.f;
        const float f = on ? dropout_factor(drop, bh, query, key, L, S) : 0.f;
        dp[i][j] = math::attention_score_grad(p, dp[i][j] * f, dl[i]);
      }
    store_transposed(dst, dp, ty * 4, tx);
    __syncthreads();
    tile_fma<NJ>(dq, dst, ty * 4, kt, 1, kOddLd, tx, kTile);  // dq += ds k
  }
  const float scales[4] = {scale, scale, scale, scale};
  store_rows(gq, at.gq.row_stride, dq, scales, q0, L, D, ty, tx);
}

// Calls f with the padded head dim as a compile-time constant.
template <class F>
cudaError_t with_head_dim(int64_t D, F&& f) {
  if (D <= 32) return f(std::integral_constant<int, 32>{});
  if (D <= 64) return f(std::integral_constant<int, 64>{});
  if (D <= kMaxAttentionDim) return f(std::integral_constant<int, 128>{});
  return cudaErrorInvalidValue;
}

// Launches kernel on (batch, blocks) with the dynamic shared memory it needs.
template <class Kernel, class... Args>
cudaError_t launch(Kernel kernel, size_t smem, cudaStream_t stream, int64_t batch, int64_t blocks, Args... args) {
  if (batch > 2147483647 || blocks > 65535) return cudaErrorInvalidValue;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  kernel<<<dim3(static_cast<unsigned>(batch), static_cast<unsigned>(blocks)), kThreads, smem, stream>>>(args...);
  return cudaGetLastError();
}

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }

}  // namespace

size_t attention_shared_bytes(int64_t D) {
  size_t bytes = 0;
  with_head_dim(D, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    bytes = std::max(forward_smem<kD>(), backward_smem<kD>());
    return cudaSuccess;
  });
  return bytes;
}

template <class T>
cudaError_t attention_forward(cudaStream_t stream, const T* q, const T* k, const T* v, T* o, float* lse,
                              int64_t batch, int64_t L, int64_t S, int64_t D, double scale, bool causal,
                              AttentionDropout dropout, const math::AttentionLayout& layout) {
  if (batch == 0 || L == 0 || S == 0 || D == 0) return cudaSuccess;
  return with_head_dim(D, [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    return launch(attention_forward_kernel<T, kD>, forward_smem<kD>(), stream, batch, tiles(L), q, k, v, o, lse, L, S,
                  static_cast<int>(D), static_cast<float>(scale) * kLog2e, causal, dropout, layout);
  });
}

template <class T>
cudaError_t attention_backward(cudaStream_t stream, const T* q, const T* k, const T* v, const T* o, const T* go,
                               const float* lse, float* delta, T* gq, T* gk, T* gv, int64_t batch, int64_t L,
                               int64_t S, int64_t D, double scale, bool causal, AttentionDropout dropout,
                               const math::AttentionLayout& layout) {
  if (batch == 0 || L == 0 || S == 0 || D == 0) return cudaSuccess;
  const int64_t rows = batch * L, warps = kThreads / 32;
  if ((rows + warps - 1) / warps > 2147483647) return cudaErrorInvalidValue;
  attention_delta_kernel<T><<<static_cast<unsigned>((rows + warps - 1) / warps), kThreads, 0, stream>>>(
      o, go, delta, rows, L, static_cast<int>(D), layout.o, layout.go);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const float sc = static_cast<float>(scale), scale2 = sc * kLog2e;
  return with_head_dim(D, [&](auto kd) {
    constexpr int kD = decltype(kd)::value;
    cudaError_t e = launch(attention_backward_kv_kernel<T, kD>, backward_smem<kD>(), stream, batch, tiles(S), q, k, v,
                           go, lse, static_cast<const float*>(delta), gk, gv, L, S, static_cast<int>(D), scale2, sc,
                           causal, dropout, layout);
    if (e != cudaSuccess) return e;
    return launch(attention_backward_q_kernel<T, kD>, backward_smem<kD>(), stream, batch, tiles(L), q, k, v, go, lse,
                  static_cast<const float*>(delta), gq, L, S, static_cast<int>(D), scale2, sc, causal, dropout,
                  layout);
  });
}

#define STRATA_ATTENTION(T)                                                                                         \
  template cudaError_t attention_forward<T>(cudaStream_t, const T*, const T*, const T*, T*, float*, int64_t,       \
                                            int64_t, int64_t, int64_t, double, bool, AttentionDropout,             \
                                            const math::AttentionLayout&);                                         \
  template cudaError_t attention_backward<T>(cudaStream_t, const T*, const T*, const T*, const T*, const T*,       \
                                             const float*, float*, T*, T*, T*, int64_t, int64_t, int64_t, int64_t, \
                                             double, bool, AttentionDropout, const math::AttentionLayout&);
STRATA_ATTENTION(Half)
STRATA_ATTENTION(BFloat16)
STRATA_ATTENTION(float)
#undef STRATA_ATTENTION

}  // namespace strata::cuda_kernels
