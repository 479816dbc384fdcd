// Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_. Parameters whose
// grad is undefined are skipped.
#pragma once

#include <limits>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::optim {

/// The norm of all the grads of `params` taken together, as if concatenated:
/// (sum_i ||g_i||_p^p)^(1/p), or max_i max|g_i| for norm_type = inf. norm_type must be > 0.
/// 0 when no parameter has a grad.
STRATA_API double total_grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);

/// Scales every grad by min(1, max_norm / (total + 1e-6)), total = total_grad_norm(params,
/// norm_type), and returns total. max_norm must be >= 0; inf leaves the grads as they are. A
/// non-finite total raises Error when error_if_nonfinite; otherwise the grads are scaled as
/// PyTorch scales them: by 0 for an infinite total (so inf entries become NaN) and by NaN for
/// a NaN total. Every grad is checked (floating, not an expanded view) before any is scaled.
STRATA_API double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                                  bool error_if_nonfinite = false);

/// Clamps every grad element to [-clip_value, clip_value] (NaN stays NaN); clip_value >= 0 (inf:
/// no clipping). Every grad is checked as for clip_grad_norm_ before any is changed.
STRATA_API void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace strata::optim
