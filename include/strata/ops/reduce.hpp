// Reductions (sum, mean, prod, amax, amin, max/min with indices, argmax, argmin, var, std,
// logsumexp, norm), softmax and log_softmax, and the scans cumsum and cumprod.
//
// A `dims` list may hold negative dims and no dim twice; an empty list reduces every dim,
// giving a 0-d tensor unless keepdim. Dtypes follow PyTorch: sum and prod of integers or bool
// give int64; mean, var, std, norm, softmax and log_softmax need a floating input (pass
// `dtype` to convert first); logsumexp of integers computes in float32. Float32 accumulates
// in double and float16/bfloat16 in float; results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <strata/core/tensor.hpp>

namespace strata {

/// Parameters of the reduction kernels.
struct ReduceParams {
  std::vector<int64_t> dims;  // reduced dims of the input: sorted, distinct, non-negative
  bool keepdim = false;
  double correction = 1;      // var, std: divide by max(0, n - correction)
  bool take_sqrt = false;     // std rather than var
  double p = 2;               // norm
};

/// Parameters of softmax, log_softmax, cumsum and cumprod: the (non-negative) dim.
struct DimParams {
  int64_t dim = 0;
};

/// Parameters of softmax and log_softmax and their gradient ops (softmax_backward,
/// log_softmax_backward). causal_rows = L > 0 (softmax only, along the last dim): the input
/// is a stack of (L, n) matrices and row i of each keeps its columns j <= i, the others giving
/// 0, as if masked to -inf first (attention's causal mask, fused).
struct SoftmaxParams : DimParams {
  int64_t causal_rows = 0;
};

/// Values and int64 indices of max / min along a dim, like torch.max(x, dim).
struct MinMaxResult {
  Tensor values;
  Tensor indices;
};

/// Sum of all elements (0-d) or over `dims`. Integer and bool inputs give int64; `dtype`
/// converts the input first and is the result's dtype.
STRATA_API Tensor sum(const Tensor& x, std::optional<DType> dtype = std::nullopt);
STRATA_API Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false,
                      std::optional<DType> dtype = std::nullopt);
/// Mean; raises Error for integer or bool inputs unless a floating `dtype` is given. The mean
/// of no elements is NaN.
STRATA_API Tensor mean(const Tensor& x, std::optional<DType> dtype = std::nullopt);
STRATA_API Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false,
                       std::optional<DType> dtype = std::nullopt);
/// Product; integer and bool inputs give int64. The product of no elements is 1.
STRATA_API Tensor prod(const Tensor& x, std::optional<DType> dtype = std::nullopt);
STRATA_API Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false,
                       std::optional<DType> dtype = std::nullopt);

/// Largest / smallest value over `dims`, in x's dtype; NaN wins. The gradient is shared evenly
/// among the elements equal to the result (among the NaNs where it is NaN, where PyTorch's amax
/// gives NaN everywhere and its max() shares among the NaNs). Raises Error when a reduced dim
/// has size 0.
STRATA_API Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
STRATA_API Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Largest / smallest element, as a 0-d tensor.
STRATA_API Tensor max(const Tensor& x);
STRATA_API Tensor min(const Tensor& x);
/// Largest / smallest values along `dim` and the index of each (the first one on ties; a
/// NaN's index when there is one).
STRATA_API MinMaxResult max(const Tensor& x, int64_t dim, bool keepdim = false);
STRATA_API MinMaxResult min(const Tensor& x, int64_t dim, bool keepdim = false);
/// int64 index of the largest / smallest element along `dim`, or into the flattened tensor
/// when `dim` is absent (held in x.dim() dims of size 1 with keepdim).
STRATA_API Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
STRATA_API Tensor argmin(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);

/// Variance sum((x - mean)^2) / max(0, n - correction): correction 1 is the unbiased
/// estimate, 0 the population variance. n <= correction gives inf or NaN, as in PyTorch.
STRATA_API Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1,
                      bool keepdim = false);
/// Standard deviation: sqrt(var(...)).
STRATA_API Tensor std(const Tensor& x, const std::vector<int64_t>& dims = {}, double correction = 1,
                      bool keepdim = false);
/// log(sum(exp(x))) over `dims`, computed as m + log(sum(exp(x - m))) with m the maximum, so
/// large inputs stay finite and rows of -inf give -inf.
STRATA_API Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Vector p-norm over `dims`: (sum |x|^p)^(1/p); p = inf is max |x|, -inf min |x|, 0 counts
/// nonzeros.
STRATA_API Tensor norm(const Tensor& x, double p = 2, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Named norm: "fro" (the 2-norm of the elements).
STRATA_API Tensor norm(const Tensor& x, std::string_view p, const std::vector<int64_t>& dims = {},
                       bool keepdim = false);

/// exp(x - max) / sum(exp(x - max)) along `dim`; `dtype` converts the input first.
STRATA_API Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
/// x - logsumexp(x) along `dim`.
STRATA_API Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
/// Running sum / product along `dim`. Integer and bool inputs give int64; `dtype` converts
/// the input first.
STRATA_API Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);
STRATA_API Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);

/// Whether any / every element is nonzero (true): a bool tensor, 0-d or reduced over `dim`.
STRATA_API Tensor any(const Tensor& x);
STRATA_API Tensor any(const Tensor& x, int64_t dim, bool keepdim = false);
STRATA_API Tensor all(const Tensor& x);
STRATA_API Tensor all(const Tensor& x, int64_t dim, bool keepdim = false);

}  // namespace strata
