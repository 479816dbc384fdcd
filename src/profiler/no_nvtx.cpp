// A build without CUDA has no NVTX; Profiler::start refuses emit_nvtx there.
#include "profiler/nvtx.h"

namespace strata::profiler::detail {

bool nvtx_available() { return false; }
void nvtx_push(const char*) {}
void nvtx_pop() {}

}  // namespace strata::profiler::detail
