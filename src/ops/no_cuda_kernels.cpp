// A build without CUDA registers no CUDA kernels; naming a CUDA device already raises an
// Error saying which build option enables it (src/core/no_cuda.cpp).
#include "core/registry_internal.h"
#include "nn/attention_internal.h"

namespace strata::detail {

void register_cuda_kernels(KernelTable&) {}

}  // namespace strata::detail

namespace strata::nn::detail {

bool cuda_attention_fits(int, int64_t) { return false; }

}  // namespace strata::nn::detail
