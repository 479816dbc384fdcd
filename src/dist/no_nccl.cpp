// The NCCL process group in a build without it: the API stays, and using it raises.
#include "dist/backends.h"

namespace strata::dist {

namespace {
[[noreturn]] void raise_no_nccl() {
  ::strata::detail::throw_error(
      "[dist] the NCCL backend is not in this build: it needs STRATA_WITH_CUDA=ON, STRATA_WITH_MPI=ON (for its "
      "bootstrap) and NCCL found beside the CUDA toolkit (libnccl.so, nccl.h)");
}
}  // namespace

std::shared_ptr<ProcessGroup> new_nccl_group(int) { raise_no_nccl(); }

namespace detail {
bool nccl_available() { return false; }
std::shared_ptr<ProcessGroup> nccl_default_group() { raise_no_nccl(); }
}  // namespace detail

}  // namespace strata::dist
