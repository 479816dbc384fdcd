// Vocabulary parallelism (Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy):
// the embedding table split by rows across the ranks of a group, and the cross entropy of logits
// split along the vocabulary, computed without gathering them. With the embedding's weight as a
// tied output projection, neither the table nor the (tokens, vocab) logits exist whole anywhere:
//
//   VocabParallelEmbedding wte(vocab, dim, group);
//   Tensor h = block(wte(ids));                                               // (B, T, dim) on every rank
//   Tensor logits = linear(copy_to_tensor_parallel_region(h, group), wte.weight);  // (B, T, this rank's rows)
//   Tensor loss = vocab_parallel_cross_entropy(logits, targets, group);
//
// Rank r holds rows [vocab_range(vocab, r, size).start, .end): contiguous ranges in rank order,
// the first vocab % size ranks one row more (torch.tensor_split's split; no padding rows).
// Every rank must call these in the same order with the same ids and targets (they run
// collectives); the ranks' arguments are compared first, so a disagreement raises on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <strata/core/generator.hpp>
#include <strata/dist/process_group.hpp>
#include <strata/nn/module.hpp>

namespace strata::dist {

/// Rows [start, end) of a vocabulary of `vocab` entries that `rank` of `size` ranks holds.
struct VocabRange {
  int64_t start = 0, end = 0;
  int64_t size() const { return end - start; }
};
/// Raises unless 0 <= rank < size and vocab >= size (every rank holds at least one row).
STRATA_API VocabRange vocab_range(int64_t vocab, int rank, int size);

struct VocabParallelEmbeddingOptions {
  std::optional<int64_t> padding_idx;  // in the whole vocabulary; negative counts from the end
  /// Draws the whole table as nn::Embedding would; every rank must draw the same (same seed).
  Generator* generator = nullptr;
};

/// An embedding table of num_embeddings rows split by rows: each rank looks up the ids in its
/// range (others give zeros) and the results are summed over the ranks (one allreduce forward,
/// none backward), so every rank gets the whole lookup and its own rows' gradient.
class STRATA_API VocabParallelEmbedding : public nn::Module {
 public:
  VocabParallelEmbedding(int64_t num_embeddings, int64_t embedding_dim, std::shared_ptr<ProcessGroup> group = nullptr,
                         VocabParallelEmbeddingOptions options = {});
  /// indices (*) int64 or int32, the same on every rank -> (*, embedding_dim). Collective.
  Tensor forward(const Tensor& indices) override;
  std::string name() const override { return "VocabParallelEmbedding"; }

  /// The whole (num_embeddings, embedding_dim) table, gathered from every rank in rank order
  /// (a checkpoint's form; detached). Collective.
  Tensor full_weight() const;
  /// Copies this rank's rows of a whole (num_embeddings, embedding_dim) table into `weight`
  /// (a checkpoint saved whole, or an nn::Embedding's weight). Local.
  void load_full_weight(const Tensor& full);
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }

  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;  // normalized to [0, num_embeddings)
  VocabRange range;                    // this rank's rows
  Tensor weight;                       // (range.size(), embedding_dim)

 private:
  std::shared_ptr<ProcessGroup> group_;
};

struct VocabParallelCrossEntropyOptions {
  int64_t ignore_index = -100;  // targets equal to this add nothing (any value)
  std::string reduction = "mean";
  double label_smoothing = 0;  // in [0, 1]
};

/// Cross entropy of logits (*, V_r) whose last dim is this rank's part of the vocabulary (its
/// range in rank order, as vocab_range splits it or any other widths of at least 1) against
/// class indices (*) in [0, V), V the sum of the widths, the same on every rank. Equal to
/// nn::functional::cross_entropy of the gathered logits (N, V) on the targets (N), with its
/// reduction, ignore_index and label_smoothing; "none" gives the target's shape. Two allreduces
/// (max, then the sums) and one small allgather (the ranks' widths and arguments); the backward
/// (softmax minus the smoothed one-hot, on this rank's shard) runs no collective. Not twice
/// differentiable. The result is the same on every rank.
STRATA_API Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target,
                                               std::shared_ptr<ProcessGroup> group = nullptr,
                                               const VocabParallelCrossEntropyOptions& options = {});

}  // namespace strata::dist
