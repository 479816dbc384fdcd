// What the vocabulary-parallel embedding and cross entropy share: statistics of replicated index
// tensors and the comparison of every rank's arguments before the collectives that need them to
// agree (a rank that raised alone, or shapes that differ, would leave the others waiting).
#pragma once

#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <strata/dist/process_group.hpp>

namespace strata::dist::detail {

/// min(0, smallest entry other than `skip`), max(0, largest such entry) (what a range check
/// needs, as nn's), and the sum of all entries (a checksum, wrapping).
struct IndexStats {
  int64_t lo = 0, hi = 0, sum = 0;
};
IndexStats index_stats(const Tensor& indices, std::optional<int64_t> skip = std::nullopt);

/// One value a rank contributes to the agreement; `same` when it must equal rank 0's.
struct RankField {
  std::string what;
  int64_t value;
  bool same = true;
};

/// The shape of `t` as three fields that must agree: dims, elements and sum of (d + 1) * size(d).
std::vector<RankField> shape_fields(const Tensor& t, const char* name);

/// Gathers every rank's fields (and whether its own checks raised, `error`) and raises on every
/// rank alike: the local error on its rank, one naming the failing rank elsewhere, or one naming
/// the first field that differs from rank 0's. Returns fields[k] of every rank, in rank order.
/// Collective; its small tensor lives on `device`.
std::vector<std::vector<int64_t>> agree_across_ranks(ProcessGroup& group, const char* op, std::exception_ptr error,
                                                     const std::vector<RankField>& fields, Device device);

}  // namespace strata::dist::detail
