// CUDA sum, mean and prod over any dims, through the one reduction launcher (reduce.cuh) and
// the CPU's functors: integers and bool accumulate in int64 and give int64, float32 in double,
// float16/bfloat16 in float.
#include "reduce.cuh"

namespace strata::cuda_kernels {

namespace {

template <class Out, class Acc, bool Mean>
struct FoldStore {
  Out* out;
  Acc count;  // elements per output, for the mean
  __device__ void operator()(int64_t off, int64_t, Acc acc) const {
    if constexpr (Mean) out[off] = convert<Out>(acc / count);
    else out[off] = convert<Out>(acc);
  }
};

template <template <class> class Op, bool Mean, class T, class Out>
cudaError_t fold(const ReducePlan& plan, cudaStream_t s, Out* out, const T* in, const Scratch& scratch) {
  using Acc = typename Op<T>::Acc;
  return reduce(plan, s, in, Op<T>{}, FoldStore<Out, Acc, Mean>{out, static_cast<Acc>(plan.num_red)}, scratch);
}

}  // namespace

template <class T>
cudaError_t sum(const ReducePlan& plan, cudaStream_t s, fold_out_t<T>* out, const T* in, const Scratch& scratch) {
  return fold<math::SumReduce, false>(plan, s, out, in, scratch);
}

template <class T>
cudaError_t mean(const ReducePlan& plan, cudaStream_t s, T* out, const T* in, const Scratch& scratch) {
  return fold<math::SumReduce, true>(plan, s, out, in, scratch);
}

template <class T>
cudaError_t prod(const ReducePlan& plan, cudaStream_t s, fold_out_t<T>* out, const T* in, const Scratch& scratch) {
  return fold<math::ProdReduce, false>(plan, s, out, in, scratch);
}

// Explicit instances: sum and prod for every dtype, mean for the floating ones.
#define STRATA_FOLD(T)                                                                                         \
  template cudaError_t sum<T>(const ReducePlan&, cudaStream_t, fold_out_t<T>*, const T*, const Scratch&);     \
  template cudaError_t prod<T>(const ReducePlan&, cudaStream_t, fold_out_t<T>*, const T*, const Scratch&);
#define STRATA_MEAN(T) template cudaError_t mean<T>(const ReducePlan&, cudaStream_t, T*, const T*, const Scratch&);
STRATA_FOLD(bool)
STRATA_FOLD(uint8_t)
STRATA_FOLD(int8_t)
STRATA_FOLD(int32_t)
STRATA_FOLD(int64_t)
STRATA_FOLD(Half)
STRATA_FOLD(BFloat16)
STRATA_FOLD(float)
STRATA_FOLD(double)
STRATA_MEAN(Half)
STRATA_MEAN(BFloat16)
STRATA_MEAN(float)
STRATA_MEAN(double)
#undef STRATA_MEAN
#undef STRATA_FOLD

}  // namespace strata::cuda_kernels
