// Built when LibTorch is not found: there is no peer, and the table shows strata alone.
#include "workload.h"

namespace bench {

std::unique_ptr<Peer> make_torch_peer() { return nullptr; }

}  // namespace bench
