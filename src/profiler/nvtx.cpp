// NVTX ranges through nvtx3 (header-only: nothing to link), seen by Nsight Systems.
#include "profiler/nvtx.h"

#include <nvtx3/nvToolsExt.h>

namespace strata::profiler::detail {

bool nvtx_available() { return true; }
void nvtx_push(const char* name) { nvtxRangePushA(name); }
void nvtx_pop() { nvtxRangePop(); }

}  // namespace strata::profiler::detail
