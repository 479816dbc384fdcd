// The reduction argument of the losses ("mean" | "sum" | "none", and "batchmean" for kl_div),
// parsed once and applied to a per-element loss.
#pragma once

#include <string_view>

#include <strata/ops/binary.hpp>
#include <strata/ops/reduce.hpp>

namespace strata::nn {

enum class Reduction { None, Mean, Sum, BatchMean };

inline Reduction parse_reduction(std::string_view r, std::string_view op, bool allow_batchmean = false) {
  if (r == "mean") return Reduction::Mean;
  if (r == "sum") return Reduction::Sum;
  if (r == "none") return Reduction::None;
  if (allow_batchmean && r == "batchmean") return Reduction::BatchMean;
  detail::throw_error("[{}] reduction must be \"mean\", \"sum\"{} or \"none\", got \"{}\"", op,
                      allow_batchmean ? ", \"batchmean\"" : "", r);
}

// "mean" of no elements is NaN, as in PyTorch.
inline Tensor reduce_loss(const Tensor& loss, Reduction r) {
  switch (r) {
    case Reduction::None: return loss;
    case Reduction::Sum: return sum(loss);
    case Reduction::Mean: return mean(loss);
    case Reduction::BatchMean: return loss.dim() == 0 ? sum(loss) : sum(loss) / static_cast<double>(loss.size(0));
  }
  return loss;
}

}  // namespace strata::nn
