// CUDA amax / amin and argmax / argmin (with or without the values) over any dims, through the
// one reduction launcher (reduce.cuh) and the CPU's functors: NaN wins; the arg-reductions
// keep the first index of the extreme value (the first NaN's when there is one).
#include "reduce.cuh"

namespace strata::cuda_kernels {

namespace {

template <class T, class Acc>
struct ValueStore {
  T* out;
  __device__ void operator()(int64_t off, int64_t, Acc acc) const { out[off] = convert<T>(acc); }
};

template <class T, class C>
struct IndexStore {
  int64_t* indices;
  T* values;  // nullable; same offsets as the indices
  __device__ void operator()(int64_t off, int64_t, math::ValueIndex<C> acc) const {
    indices[off] = acc.index;
    if (values) values[off] = convert<T>(acc.value);
  }
};

template <class Op, class T>
cudaError_t extreme(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch) {
  return reduce(plan, s, in, Op{}, ValueStore<T, typename Op::Acc>{out}, scratch);
}

template <bool IsMax, class T>
cudaError_t arg(const ReducePlan& plan, cudaStream_t s, int64_t* indices, T* values, const T* in,
                const Scratch& scratch) {
  return reduce(plan, s, in, math::ArgReduce<T, IsMax>{}, IndexStore<T, compute_t<T>>{indices, values}, scratch);
}

}  // namespace

template <class T>
cudaError_t amax(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch) {
  return extreme<math::MaxReduce<T>>(plan, s, out, in, scratch);
}
template <class T>
cudaError_t amin(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch) {
  return extreme<math::MinReduce<T>>(plan, s, out, in, scratch);
}
template <class T>
cudaError_t argmax(const ReducePlan& plan, cudaStream_t s, int64_t* indices, T* values, const T* in,
                   const Scratch& scratch) {
  return arg<true>(plan, s, indices, values, in, scratch);
}
template <class T>
cudaError_t argmin(const ReducePlan& plan, cudaStream_t s, int64_t* indices, T* values, const T* in,
                   const Scratch& scratch) {
  return arg<false>(plan, s, indices, values, in, scratch);
}

// Explicit instances: every dtype.
#define STRATA_MINMAX(T)                                                                                   \
  template cudaError_t amax<T>(const ReducePlan&, cudaStream_t, T*, const T*, const Scratch&);           \
  template cudaError_t amin<T>(const ReducePlan&, cudaStream_t, T*, const T*, const Scratch&);           \
  template cudaError_t argmax<T>(const ReducePlan&, cudaStream_t, int64_t*, T*, const T*, const Scratch&); \
  template cudaError_t argmin<T>(const ReducePlan&, cudaStream_t, int64_t*, T*, const T*, const Scratch&);
STRATA_MINMAX(bool)
STRATA_MINMAX(uint8_t)
STRATA_MINMAX(int8_t)
STRATA_MINMAX(int32_t)
STRATA_MINMAX(int64_t)
STRATA_MINMAX(Half)
STRATA_MINMAX(BFloat16)
STRATA_MINMAX(float)
STRATA_MINMAX(double)
#undef STRATA_MINMAX

}  // namespace strata::cuda_kernels
