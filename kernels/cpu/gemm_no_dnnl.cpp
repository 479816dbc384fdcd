// The oneDNN GEMM backend in a build without oneDNN (STRATA_WITH_DNNL=OFF or not found):
// it handles nothing, so every problem goes to Eigen.
#include "gemm.h"

namespace strata::cpu {

bool gemm_dnnl(const GemmProblem&) { return false; }

int64_t gemm_dnnl_cache_size() { return 0; }

}  // namespace strata::cpu
