// CUDA copy between any two dtypes over strided, broadcast operands (convert<Out>, the
// CPU's conversion rules), and fill.
#include "adapters.cuh"
#include "elementwise.cuh"
#include "elementwise_ops.h"

namespace strata::cuda_kernels {

template <class In, class Out>
cudaError_t copy(const StridedLoop<2>& loop, cudaStream_t s, Out* out, const In* in) {
  return elementwise(loop, s, out, ConvertFn<In, Out>{}, in);
}

template <class T>
cudaError_t fill(const StridedLoop<1>& loop, cudaStream_t s, T* out, T value) {
  return elementwise(loop, s, out, FillFn<T>{value});
}

// Explicit instances: every (source, destination) dtype pair, and fill for every dtype.
#define STRATA_COPY(In, Out) template cudaError_t copy<In, Out>(const StridedLoop<2>&, cudaStream_t, Out*, const In*);
#define STRATA_COPY_FROM(In)                                                                          \
  STRATA_COPY(In, Half) STRATA_COPY(In, BFloat16) STRATA_COPY(In, float) STRATA_COPY(In, double)      \
  STRATA_COPY(In, int64_t) STRATA_COPY(In, int32_t) STRATA_COPY(In, int8_t) STRATA_COPY(In, uint8_t) \
  STRATA_COPY(In, bool)                                                                               \
  template cudaError_t fill<In>(const StridedLoop<1>&, cudaStream_t, In*, In);
STRATA_COPY_FROM(Half)
STRATA_COPY_FROM(BFloat16)
STRATA_COPY_FROM(float)
STRATA_COPY_FROM(double)
STRATA_COPY_FROM(int64_t)
STRATA_COPY_FROM(int32_t)
STRATA_COPY_FROM(int8_t)
STRATA_COPY_FROM(uint8_t)
STRATA_COPY_FROM(bool)
#undef STRATA_COPY_FROM
#undef STRATA_COPY

}  // namespace strata::cuda_kernels
