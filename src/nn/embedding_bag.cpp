// embedding_bag and EmbeddingBag. The bag of every index is worked out on the host from the
// offsets (they are small: one per bag); the rows come from `embedding` (its index checks and
// gradient), and a sum or mean is one index_add of the rows into their bags, so both devices
// run it and the gradient reaches every row that was used. Max takes each non-empty bag's amax
// (one small reduction per bag; its gradient goes to the maximum, as torch's).
#include <algorithm>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/init.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/reduce.hpp>

#include "nn/embedding_internal.h"

namespace strata::nn {

namespace detail {

std::vector<int64_t> host_ints(const Tensor& t) {
  const Tensor h = t.to(kCPU).to(kInt64).contiguous();
  const int64_t* p = h.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + h.numel());
}

std::vector<int64_t> bag_starts(const Tensor& indices, const functional::EmbeddingBagArgs& a, int64_t* count) {
  if (indices.dim() == 2) {
    STRATA_CHECK(!a.offsets.defined(), "[embedding_bag] 2-d indices are their own bags: offsets must not be given");
    std::vector<int64_t> starts;
    for (int64_t b = 0; b < indices.size(0); ++b) starts.push_back(b * indices.size(1));
    *count = indices.numel();
    return starts;
  }
  STRATA_CHECK(indices.dim() == 1, "[embedding_bag] indices must be 1-d (with offsets) or 2-d, got shape {}",
               indices.shape());
  STRATA_CHECK(a.offsets.defined() && a.offsets.dim() == 1,
               "[embedding_bag] 1-d indices need 1-d offsets, one per bag");
  STRATA_CHECK(a.offsets.dtype() == kInt64 || a.offsets.dtype() == kInt32,
               "[embedding_bag] offsets must be int64 or int32, got {}", a.offsets.dtype());
  std::vector<int64_t> starts = host_ints(a.offsets);
  *count = indices.numel();
  if (a.include_last_offset) {
    STRATA_CHECK(!starts.empty() && starts.back() == *count,
                 "[embedding_bag] with include_last_offset the last offset must be the number of indices ({})", *count);
    starts.pop_back();
  }
  STRATA_CHECK(starts.empty() || starts[0] == 0, "[embedding_bag] the first offset must be 0, got {}",
               starts.empty() ? 0 : starts[0]);
  for (size_t b = 0; b < starts.size(); ++b)
    STRATA_CHECK(starts[b] <= *count && (b == 0 || starts[b] >= starts[b - 1]),
                 "[embedding_bag] offsets must be ascending and at most the number of indices ({}); offset {} is {}",
                 *count, b, starts[b]);
  return starts;
}

}  // namespace detail

namespace functional {

using detail::bag_starts;
using detail::host_ints;

Tensor embedding_bag(const Tensor& indices, const Tensor& weight, const EmbeddingBagArgs& a) {
  STRATA_CHECK(indices.defined() && weight.defined(), "[embedding_bag] indices or weight is undefined");
  STRATA_CHECK(weight.dim() == 2, "[embedding_bag] weight must be 2-d (num_embeddings, embedding_dim), got shape {}",
               weight.shape());
  int64_t count = 0;
  const std::vector<int64_t> starts = bag_starts(indices, a, &count);
  const Tensor& psw = a.per_sample_weights;
  STRATA_CHECK(!psw.defined() || a.mode == EmbeddingBagMode::Sum,
               "[embedding_bag] per_sample_weights are only supported with mode Sum");
  STRATA_CHECK(!psw.defined() || psw.shape() == indices.shape(),
               "[embedding_bag] per_sample_weights of shape {} must have the indices' shape {}", psw.shape(),
               indices.shape());
  const int64_t bags = static_cast<int64_t>(starts.size()), dim = weight.size(1);
  const Tensor flat = indices.reshape({-1});
  const std::vector<int64_t> ids = host_ints(flat);
  // each index's bag, and which indices count (padding_idx is left out of its bag)
  std::vector<int64_t> bag_of(static_cast<size_t>(count)), kept;
  std::vector<int64_t> bag_size(static_cast<size_t>(bags), 0);
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t end = b + 1 < bags ? starts[static_cast<size_t>(b + 1)] : count;
    for (int64_t i = starts[static_cast<size_t>(b)]; i < end; ++i) {
      bag_of[static_cast<size_t>(i)] = b;
      if (a.padding_idx && ids[static_cast<size_t>(i)] == *a.padding_idx) continue;
      kept.push_back(i);
      ++bag_size[static_cast<size_t>(b)];
    }
  }
  const Tensor kept_t = from_vector(kept).to(weight.device());
  Tensor rows = embedding(index_select(flat, 0, kept_t), weight);  // (kept, dim)
  if (psw.defined()) rows = rows * index_select(psw.reshape({-1}), 0, kept_t).unsqueeze(1).to(rows.dtype());
  if (a.mode == EmbeddingBagMode::Max) {
    std::vector<Tensor> maxima;
    int64_t at = 0;
    for (int64_t b = 0; b < bags; ++b) {
      const int64_t n = bag_size[static_cast<size_t>(b)];
      maxima.push_back(n == 0 ? zeros({dim}, TensorOptions(weight.dtype(), weight.device()))
                              : amax(rows.narrow(0, at, n), {0}));
      at += n;
    }
    return bags == 0 ? zeros({0, dim}, TensorOptions(weight.dtype(), weight.device())) : stack(maxima, 0);
  }
  std::vector<int64_t> kept_bag;
  for (int64_t i : kept) kept_bag.push_back(bag_of[static_cast<size_t>(i)]);
  const Tensor sums = index_add(zeros({bags, dim}, TensorOptions(rows.dtype(), weight.device())), 0,
                                from_vector(kept_bag).to(weight.device()), rows);
  if (a.mode == EmbeddingBagMode::Sum) return sums;
  std::vector<double> divisor;
  for (int64_t n : bag_size) divisor.push_back(static_cast<double>(std::max<int64_t>(n, 1)));
  return sums / from_vector(divisor).to(weight.device(), rows.dtype()).unsqueeze(1);
}

}  // namespace functional

EmbeddingBag::EmbeddingBag(int64_t num, int64_t dim, EmbeddingBagOptions o)
    : num_embeddings(num), embedding_dim(dim), options(o) {
  STRATA_CHECK(num >= 0 && dim >= 0, "[EmbeddingBag] num_embeddings ({}) and embedding_dim ({}) must be non-negative",
               num, dim);
  if (o.padding_idx) {
    const int64_t p = *o.padding_idx;
    STRATA_CHECK(p >= -num && p < num, "[EmbeddingBag] padding_idx {} is out of range for {} embeddings", p, num);
    options.padding_idx = p < 0 ? p + num : p;
  }
  weight = register_parameter("weight", empty({num, dim}));
  reset_parameters(o.generator);
}

void EmbeddingBag::reset_parameters(Generator* gen) {
  STRATA_CHECK(weight.defined(), "[EmbeddingBag] reset_parameters: the float weight was replaced by the form \"{}\"",
               form_.name());
  init::normal_(weight, 0, 1, gen);
  if (options.padding_idx) {
    NoGradGuard no_grad;
    weight.select(0, *options.padding_idx).zero_();
  }
}

Tensor EmbeddingBag::forward(const Tensor& indices, const Tensor& offsets, const Tensor& per_sample_weights) {
  if (form_.get()) return form_.get()->forward_bags(*this, indices, offsets, per_sample_weights);
  return functional::embedding_bag(
      indices, weight, {offsets, options.mode, per_sample_weights, options.include_last_offset, options.padding_idx});
}

Tensor EmbeddingBag::forward(const Tensor& indices) { return forward(indices, Tensor()); }

EmbeddingBagForm& EmbeddingBag::set_form(std::string name, std::unique_ptr<EmbeddingBagForm> form) {
  return form_.set(*this, std::move(name), std::move(form));
}

Tensor EmbeddingBag::operator()(const Tensor& indices, const Tensor& offsets, const Tensor& per_sample_weights) {
  if (!hooks_active()) return forward(indices, offsets, per_sample_weights);
  return call_hooked({indices, offsets, per_sample_weights},
                     [&](const std::vector<Tensor>& in) { return forward(in[0], in[1], in[2]); });
}

}  // namespace strata::nn
