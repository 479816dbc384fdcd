// What the data-parallel wrappers share: rank 0's state sent to every rank, the check that every
// rank wraps the same model, and the agreement on a local error, so that a rank that raises never
// leaves the others waiting in a collective.
#pragma once

#include <exception>
#include <vector>

#include <strata/dist/process_group.hpp>

namespace strata::dist::detail {

/// Broadcasts every defined tensor from rank 0, all in flight at once.
void broadcast_from_rank0(ProcessGroup& group, const std::vector<Tensor>& tensors);
/// Compares the count and shapes of `tensors` across ranks; raises on every rank together, naming
/// `who`, when they differ.
void check_same_model(ProcessGroup& group, const std::vector<Tensor>& tensors, const char* who);
/// The same over several groups that together span the ranks (a hybrid wrapper's shard and
/// replicate groups): the counts are combined over each group in turn, then compared.
void check_same_model(const std::vector<ProcessGroup*>& groups, const std::vector<Tensor>& tensors, const char* who);
/// Raises, on every rank, when some rank's `error` is set: that error on its own rank, one naming
/// `who`, `what` and the first failing rank elsewhere. Collective; its small tensor lives on `device`.
void agree_on_error(ProcessGroup& group, std::exception_ptr error, Device device, const char* who, const char* what);

}  // namespace strata::dist::detail
