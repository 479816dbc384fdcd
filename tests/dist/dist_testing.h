// What the distributed tests share: the default MPI process group, created on first use (each
// test binary runs under mpirun, every rank running every test in the same order).
#pragma once

#include <memory>

#include "testing.h"

namespace strata::dist_testing {

inline std::shared_ptr<dist::ProcessGroup> group() {
  if (!dist::is_initialized()) dist::init_process_group("mpi");
  return dist::default_group();
}

}  // namespace strata::dist_testing
