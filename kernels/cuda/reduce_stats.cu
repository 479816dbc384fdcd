// CUDA var / std, logsumexp and the vector norms over any dims, through the one reduction
// launcher (reduce.cuh) and the CPU's functors. var and logsumexp take two passes as on the
// CPU: a per-output mean (or max) in scratch memory, then the squared deviations from it (or
// the sum of shifted exponentials).
#include <cmath>

#include "reduce.cuh"

namespace strata::cuda_kernels {

namespace {

template <class Acc>
struct MeanStore {
  Acc* mean;  // indexed by the output's plan-order index
  Acc count;
  __device__ void operator()(int64_t, int64_t o, Acc acc) const { mean[o] = acc / count; }
};

template <class T, class Acc>
struct VarStore {
  T* out;
  Acc divisor;
  bool take_sqrt;
  __device__ void operator()(int64_t off, int64_t, Acc acc) const {
    Acc v = acc / divisor;
    out[off] = convert<T>(take_sqrt ? std::sqrt(v) : v);
  }
};

template <class C>
struct ShiftStore {
  C* shift;
  // an infinite max would give inf - inf: shift by 0 instead, which keeps inf and -inf
  __device__ void operator()(int64_t, int64_t o, C m) const { shift[o] = std::isinf(m) ? C(0) : m; }
};

template <class T, class Acc, class C>
struct LogSumExpStore {
  T* out;
  const C* shift;
  __device__ void operator()(int64_t off, int64_t o, Acc acc) const {
    out[off] = convert<T>(static_cast<Acc>(shift[o]) + std::log(acc));
  }
};

template <class T, math::NormKind K, class Acc>
struct NormStore {
  T* out;
  Acc inv_p;
  __device__ void operator()(int64_t off, int64_t, Acc acc) const {
    if constexpr (K == math::NormKind::Two) out[off] = convert<T>(std::sqrt(acc));
    else if constexpr (K == math::NormKind::General) out[off] = convert<T>(std::pow(acc, inv_p));
    else out[off] = convert<T>(acc);
  }
};

template <math::NormKind K, class T>
cudaError_t norm_kind(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, double p, const Scratch& scratch) {
  using Acc = math::acc_t<T>;
  return reduce(plan, s, in, math::NormReduce<T, K>{static_cast<Acc>(p)},
                NormStore<T, K, Acc>{out, static_cast<Acc>(1 / p)}, scratch);
}

}  // namespace

template <class T>
cudaError_t var(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, double correction, bool take_sqrt,
                const Scratch& scratch) {
  using Acc = math::acc_t<T>;
  if (plan.num_out == 0) return cudaSuccess;
  Acc* mean = static_cast<Acc*>(scratch.get(static_cast<size_t>(plan.num_out) * sizeof(Acc)));
  const Acc n = static_cast<Acc>(plan.num_red);
  cudaError_t err = reduce(plan, s, in, math::SumReduce<T>{}, MeanStore<Acc>{mean, n}, scratch);
  if (err != cudaSuccess) return err;
  const Acc divisor = n - static_cast<Acc>(correction) > Acc(0) ? n - static_cast<Acc>(correction) : Acc(0);
  return reduce(plan, s, in, math::SquaredDeviationReduce<T>{mean}, VarStore<T, Acc>{out, divisor, take_sqrt},
                scratch);
}

template <class T>
cudaError_t logsumexp(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch) {
  using C = compute_t<T>;
  using Acc = math::acc_t<T>;
  if (plan.num_out == 0) return cudaSuccess;
  C* shift = static_cast<C*>(scratch.get(static_cast<size_t>(plan.num_out) * sizeof(C)));
  cudaError_t err = reduce(plan, s, in, math::MaxReduce<T>{}, ShiftStore<C>{shift}, scratch);
  if (err != cudaSuccess) return err;
  return reduce(plan, s, in, math::ShiftedExpReduce<T>{shift}, LogSumExpStore<T, Acc, C>{out, shift}, scratch);
}

template <class T>
cudaError_t norm(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, double p, const Scratch& scratch) {
  using K = math::NormKind;
  if (p == 2) return norm_kind<K::Two>(plan, s, out, in, p, scratch);
  if (p == 1) return norm_kind<K::One>(plan, s, out, in, p, scratch);
  if (p == 0) return norm_kind<K::Zero>(plan, s, out, in, p, scratch);
  if (std::isinf(p)) return p > 0 ? norm_kind<K::Inf>(plan, s, out, in, p, scratch)
                                  : norm_kind<K::NegInf>(plan, s, out, in, p, scratch);
  return norm_kind<K::General>(plan, s, out, in, p, scratch);
}

// Explicit instances: the floating dtypes.
#define STRATA_STATS(T)                                                                                    \
  template cudaError_t var<T>(const ReducePlan&, cudaStream_t, T*, const T*, double, bool, const Scratch&); \
  template cudaError_t logsumexp<T>(const ReducePlan&, cudaStream_t, T*, const T*, const Scratch&);        \
  template cudaError_t norm<T>(const ReducePlan&, cudaStream_t, T*, const T*, double, const Scratch&);
STRATA_STATS(Half)
STRATA_STATS(BFloat16)
STRATA_STATS(float)
STRATA_STATS(double)
#undef STRATA_STATS

}  // namespace strata::cuda_kernels
