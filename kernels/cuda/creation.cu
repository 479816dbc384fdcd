// CUDA factories: Philox uniform/normal/randint draws and arange/linspace ranges, value i
// computed from i alone exactly as the CPU kernels do (src/ops/creation.cpp), so a seed gives
// the same stream on every device.
#include "../common/convert.h"
#include "../common/philox.h"
#include "../common/range_math.h"
#include "elementwise.cuh"
#include "elementwise_ops.h"

namespace strata::cuda_kernels {

namespace {

template <class T, class G>
__global__ void index_kernel(int64_t n, T* __restrict__ out, G g) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) out[i] = convert<T>(g(i));
}

template <class T, class G>
cudaError_t generate(int64_t n, cudaStream_t s, T* out, G g) {
  if (n == 0) return cudaSuccess;
  index_kernel<<<grid_for(n), kThreads, 0, s>>>(n, out, g);
  return cudaGetLastError();
}

// Where a draw's counters start: the launch's seed and offset, or a graph replay's (`state`).
struct PhiloxStart {
  uint64_t seed, offset;
  const uint64_t* state;
  __device__ uint64_t s() const { return state ? state[0] : seed; }
  __device__ uint64_t o() const { return state ? state[1] : offset; }
};

struct UniformGen {
  PhiloxStart at;
  double a, scale;
  __device__ double operator()(int64_t i) const {
    return a + scale * static_cast<double>(philox::uniform_at(at.s(), at.o(), static_cast<uint64_t>(i)));
  }
};
struct NormalGen {
  PhiloxStart at;
  double mean, std;
  __device__ double operator()(int64_t i) const {
    return mean + std * static_cast<double>(philox::normal_at(at.s(), at.o(), static_cast<uint64_t>(i)));
  }
};
struct RandintGen {
  PhiloxStart at;
  uint64_t range;
  int64_t low;
  __device__ int64_t operator()(int64_t i) const {
    return static_cast<int64_t>(low + static_cast<int64_t>(philox::bits64_at(at.s(), at.o(), i) % range));
  }
};
struct RangeGen {
  double start, step, end;
  int64_t count;
  bool linspace;
  __device__ double operator()(int64_t i) const { return math::range_value(i, start, step, end, count, linspace); }
};

}  // namespace

template <class T>
cudaError_t uniform(int64_t n, cudaStream_t s, T* out, uint64_t seed, uint64_t offset, double low, double high,
                    const uint64_t* state) {
  return generate(n, s, out, UniformGen{{seed, offset, state}, low, high - low});
}
template <class T>
cudaError_t normal(int64_t n, cudaStream_t s, T* out, uint64_t seed, uint64_t offset, double mean, double std,
                   const uint64_t* state) {
  return generate(n, s, out, NormalGen{{seed, offset, state}, mean, std});
}
template <class T>
cudaError_t randint(int64_t n, cudaStream_t s, T* out, uint64_t seed, uint64_t offset, int64_t low, int64_t high,
                    const uint64_t* state) {
  return generate(n, s, out, RandintGen{{seed, offset, state}, static_cast<uint64_t>(high - low), low});
}
template <class T>
cudaError_t arange(int64_t n, cudaStream_t s, T* out, double start, double step, bool last_exact, double end) {
  return generate(n, s, out, RangeGen{start, step, end, n, last_exact});
}

// Explicit instances for the dtypes the registry names.
template cudaError_t uniform<Half>(int64_t, cudaStream_t, Half*, uint64_t, uint64_t, double, double, const uint64_t*);
template cudaError_t normal<Half>(int64_t, cudaStream_t, Half*, uint64_t, uint64_t, double, double, const uint64_t*);
template cudaError_t uniform<BFloat16>(int64_t, cudaStream_t, BFloat16*, uint64_t, uint64_t, double, double,
                                       const uint64_t*);
template cudaError_t normal<BFloat16>(int64_t, cudaStream_t, BFloat16*, uint64_t, uint64_t, double, double,
                                      const uint64_t*);
template cudaError_t uniform<float>(int64_t, cudaStream_t, float*, uint64_t, uint64_t, double, double, const uint64_t*);
template cudaError_t normal<float>(int64_t, cudaStream_t, float*, uint64_t, uint64_t, double, double, const uint64_t*);
template cudaError_t uniform<double>(int64_t, cudaStream_t, double*, uint64_t, uint64_t, double, double,
                                     const uint64_t*);
template cudaError_t normal<double>(int64_t, cudaStream_t, double*, uint64_t, uint64_t, double, double,
                                    const uint64_t*);
template cudaError_t randint<Half>(int64_t, cudaStream_t, Half*, uint64_t, uint64_t, int64_t, int64_t, const uint64_t*);
template cudaError_t arange<Half>(int64_t, cudaStream_t, Half*, double, double, bool, double);
template cudaError_t randint<BFloat16>(int64_t, cudaStream_t, BFloat16*, uint64_t, uint64_t, int64_t, int64_t,
                                       const uint64_t*);
template cudaError_t arange<BFloat16>(int64_t, cudaStream_t, BFloat16*, double, double, bool, double);
template cudaError_t randint<float>(int64_t, cudaStream_t, float*, uint64_t, uint64_t, int64_t, int64_t,
                                    const uint64_t*);
template cudaError_t arange<float>(int64_t, cudaStream_t, float*, double, double, bool, double);
template cudaError_t randint<double>(int64_t, cudaStream_t, double*, uint64_t, uint64_t, int64_t, int64_t,
                                     const uint64_t*);
template cudaError_t arange<double>(int64_t, cudaStream_t, double*, double, double, bool, double);
template cudaError_t randint<int64_t>(int64_t, cudaStream_t, int64_t*, uint64_t, uint64_t, int64_t, int64_t,
                                      const uint64_t*);
template cudaError_t arange<int64_t>(int64_t, cudaStream_t, int64_t*, double, double, bool, double);
template cudaError_t randint<int32_t>(int64_t, cudaStream_t, int32_t*, uint64_t, uint64_t, int64_t, int64_t,
                                      const uint64_t*);
template cudaError_t arange<int32_t>(int64_t, cudaStream_t, int32_t*, double, double, bool, double);
template cudaError_t randint<int8_t>(int64_t, cudaStream_t, int8_t*, uint64_t, uint64_t, int64_t, int64_t,
                                     const uint64_t*);
template cudaError_t arange<int8_t>(int64_t, cudaStream_t, int8_t*, double, double, bool, double);
template cudaError_t randint<uint8_t>(int64_t, cudaStream_t, uint8_t*, uint64_t, uint64_t, int64_t, int64_t,
                                      const uint64_t*);
template cudaError_t arange<uint8_t>(int64_t, cudaStream_t, uint8_t*, double, double, bool, double);

}  // namespace strata::cuda_kernels
