// The MPI process group in a build without MPI: the API stays, and using it raises.
#include "dist/backends.h"

namespace strata::dist {

std::shared_ptr<ProcessGroup> new_mpi_group() {
  ::strata::detail::throw_error(
      "[dist] the MPI backend is not in this build: configure with -DSTRATA_WITH_MPI=ON and an MPI library installed "
      "(Debian: libopenmpi-dev openmpi-bin)");
}

namespace detail {
bool mpi_available() { return false; }
}  // namespace detail

}  // namespace strata::dist
