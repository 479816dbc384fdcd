// CUDA quantization kernels (entry points in quant_ops.h), with the CPU's per-element math
// (kernels/common/quant_affine.h): elementwise quantize, dequantize and fake quantize over
// grid-stride loops; dynamic per-row activation quantization, a block per row; the int8 and
// int4 GEMMs as one shared-memory tiled kernel whose operand loaders and epilogue differ (int8
// operands summed in int32, int4 weights dequantized as they are loaded, summed in float).
#include <cfloat>

#include "quant_ops.h"

namespace strata::cuda_kernels::quant {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

__device__ int64_t channel_of(int64_t i, const ChannelLayout& l) { return (i / l.inner) % l.channels; }

template <class Q>
__global__ void quantize_kernel(const float* x, Q* q, ChannelLayout l, const float* scale, const int32_t* zp,
                                int32_t qmin, int32_t qmax) {
  const int64_t n = l.outer * l.channels * l.inner;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = channel_of(i, l);
    q[i] = static_cast<Q>(qmath::quantize_value(x[i], 1.0f / scale[c], zp[c], qmin, qmax));
  }
}

__global__ void quantize_rowwise_kernel(const float* w, int64_t rows, int64_t dim, int bits, uint8_t* codes,
                                        float* scale, float* bias) {
  const int64_t bytes = qmath::rowwise_bytes(dim, bits);
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const qmath::RowQParams p = qmath::quantize_row_float_qparams(w + r * dim, dim, bits, codes + r * bytes);
    scale[r] = p.scale;
    bias[r] = p.bias;
  }
}

__global__ void embedding_bag_rowwise_kernel(qmath::RowwiseTable t, qmath::Bags g, float* out) {
  const int64_t n = g.bags * t.dim;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = qmath::bag_element(t, g, i / t.dim, i % t.dim);
}

__global__ void im2col_kernel(const uint8_t* x, int64_t total, qmath::Im2colShape shape, uint8_t pad, uint8_t* cols) {
  const int64_t K = shape.cols();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{blockDim.x} * gridDim.x)
    cols[i] = qmath::im2col_code(x, shape, i / K, i % K, pad);
}

template <class Q>
__global__ void dequantize_kernel(const Q* q, float* x, ChannelLayout l, const float* scale, const int32_t* zp) {
  const int64_t n = l.outer * l.channels * l.inner;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = channel_of(i, l);
    x[i] = qmath::dequantize_value(q[i], scale[c], zp[c]);
  }
}

__global__ void fake_quantize_kernel(const float* x, float* out, uint8_t* mask, ChannelLayout l, const float* scale,
                                     const int32_t* zp, int32_t qmin, int32_t qmax) {
  const int64_t n = l.outer * l.channels * l.inner;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = channel_of(i, l);
    bool in = false;
    out[i] = qmath::fake_quantize_value(x[i], scale[c], 1.0f / scale[c], zp[c], qmin, qmax, &in);
    if (mask) mask[i] = in;
  }
}

// one block per row: finite min, max and a non-finite flag reduced in shared memory, then codes
__global__ void quantize_rows_kernel(const float* x, int64_t K, uint8_t* q, float* scale, int32_t* zero_point) {
  __shared__ float lo_s[kThreads], hi_s[kThreads];
  __shared__ int bad_s[kThreads];
  const float* row = x + int64_t(blockIdx.x) * K;
  float lo = FLT_MAX, hi = -FLT_MAX;
  int bad = 0;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    const float v = row[k];
    if (v - v != 0.0f) {
      bad = 1;
      continue;
    }
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  lo_s[threadIdx.x] = lo, hi_s[threadIdx.x] = hi, bad_s[threadIdx.x] = bad;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      lo_s[threadIdx.x] = fminf(lo_s[threadIdx.x], lo_s[threadIdx.x + stride]);
      hi_s[threadIdx.x] = fmaxf(hi_s[threadIdx.x], hi_s[threadIdx.x + stride]);
      bad_s[threadIdx.x] |= bad_s[threadIdx.x + stride];
    }
    __syncthreads();
  }
  lo = lo_s[0], hi = hi_s[0];
  qmath::settle_empty_range(&lo, &hi);
  const qmath::QParams p = qmath::choose_qparams(lo, hi, 0, 255, false);
  const float inv = 1.0f / p.scale;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
    q[int64_t(blockIdx.x) * K + k] = static_cast<uint8_t>(qmath::quantize_value(row[k], inv, p.zero_point, 0, 255));
  if (threadIdx.x == 0) {
    scale[blockIdx.x] = bad_s[0] ? __int_as_float(0x7fc00000) : p.scale;
    zero_point[blockIdx.x] = p.zero_point;
  }
}

__global__ void quantize_int4_kernel(const float* w, int64_t N, int64_t K, int64_t group, bool symmetric,
                                     uint8_t* packed, float* scale, uint8_t* zero_point) {
  const int64_t groups = K / group;
  for (int64_t ng = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ng < N * groups;
       ng += int64_t(gridDim.x) * blockDim.x) {
    const int64_t at = (ng / groups) * K + (ng % groups) * group;
    int32_t zero = 0;
    scale[ng] = qmath::quantize_int4_group(w + at, group, symmetric, packed + at / 2, &zero);
    if (zero_point) zero_point[ng] = static_cast<uint8_t>(zero);
  }
}

__device__ float int4_weight(const uint8_t* packed, const float* scale, const uint8_t* zero_point, int64_t n,
                             int64_t k, int64_t K, int64_t group) {
  const int64_t g = n * (K / group) + k / group;
  const float z = static_cast<float>(zero_point ? zero_point[g] : qmath::kInt4SymmetricZero);
  return qmath::int4_value(packed + n * (K / 2), k, scale[g], z);
}

__global__ void dequantize_int4_kernel(const uint8_t* packed, const float* scale, const uint8_t* zero_point,
                                       int64_t N, int64_t K, int64_t group, float* w) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * K; i += int64_t(gridDim.x) * blockDim.x)
    w[i] = int4_weight(packed, scale, zero_point, i / K, i % K, K, group);
}

// ---- the tiled GEMM: out (m, n) = epilogue(m, n, sum_k A(m, k) * B(n, k)) ----------------------
constexpr int kTile = 16, kDepth = 32;

template <class Acc, class LoadA, class LoadB, class Epilogue>
__global__ void tiled_gemm(int64_t M, int64_t N, int64_t K, LoadA load_a, LoadB load_b, Epilogue epilogue) {
  __shared__ Acc a_s[kTile][kDepth + 1], b_s[kTile][kDepth + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;  // (kTile, kTile) threads
  // rows of A (activation rows, the many) on grid x, whose limit is 2^31 - 1 blocks; B's on y (65535)
  const int64_t m = int64_t(blockIdx.x) * kTile + ty, n = int64_t(blockIdx.y) * kTile + tx;
  Acc sum = 0;
  for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
    for (int j = tx; j < kDepth; j += kTile) {  // each thread loads kDepth / kTile of each tile
      const int64_t k = k0 + j;
      const int64_t am = int64_t(blockIdx.x) * kTile + ty, bn = int64_t(blockIdx.y) * kTile + ty;
      a_s[ty][j] = am < M && k < K ? load_a(am, k) : Acc(0);
      b_s[ty][j] = bn < N && k < K ? load_b(bn, k) : Acc(0);
    }
    __syncthreads();
    for (int j = 0; j < kDepth; ++j) sum += a_s[ty][j] * b_s[tx][j];
    __syncthreads();
  }
  if (m < M && n < N) epilogue(m, n, sum);
}

template <class Acc, class LoadA, class LoadB, class Epilogue>
cudaError_t launch_gemm(int64_t M, int64_t N, int64_t K, LoadA a, LoadB b, Epilogue e, cudaStream_t s) {
  if (M == 0 || N == 0) return cudaSuccess;
  if ((N + kTile - 1) / kTile > 65535) return cudaErrorInvalidConfiguration;  // the caller raises, naming the op
  const dim3 grid(static_cast<unsigned>((M + kTile - 1) / kTile), static_cast<unsigned>((N + kTile - 1) / kTile));
  tiled_gemm<Acc><<<grid, dim3(kTile, kTile), 0, s>>>(M, N, K, a, b, e);
  return cudaGetLastError();
}

template <class Q>
struct Load8bit {
  const Q* p;
  int64_t K;
  __device__ int32_t operator()(int64_t r, int64_t k) const { return p[r * K + k]; }
};

struct StoreS32 {
  int32_t* c;
  int64_t N;
  __device__ void operator()(int64_t m, int64_t n, int32_t sum) const { c[m * N + n] = sum; }
};

struct Int8LinearEpilogue {
  const float *x_scale, *w_scale, *bias;
  const int32_t *x_zero, *w_row_sum;
  bool per_row;
  float* y;
  int64_t N;
  __device__ void operator()(int64_t m, int64_t n, int32_t sum) const {
    const int64_t r = per_row ? m : 0;
    const long long exact = static_cast<long long>(sum) - static_cast<long long>(x_zero[r]) * w_row_sum[n];
    float v = static_cast<float>(exact) * (x_scale[r] * w_scale[n]);
    if (bias) v += bias[n];
    y[m * N + n] = v;
  }
};

template <class T>
struct LoadFloat {
  const T* p;
  int64_t K;
  __device__ float operator()(int64_t r, int64_t k) const { return static_cast<float>(p[r * K + k]); }
};

struct LoadInt4 {
  const uint8_t* packed;
  const float* scale;
  const uint8_t* zero_point;
  int64_t K, group;
  __device__ float operator()(int64_t n, int64_t k) const {
    return int4_weight(packed, scale, zero_point, n, k, K, group);
  }
};

template <class T>
struct Int4Epilogue {
  const T* bias;
  T* y;
  int64_t N;
  __device__ void operator()(int64_t m, int64_t n, float sum) const {
    if (bias) sum += static_cast<float>(bias[n]);
    y[m * N + n] = static_cast<T>(sum);
  }
};

}  // namespace

template <class Q>
cudaError_t quantize_affine(const float* x, Q* q, ChannelLayout l, const float* scale, const int32_t* zero_point,
                            int32_t qmin, int32_t qmax, cudaStream_t s) {
  quantize_kernel<<<grid_for(l.outer * l.channels * l.inner), kThreads, 0, s>>>(x, q, l, scale, zero_point, qmin,
                                                                               qmax);
  return cudaGetLastError();
}
template cudaError_t quantize_affine<int8_t>(const float*, int8_t*, ChannelLayout, const float*, const int32_t*,
                                             int32_t, int32_t, cudaStream_t);
template cudaError_t quantize_affine<uint8_t>(const float*, uint8_t*, ChannelLayout, const float*, const int32_t*,
                                              int32_t, int32_t, cudaStream_t);

template <class Q>
cudaError_t dequantize_affine(const Q* q, float* x, ChannelLayout l, const float* scale, const int32_t* zero_point,
                              cudaStream_t s) {
  dequantize_kernel<<<grid_for(l.outer * l.channels * l.inner), kThreads, 0, s>>>(q, x, l, scale, zero_point);
  return cudaGetLastError();
}
template cudaError_t dequantize_affine<int8_t>(const int8_t*, float*, ChannelLayout, const float*, const int32_t*,
                                               cudaStream_t);
template cudaError_t dequantize_affine<uint8_t>(const uint8_t*, float*, ChannelLayout, const float*, const int32_t*,
                                                cudaStream_t);

cudaError_t fake_quantize(const float* x, float* out, uint8_t* mask, ChannelLayout l, const float* scale,
                          const int32_t* zero_point, int32_t qmin, int32_t qmax, cudaStream_t s) {
  fake_quantize_kernel<<<grid_for(l.outer * l.channels * l.inner), kThreads, 0, s>>>(x, out, mask, l, scale,
                                                                                    zero_point, qmin, qmax);
  return cudaGetLastError();
}

cudaError_t quantize_rows_uint8(const float* x, int64_t M, int64_t K, uint8_t* q, float* scale, int32_t* zero_point,
                               cudaStream_t s) {
  if (M == 0) return cudaSuccess;
  quantize_rows_kernel<<<static_cast<unsigned>(M), kThreads, 0, s>>>(x, K, q, scale, zero_point);
  return cudaGetLastError();
}

cudaError_t gemm_s8s8s32(const int8_t* a, const int8_t* b, int32_t* c, int64_t M, int64_t N, int64_t K,
                         cudaStream_t s) {
  return launch_gemm<int32_t>(M, N, K, Load8bit<int8_t>{a, K}, Load8bit<int8_t>{b, K}, StoreS32{c, N}, s);
}

cudaError_t int8_linear(const uint8_t* xq, const float* x_scale, const int32_t* x_zero, bool x_per_row,
                        const int8_t* wq, const float* w_scale, const int32_t* w_row_sum, const float* bias, float* y,
                        int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  return launch_gemm<int32_t>(M, N, K, Load8bit<uint8_t>{xq, K}, Load8bit<int8_t>{wq, K},
                              Int8LinearEpilogue{x_scale, w_scale, bias, x_zero, w_row_sum, x_per_row, y, N}, s);
}

cudaError_t quantize_int4_groups(const float* w, int64_t N, int64_t K, int64_t group, bool symmetric,
                                 uint8_t* packed, float* scale, uint8_t* zero_point, cudaStream_t s) {
  quantize_int4_kernel<<<grid_for(N * (K / group)), kThreads, 0, s>>>(w, N, K, group, symmetric, packed, scale,
                                                                     zero_point);
  return cudaGetLastError();
}

cudaError_t dequantize_int4(const uint8_t* packed, const float* scale, const uint8_t* zero_point, int64_t N,
                            int64_t K, int64_t group, float* w, cudaStream_t s) {
  dequantize_int4_kernel<<<grid_for(N * K), kThreads, 0, s>>>(packed, scale, zero_point, N, K, group, w);
  return cudaGetLastError();
}

template <class T>
cudaError_t int4_linear(const T* x, const uint8_t* packed, const float* scale, const uint8_t* zero_point,
                        int64_t group, const T* bias, T* y, int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  return launch_gemm<float>(M, N, K, LoadFloat<T>{x, K}, LoadInt4{packed, scale, zero_point, K, group},
                            Int4Epilogue<T>{bias, y, N}, s);
}
template cudaError_t int4_linear<float>(const float*, const uint8_t*, const float*, const uint8_t*, int64_t,
                                        const float*, float*, int64_t, int64_t, int64_t, cudaStream_t);
template cudaError_t int4_linear<BFloat16>(const BFloat16*, const uint8_t*, const float*, const uint8_t*, int64_t,
                                           const BFloat16*, BFloat16*, int64_t, int64_t, int64_t, cudaStream_t);

cudaError_t quantize_rowwise(const float* w, int64_t rows, int64_t dim, int bits, uint8_t* codes, float* scale,
                             float* bias, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  quantize_rowwise_kernel<<<grid_for(rows), kThreads, 0, s>>>(w, rows, dim, bits, codes, scale, bias);
  return cudaGetLastError();
}

cudaError_t embedding_bag_rowwise(const qmath::RowwiseTable& t, const qmath::Bags& g, float* out, cudaStream_t s) {
  if (g.bags * t.dim == 0) return cudaSuccess;
  embedding_bag_rowwise_kernel<<<grid_for(g.bags * t.dim), kThreads, 0, s>>>(t, g, out);
  return cudaGetLastError();
}

cudaError_t im2col_u8(const uint8_t* x, int64_t N, const qmath::Im2colShape& shape, uint8_t pad, uint8_t* cols,
                      cudaStream_t s) {
  const int64_t total = N * shape.rows() * shape.cols();
  if (total == 0) return cudaSuccess;
  im2col_kernel<<<grid_for(total), kThreads, 0, s>>>(x, total, shape, pad, cols);
  return cudaGetLastError();
}

}  // namespace strata::cuda_kernels::quant
