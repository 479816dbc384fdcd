// VocabParallelEmbedding, the split of a vocabulary over ranks, and the agreement of the ranks'
// arguments that the vocabulary-parallel cross entropy shares (vocab_parallel.h).
#include <strata/dist/vocab_parallel.hpp>

#include <algorithm>
#include <cstdint>

#include <strata/autograd/grad_mode.hpp>
#include <strata/dist/tensor_parallel.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/compare.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>

#include "dist/vocab_parallel.h"

namespace strata::dist {

namespace detail {

IndexStats index_stats(const Tensor& indices, std::optional<int64_t> skip) {
  IndexStats s;
  if (indices.numel() == 0) return s;
  NoGradGuard no_grad;
  const Tensor t = indices.to(kInt64);
  if (t.device().is_cpu()) {  // one pass, no temporaries
    const Tensor c = t.contiguous();
    const int64_t* p = c.data_ptr<int64_t>();
    uint64_t total = 0;  // wraps rather than overflows: a checksum
    for (int64_t i = 0; i < c.numel(); ++i) {
      total += static_cast<uint64_t>(p[i]);
      if (skip && p[i] == *skip) continue;
      s.lo = std::min(s.lo, p[i]);
      s.hi = std::max(s.hi, p[i]);
    }
    s.sum = static_cast<int64_t>(total);
    return s;
  }
  const Tensor kept = skip ? where(t == *skip, 0, t) : t;  // as nn's range check: skipped entries count as 0
  const Tensor all = stack({amin(kept), amax(kept), sum(t)}).cpu();
  const int64_t* p = all.data_ptr<int64_t>();
  return IndexStats{std::min<int64_t>(p[0], 0), std::max<int64_t>(p[1], 0), p[2]};
}

std::vector<RankField> shape_fields(const Tensor& t, const char* name) {
  int64_t weighted = 0;
  if (t.defined())  // else only after a local error, which wins
    for (int64_t d = 0; d < t.dim(); ++d) weighted += (d + 1) * t.size(d);
  return {{fmt::format("shape of the {} (dims)", name), t.defined() ? t.dim() : 0},
          {fmt::format("shape of the {} (elements)", name), t.defined() ? t.numel() : 0},
          {fmt::format("shape of the {} (sum of (d + 1) * size(d))", name), weighted}};
}

std::vector<std::vector<int64_t>> agree_across_ranks(ProcessGroup& group, const char* op, std::exception_ptr error,
                                                     const std::vector<RankField>& fields, Device device) {
  const int n = group.size();
  const int64_t k = static_cast<int64_t>(fields.size());
  std::vector<int64_t> mine(fields.size() + 1, 0);  // [failed, fields...]; the fields unknown after an error
  mine[0] = error ? 1 : 0;
  if (!error)
    for (size_t i = 0; i < fields.size(); ++i) mine[i + 1] = fields[i].value;
  std::vector<Tensor> all;
  for (int r = 0; r < n; ++r) all.push_back(empty({k + 1}, TensorOptions(kInt64, device)));
  group.allgather(all, from_vector(mine).to(device))->wait();
  if (error) std::rethrow_exception(error);
  std::vector<std::vector<int64_t>> out;
  for (const Tensor& t : all) {
    const Tensor c = t.cpu();
    out.emplace_back(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + k + 1);
  }
  for (int r = 0; r < n; ++r)
    STRATA_CHECK(out[r][0] == 0, "[{}] rank {} raised on its arguments (its error names them)", op, r);
  for (int r = 1; r < n; ++r)
    for (size_t i = 0; i < fields.size(); ++i)
      STRATA_CHECK(!fields[i].same || out[r][i + 1] == out[0][i + 1],
                   "[{}] the ranks disagree on the {}: rank {} has {}, rank 0 {}; every rank must pass the same", op,
                   fields[i].what, r, out[r][i + 1], out[0][i + 1]);
  for (auto& row : out) row.erase(row.begin());
  return out;
}

}  // namespace detail

using Group = std::shared_ptr<ProcessGroup>;

VocabRange vocab_range(int64_t vocab, int rank, int size) {
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, "[vocab_range] rank {} is not in [0, {})", rank, size);
  STRATA_CHECK(vocab >= size, "[vocab_range] a vocabulary of {} entries cannot give each of {} ranks a row", vocab,
               size);
  const int64_t base = vocab / size, extra = vocab % size;
  const int64_t start = rank * base + std::min<int64_t>(rank, extra);
  return {start, start + base + (rank < extra ? 1 : 0)};
}

// The whole table is drawn as nn::Embedding draws it (Megatron's master-weight initialization),
// so the shards of all ranks together are the table one process would have built.
VocabParallelEmbedding::VocabParallelEmbedding(int64_t num, int64_t dim, Group group,
                                               VocabParallelEmbeddingOptions options)
    : num_embeddings(num), embedding_dim(dim), group_(group ? std::move(group) : default_group()) {
  STRATA_CHECK(dim >= 0, "[VocabParallelEmbedding] embedding_dim ({}) must be non-negative", dim);
  range = vocab_range(num, group_->rank(), group_->size());
  nn::Embedding whole(num, dim, {.padding_idx = options.padding_idx, .generator = options.generator});
  padding_idx = whole.padding_idx;
  weight = register_parameter("weight", whole.weight.detach().narrow(0, range.start, range.size()).clone());
}

Tensor VocabParallelEmbedding::forward(const Tensor& indices) {
  const char* op = "VocabParallelEmbedding";
  // the ids are checked whole on each rank, then compared across ranks: all raise, or none does
  std::exception_ptr error;
  detail::IndexStats stats;
  try {
    STRATA_CHECK(indices.defined(), "[{}] the indices are undefined", op);
    STRATA_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32,
                 "[{}] indices must be int64 or int32, got {}", op, indices.dtype());
    STRATA_CHECK(indices.device() == weight.device(), "[{}] indices are on {} but the weight is on {}", op,
                 indices.device(), weight.device());
    stats = detail::index_stats(indices);
    STRATA_CHECK(stats.lo >= 0 && stats.hi < num_embeddings,
                 "[{}] index {} is out of range for {} embeddings (indices of shape {})", op,
                 stats.lo < 0 ? stats.lo : stats.hi, num_embeddings, indices.shape());
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<detail::RankField> fields = detail::shape_fields(indices, "indices");
  fields.insert(fields.end(), {{"sum of the indices", stats.sum},
                               {"num_embeddings", num_embeddings},
                               {"embedding_dim", embedding_dim},
                               {"weight dtype", static_cast<int64_t>(weight.dtype())}});
  detail::agree_across_ranks(*group_, op, error, fields, weight.device());

  const Tensor mine = logical_and(indices >= range.start, indices < range.end);
  const Tensor local = where(mine, indices - range.start, 0);  // others look up row 0, then zeroed
  std::optional<int64_t> pad;
  if (padding_idx && *padding_idx >= range.start && *padding_idx < range.end) pad = *padding_idx - range.start;
  const Tensor rows = nn::functional::embedding(local, weight, pad);  // (*, dim)
  return reduce_from_tensor_parallel_region(where(mine.unsqueeze(-1), rows, 0.0), group_);
}

Tensor VocabParallelEmbedding::full_weight() const {
  // the shards differ by a row at most: each is padded to the largest, gathered, then trimmed
  const int n = group_->size();
  const int64_t rows = vocab_range(num_embeddings, 0, n).size();
  Tensor padded = zeros({rows, embedding_dim}, weight.options());
  padded.narrow(0, 0, range.size()).copy_(weight.detach());
  std::vector<Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(empty({rows, embedding_dim}, weight.options()));
  group_->allgather(parts, padded)->wait();
  for (int r = 0; r < n; ++r) parts[r] = parts[r].narrow(0, 0, vocab_range(num_embeddings, r, n).size());
  return cat(parts, 0);
}

void VocabParallelEmbedding::load_full_weight(const Tensor& full) {
  STRATA_CHECK(full.defined() && full.shape() == (Shape{num_embeddings, embedding_dim}),
               "[VocabParallelEmbedding] load_full_weight needs the whole table of shape ({}, {}), got {}",
               num_embeddings, embedding_dim, full.defined() ? fmt::format("{}", full.shape()) : "undefined");
  NoGradGuard no_grad;
  weight.copy_(full.detach().narrow(0, range.start, range.size()));
}

}  // namespace strata::dist
