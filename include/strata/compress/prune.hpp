// Mask pruning with torch.nn.utils.prune's meaning: l1_unstructured, ln_structured,
// random_unstructured, global_unstructured, custom_from_mask, remove, is_pruned, plus the
// per-channel importance scores (L1, L2, Taylor) that structured pruning ranks by.
//
//   compress::ln_structured(conv, "weight", 0.5, 2, 0);  // half the filters, by L2 norm
//   compress::l1_unstructured(fc, "weight", 100);         // the 100 smallest weights
//   ...
//   opt.step();                       // the next forward re-zeroes what the step revived
//   compress::reapply_masks(model);  // only before reading the weights (saving a checkpoint)
//   compress::remove(conv, "weight");  // permanent: the mask buffer and the hook go, the zeros stay
//
// Note [Keeping pruned weights zero]: PyTorch keeps `weight_orig` as the parameter and
// recomputes weight = weight_orig * weight_mask in a forward pre-hook. strata's layers read
// their parameter directly, so the parameter itself is kept pruned:
// - pruning multiplies it by the mask;
// - a gradient hook multiplies its gradient by the mask, so pruned entries get exactly zero
//   gradient (as weight_orig's do in PyTorch);
// - a forward pre-hook, one per pruned module for all its masks, multiplies the parameter by its
//   mask in place (no_grad) before each forward when the parameter or mask changed since (an
//   optimizer step, whose momentum or Adam moments from before pruning revive pruned entries; a
//   load_state_dict; a move), so every forward computes with the pruned weights; a weight tied
//   between modules that each prune it gets all their masks from any of their hooks;
// - between a step and the next forward the stored parameter may hold revived values:
//   reapply_masks(module) zeroes them explicitly (before saving or inspecting the weights).
// The hook runs when the module is called through a call operator (one-input or multi-input:
// MultiheadAttention's (q, k, v, ...) as the transformer layers call it); a forward called
// directly runs no hooks, so call reapply_masks after each step there.
// The mask is a buffer "<name>_mask" in the module's state dict, as in PyTorch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/generator.hpp>
#include <strata/core/tensor.hpp>
#include <strata/nn/module.hpp>

namespace strata::compress {

/// How many of the candidates to prune, as torch.nn.utils.prune's `amount`: a fraction in
/// [0, 1] (round(fraction * candidates), half to even as Python's round) or a count >= 0.
class STRATA_API Amount {
 public:
  Amount(double fraction);  // NOLINT(google-explicit-constructor): prune(m, "weight", 0.3)
  Amount(int count);        // NOLINT(google-explicit-constructor): prune(m, "weight", 10)
  Amount(int64_t count);    // NOLINT(google-explicit-constructor)
  /// The number of entries to prune out of `candidates`; raises Error naming `op` when a count
  /// exceeds the candidates.
  int64_t of(int64_t candidates, std::string_view op) const;
  bool is_fraction() const { return is_fraction_; }
  double value() const { return value_; }

 private:
  bool is_fraction_;
  double value_;
};

/// How structured pruning scores a channel (a slice along a dim): the L1 or L2 norm of its
/// weights, or Taylor's first-order estimate sum |w * dL/dw| (Molchanov et al. 2019), which
/// needs the weight's gradient.
enum class Importance { L1, L2, Taylor };

/// The Lp norm of each slice of `t` along `dim` (p > 0, or infinity): shape (t.size(dim)),
/// float64 on the CPU. Raises Error for a dim `t` lacks.
STRATA_API Tensor channel_norms(const Tensor& t, double p, int64_t dim);
/// channel_norms with p = 1 or 2, or for Taylor the L1 norm of weight * weight.grad().
STRATA_API Tensor channel_importance(const Tensor& weight, Importance kind, int64_t dim = 0);

/// Prunes the `amount` entries of the parameter with the smallest |value| (or the smallest
/// `importance_scores`, of the parameter's shape). Entries already pruned are not candidates.
STRATA_API void l1_unstructured(nn::Module& module, const std::string& name, Amount amount,
                                const Tensor& importance_scores = Tensor());
/// Prunes `amount` entries chosen uniformly at random among those not yet pruned.
STRATA_API void random_unstructured(nn::Module& module, const std::string& name, Amount amount,
                                    Generator* gen = nullptr);
/// Prunes the `amount` slices along `dim` (0: a Linear's output rows, a Conv2d's filters) with
/// the smallest Ln norm (n > 0 or infinity; of `importance_scores` when given). The parameter
/// needs at least 2 dims. Slices already fully pruned are not candidates.
STRATA_API void ln_structured(nn::Module& module, const std::string& name, Amount amount, double n, int64_t dim,
                              const Tensor& importance_scores = Tensor());
/// Applies `mask` (the parameter's shape, 1 keeps and 0 prunes) on top of any mask already there.
STRATA_API void custom_from_mask(nn::Module& module, const std::string& name, const Tensor& mask);
/// A mask of ones (prunes nothing), as torch's prune.identity: gives a fresh model the mask
/// buffers a pruned checkpoint's state dict has (and the forward pre-hook), before load_state_dict.
STRATA_API void identity(nn::Module& module, const std::string& name);

/// One parameter of global pruning.
struct PruneTarget {
  nn::Module* module;
  std::string name = "weight";
};

/// L1 pruning over the entries of all `targets` taken together: the `amount` smallest |value|
/// (or smallest `importance_scores`, one per target, each of its parameter's shape) across
/// them all, as torch's global_unstructured with L1Unstructured.
STRATA_API void global_unstructured(const std::vector<PruneTarget>& targets, Amount amount,
                                    const std::vector<Tensor>& importance_scores = {});

/// Makes pruning permanent: the parameter keeps its zeros, the "<name>_mask" buffer and the
/// gradient masking go, and the forward pre-hook with the module's last mask. Raises Error when
/// the parameter is not pruned.
STRATA_API void remove(nn::Module& module, const std::string& name);
/// Whether any parameter of `module` or below it is pruned (has a mask).
STRATA_API bool is_pruned(nn::Module& module);
/// Multiplies every pruned parameter of `module` and below it by its mask now: the forward
/// pre-hook does so before the next forward, so call it where the stored weights are read
/// before one (saving a checkpoint) or for modules whose forward runs no hooks (Note [Keeping
/// pruned weights zero]).
STRATA_API void reapply_masks(nn::Module& module);

/// Zeros in one parameter.
struct SparsityEntry {
  std::string name;  // dotted, as in the state dict ("features.0.weight")
  int64_t zeros = 0;
  int64_t numel = 0;
  double sparsity() const { return numel == 0 ? 0.0 : static_cast<double>(zeros) / static_cast<double>(numel); }
};

struct STRATA_API SparsityReport {
  std::vector<SparsityEntry> entries;
  SparsityEntry total;  // over the entries
  /// One line per entry and one for the total: name, zeros / numel, percent.
  std::string to_string() const;
};

/// Zeros of the pruned parameters of `module` and below it (of every parameter when
/// pruned_only is false), and their total.
STRATA_API SparsityReport sparsity_report(nn::Module& module, bool pruned_only = true);

}  // namespace strata::compress
