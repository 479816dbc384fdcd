// CUDA multi-tensor LAMB, in three kernels and no host synchronization:
//   1. per chunk: update m and v, and sum ||p||^2 and ||u||^2 in double into partials[chunk];
//   2. per tensor: add its chunks' partials in order and write its trust ratio;
//   3. per chunk: p -= lr * ratio * u, u recomputed from the stored m and v as in phase 1.
// Sums run in a fixed order (no atomics), so a step is deterministic. Entry point in optim_ops.h.
#include "../common/optim_math.h"
#include "optim_common.cuh"
#include "optim_ops.h"

namespace strata::cuda_kernels::optim {

namespace {

struct LambExtra {
  double bc1, bc2;
  int64_t index;  // the tensor's position in the call: its trust ratio is ratios[index]
};

template <class T>
__device__ __forceinline__ math::LambConsts<T> with_corrections(math::LambConsts<T> c, const LambExtra& e) {
  c.bc1 = T(e.bc1);
  c.bc2 = T(e.bc2);
  return c;
}

template <class T>
__global__ void __launch_bounds__(kThreads) lamb_moments_kernel(mt::TensorTable<4, LambExtra> tab,
                                                                math::LambConsts<T> c, double* partials) {
  const mt::Chunk ch = mt::find_chunk(tab);
  const T* __restrict__ p = mt::list<const T>(tab, 0, ch.t);
  const T* __restrict__ g = mt::list<const T>(tab, 1, ch.t);
  T* __restrict__ m = mt::list<T>(tab, 2, ch.t);
  T* __restrict__ v = mt::list<T>(tab, 3, ch.t);
  const math::LambConsts<T> ct = with_corrections(c, tab.extra[ch.t]);
  double p_sq = 0, u_sq = 0;
#pragma unroll 4
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += kThreads) {
    T mi = m[i], vi = v[i];
    math::lamb_moments(g[i], mi, vi, ct);
    m[i] = mi, v[i] = vi;
    const T pi = p[i];
    const T u = math::lamb_direction(pi, mi, vi, ct);  // from the stored m and v, as phase 3
    p_sq += double(pi) * double(pi);
    u_sq += double(u) * double(u);
  }
  block_sum2(p_sq, u_sq);
  if (threadIdx.x == 0) {
    const int64_t k = tab.chunk_base + blockIdx.x;
    partials[2 * k] = p_sq;
    partials[2 * k + 1] = u_sq;
  }
}

// Up to kMaxRatios consecutive tensors of the call: tensor index_base + t owns the partials
// [first[t], first[t + 1]).
inline constexpr int kMaxRatios = 256;
struct RatioTable {
  int64_t first[kMaxRatios + 1];
  int64_t index_base;
  int count;
};

__global__ void __launch_bounds__(kThreads) lamb_ratio_kernel(RatioTable tab, const double* partials, double* ratios,
                                                              double clamp_min, double clamp_max) {
  const int t = blockIdx.x;
  double p_sq = 0, u_sq = 0;
  for (int64_t k = tab.first[t] + threadIdx.x; k < tab.first[t + 1]; k += kThreads) {
    p_sq += partials[2 * k];
    u_sq += partials[2 * k + 1];
  }
  block_sum2(p_sq, u_sq);
  if (threadIdx.x == 0)
    ratios[tab.index_base + t] = math::lamb_trust_ratio(sqrt(p_sq), sqrt(u_sq), clamp_min, clamp_max);
}

template <class T>
__global__ void __launch_bounds__(kThreads) lamb_apply_kernel(mt::TensorTable<3, LambExtra> tab,
                                                              math::LambConsts<T> c, double lr, const double* ratios) {
  const mt::Chunk ch = mt::find_chunk(tab);
  T* __restrict__ p = mt::list<T>(tab, 0, ch.t);
  const T* __restrict__ m = mt::list<const T>(tab, 1, ch.t);
  const T* __restrict__ v = mt::list<const T>(tab, 2, ch.t);
  const math::LambConsts<T> ct = with_corrections(c, tab.extra[ch.t]);
  const T scaled_lr = T(lr * ratios[tab.extra[ch.t].index]);
#pragma unroll 4
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += kThreads) {
    const T pi = p[i];
    p[i] = pi - scaled_lr * math::lamb_direction(pi, m[i], v[i], ct);
  }
}

}  // namespace

template <class T>
cudaError_t lamb(const LambTensor<T>* ts, int64_t count, const math::LambConsts<double>& c64, double lr,
                 double clamp_min, double clamp_max, double* partials, double* ratios, cudaStream_t s) {
  const math::LambConsts<T> c = to_t<T>(c64);
  using Table1 = mt::TensorTable<4, LambExtra>;
  cudaError_t err = mt::for_each_launch<Table1>(
      count, kLambChunk,
      [&](Table1& tab, int slot, int64_t i) {
        mt::set_pointers(tab, slot, ts[i].p, ts[i].g, ts[i].m, ts[i].v);
        tab.extra[slot] = {ts[i].bc1, ts[i].bc2, i};
        return ts[i].n;
      },
      [&](const Table1& tab, unsigned blocks) {
        lamb_moments_kernel<T><<<blocks, kThreads, 0, s>>>(tab, c, partials);
      });
  if (err != cudaSuccess) return err;

  // every tensor gets a ratio, empty ones too (no chunks: norms 0, ratio 1)
  RatioTable rt{};
  int64_t next_chunk = 0;  // chunks are numbered as for_each_launch numbered them above
  for (int64_t i = 0; i < count; ++i) {
    if (rt.count == 0) rt.index_base = i, rt.first[0] = next_chunk;
    next_chunk += ts[i].n > 0 ? lamb_num_chunks(ts[i].n) : 0;
    rt.first[++rt.count] = next_chunk;
    if (rt.count == kMaxRatios || i + 1 == count) {
      lamb_ratio_kernel<<<rt.count, kThreads, 0, s>>>(rt, partials, ratios, clamp_min, clamp_max);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
      rt = RatioTable{};
    }
  }

  using Table3 = mt::TensorTable<3, LambExtra>;
  return mt::for_each_launch<Table3>(
      count, kLambChunk,
      [&](Table3& tab, int slot, int64_t i) {
        mt::set_pointers(tab, slot, ts[i].p, ts[i].m, ts[i].v);
        tab.extra[slot] = {ts[i].bc1, ts[i].bc2, i};
        return ts[i].n;
      },
      [&](const Table3& tab, unsigned blocks) {
        lamb_apply_kernel<T><<<blocks, kThreads, 0, s>>>(tab, c, lr, ratios);
      });
}

template cudaError_t lamb<float>(const LambTensor<float>*, int64_t, const math::LambConsts<double>&, double, double,
                                 double, double*, double*, cudaStream_t);
template cudaError_t lamb<double>(const LambTensor<double>*, int64_t, const math::LambConsts<double>&, double, double,
                                  double, double*, double*, cudaStream_t);

}  // namespace strata::cuda_kernels::optim
