// CUDA multi-tensor updates of SGD, Adam/AdamW, Adagrad and RMSprop: one launch updates up to
// multi_tensor::kMaxTensors parameters, one block per 16384-element chunk, with the
// per-element rules of kernels/common/optim_math.h. Entry points in optim_ops.h.
#include "optim_common.cuh"
#include "optim_ops.h"

namespace strata::cuda_kernels::optim {

namespace {

struct SgdExtra {
  bool first;
};
struct AdagradExtra {
  double clr;
};

template <class T, bool kMomentum>
__global__ void __launch_bounds__(kThreads) sgd_kernel(mt::TensorTable<3, SgdExtra> tab, math::SgdConsts<T> c) {
  const mt::Chunk ch = mt::find_chunk(tab);
  T* __restrict__ p = mt::list<T>(tab, 0, ch.t);
  const T* __restrict__ g = mt::list<const T>(tab, 1, ch.t);
  T* __restrict__ buf = mt::list<T>(tab, 2, ch.t);
  const bool first = tab.extra[ch.t].first;
#pragma unroll 4
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += kThreads) {
    T pi = p[i];
    if constexpr (kMomentum) {
      T bi = buf[i];
      math::sgd_momentum_update(pi, g[i], bi, first, c);
      buf[i] = bi;
    } else {
      math::sgd_update(pi, g[i], c);
    }
    p[i] = pi;
  }
}

template <class T, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads) adam_kernel(mt::TensorTable<5, AdamExtra> tab, math::AdamConsts<T> c) {
  const mt::Chunk ch = mt::find_chunk(tab);
  T* __restrict__ p = mt::list<T>(tab, 0, ch.t);
  const T* __restrict__ g = mt::list<const T>(tab, 1, ch.t);
  T* __restrict__ m = mt::list<T>(tab, 2, ch.t);
  T* __restrict__ v = mt::list<T>(tab, 3, ch.t);
  T* __restrict__ vmax = mt::list<T>(tab, 4, ch.t);
  const AdamExtra& e = tab.extra[ch.t];
  c.step_size = T(e.dev ? e.dev[0] : e.step_size);
  c.bc2_sqrt = T(e.dev ? e.dev[1] : e.bc2_sqrt);
  if (e.dev) c.decay = T(e.dev[2]);
#pragma unroll 4
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += kThreads) {
    T pi = p[i], mi = m[i], vi = v[i];
    if constexpr (kAmsgrad) {
      T xi = vmax[i];
      math::adam_amsgrad_update(pi, g[i], mi, vi, xi, c);
      vmax[i] = xi;
    } else {
      math::adam_update(pi, g[i], mi, vi, c);
    }
    p[i] = pi, m[i] = mi, v[i] = vi;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) adagrad_kernel(mt::TensorTable<3, AdagradExtra> tab,
                                                           math::AdagradConsts<T> c) {
  const mt::Chunk ch = mt::find_chunk(tab);
  T* __restrict__ p = mt::list<T>(tab, 0, ch.t);
  const T* __restrict__ g = mt::list<const T>(tab, 1, ch.t);
  T* __restrict__ sum = mt::list<T>(tab, 2, ch.t);
  c.clr = T(tab.extra[ch.t].clr);
#pragma unroll 4
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += kThreads) {
    T pi = p[i], si = sum[i];
    math::adagrad_update(pi, g[i], si, c);
    p[i] = pi, sum[i] = si;
  }
}

template <class T, bool kCentered, bool kMomentum>
__global__ void __launch_bounds__(kThreads) rmsprop_kernel(mt::TensorTable<5, mt::NoExtra> tab,
                                                           math::RmspropConsts<T> c) {
  const mt::Chunk ch = mt::find_chunk(tab);
  T* __restrict__ p = mt::list<T>(tab, 0, ch.t);
  const T* __restrict__ g = mt::list<const T>(tab, 1, ch.t);
  T* __restrict__ sq = mt::list<T>(tab, 2, ch.t);
  T* __restrict__ gavg = mt::list<T>(tab, 3, ch.t);
  T* __restrict__ buf = mt::list<T>(tab, 4, ch.t);
#pragma unroll 4
  for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += kThreads) {
    T pi = p[i], si = sq[i], ai = T(0), bi = T(0);
    if constexpr (kCentered) ai = gavg[i];
    if constexpr (kMomentum) bi = buf[i];
    math::rmsprop_update<kCentered, kMomentum>(pi, g[i], si, ai, bi, c);
    p[i] = pi, sq[i] = si;
    if constexpr (kCentered) gavg[i] = ai;
    if constexpr (kMomentum) buf[i] = bi;
  }
}

// Whether an optional state (a momentum buffer, ...) is on: a zero-size parameter has a null
// pointer for every state, so the batch's first tensor alone cannot tell.
template <class Item, class Ptr>
bool any_set(const Item* ts, int64_t count, Ptr Item::*state) {
  for (int64_t i = 0; i < count; ++i)
    if (ts[i].*state != nullptr) return true;
  return false;
}

}  // namespace

template <class T>
cudaError_t sgd(const SgdTensor<T>* ts, int64_t count, const math::SgdConsts<double>& c64, cudaStream_t s) {
  using Table = mt::TensorTable<3, SgdExtra>;
  const math::SgdConsts<T> c = to_t<T>(c64);
  const bool momentum = any_set(ts, count, &SgdTensor<T>::buf);
  return mt::for_each_launch<Table>(
      count, kChunk,
      [&](Table& tab, int slot, int64_t i) {
        mt::set_pointers(tab, slot, ts[i].p, ts[i].g, ts[i].buf);
        tab.extra[slot].first = ts[i].first;
        return ts[i].n;
      },
      [&](const Table& tab, unsigned blocks) {
        if (momentum) sgd_kernel<T, true><<<blocks, kThreads, 0, s>>>(tab, c);
        else sgd_kernel<T, false><<<blocks, kThreads, 0, s>>>(tab, c);
      });
}

template <class T>
cudaError_t adam(const AdamTensor<T>* ts, int64_t count, const math::AdamConsts<double>& c64, cudaStream_t s) {
  using Table = mt::TensorTable<5, AdamExtra>;
  const math::AdamConsts<T> c = to_t<T>(c64);
  const bool amsgrad = any_set(ts, count, &AdamTensor<T>::vmax);
  return mt::for_each_launch<Table>(
      count, kChunk,
      [&](Table& tab, int slot, int64_t i) {
        mt::set_pointers(tab, slot, ts[i].p, ts[i].g, ts[i].m, ts[i].v, ts[i].vmax);
        tab.extra[slot] = {ts[i].step_size, ts[i].bc2_sqrt, ts[i].corrections};
        return ts[i].n;
      },
      [&](const Table& tab, unsigned blocks) {
        if (amsgrad) adam_kernel<T, true><<<blocks, kThreads, 0, s>>>(tab, c);
        else adam_kernel<T, false><<<blocks, kThreads, 0, s>>>(tab, c);
      });
}

template <class T>
cudaError_t adagrad(const AdagradTensor<T>* ts, int64_t count, const math::AdagradConsts<double>& c64,
                    cudaStream_t s) {
  using Table = mt::TensorTable<3, AdagradExtra>;
  const math::AdagradConsts<T> c = to_t<T>(c64);
  return mt::for_each_launch<Table>(
      count, kChunk,
      [&](Table& tab, int slot, int64_t i) {
        mt::set_pointers(tab, slot, ts[i].p, ts[i].g, ts[i].sum);
        tab.extra[slot].clr = ts[i].clr;
        return ts[i].n;
      },
      [&](const Table& tab, unsigned blocks) { adagrad_kernel<T><<<blocks, kThreads, 0, s>>>(tab, c); });
}

template <class T>
cudaError_t rmsprop(const RmspropTensor<T>* ts, int64_t count, const math::RmspropConsts<double>& c64,
                    cudaStream_t s) {
  using Table = mt::TensorTable<5, mt::NoExtra>;
  const math::RmspropConsts<T> c = to_t<T>(c64);
  const bool centered = any_set(ts, count, &RmspropTensor<T>::gavg),
             momentum = any_set(ts, count, &RmspropTensor<T>::buf);
  return mt::for_each_launch<Table>(
      count, kChunk,
      [&](Table& tab, int slot, int64_t i) {
        mt::set_pointers(tab, slot, ts[i].p, ts[i].g, ts[i].sq, ts[i].gavg, ts[i].buf);
        return ts[i].n;
      },
      [&](const Table& tab, unsigned blocks) {
        if (centered && momentum) rmsprop_kernel<T, true, true><<<blocks, kThreads, 0, s>>>(tab, c);
        else if (centered) rmsprop_kernel<T, true, false><<<blocks, kThreads, 0, s>>>(tab, c);
        else if (momentum) rmsprop_kernel<T, false, true><<<blocks, kThreads, 0, s>>>(tab, c);
        else rmsprop_kernel<T, false, false><<<blocks, kThreads, 0, s>>>(tab, c);
      });
}

#define STRATA_OPTIM_INSTANCES(T)                                                                               \
  template cudaError_t sgd<T>(const SgdTensor<T>*, int64_t, const math::SgdConsts<double>&, cudaStream_t);      \
  template cudaError_t adam<T>(const AdamTensor<T>*, int64_t, const math::AdamConsts<double>&, cudaStream_t);   \
  template cudaError_t adagrad<T>(const AdagradTensor<T>*, int64_t, const math::AdagradConsts<double>&,         \
                                  cudaStream_t);                                                                \
  template cudaError_t rmsprop<T>(const RmspropTensor<T>*, int64_t, const math::RmspropConsts<double>&,         \
                                  cudaStream_t);
STRATA_OPTIM_INSTANCES(float)
STRATA_OPTIM_INSTANCES(double)
#undef STRATA_OPTIM_INSTANCES

}  // namespace strata::cuda_kernels::optim
