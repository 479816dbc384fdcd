// NVTX ranges for the profiler's emit_nvtx option: src/profiler/nvtx.cpp in CUDA builds (the
// header-only nvtx3 of the CUDA toolkit), src/profiler/no_nvtx.cpp otherwise.
#pragma once

namespace strata::profiler::detail {

/// False in a build without CUDA, where push and pop do nothing.
bool nvtx_available();
void nvtx_push(const char* name);
void nvtx_pop();

}  // namespace strata::profiler::detail
