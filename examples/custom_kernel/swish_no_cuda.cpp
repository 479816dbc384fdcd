// Stands in for swish_cuda.cu in a build without a CUDA compiler: reports that no CUDA
// kernel exists, so swish.cpp registers the CPU kernel alone.
#include "swish_kernels.h"

namespace swish {

bool cuda_compiled() { return false; }
const char* forward_cuda(const float*, float*, int64_t, float, int, void*) {
  return "this program was built without a CUDA compiler";
}
const char* forward_cuda(const double*, double*, int64_t, double, int, void*) {
  return "this program was built without a CUDA compiler";
}

}  // namespace swish
