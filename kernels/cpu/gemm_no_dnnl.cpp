// The oneDNN GEMM backend in a build without oneDNN (STRATA_WITH_DNNL=OFF or not found):
// it handles nothing, so every problem goes to Eigen.
#include "gemm.h"

namespace strata::cpu {

bool gemm_dnnl(const GemmProblem&) { return false; }

int64_t gemm_dnnl_cache_size() { return 0; }

bool gemm_u8s8s32_dnnl(const uint8_t*, const int8_t*, int32_t*, int64_t, int64_t, int64_t) { return false; }

}  // namespace strata::cpu
