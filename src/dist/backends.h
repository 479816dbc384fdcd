// What process_group.cpp needs from the backends, each of which is either compiled in
// (mpi_backend.cpp, nccl_backend.cpp) or replaced by a stub that raises naming its build
// option (no_mpi.cpp, no_nccl.cpp).
#pragma once

#include <memory>

#include <strata/dist/process_group.hpp>

namespace strata::dist::detail {

bool mpi_available();
bool nccl_available();
/// The default NCCL group: CUDA device local_rank % device_count.
std::shared_ptr<ProcessGroup> nccl_default_group();

}  // namespace strata::dist::detail
