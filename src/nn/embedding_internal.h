// The bag arithmetic of embedding_bag (src/nn/embedding_bag.cpp), shared with the quantized
// EmbeddingBag (src/quant/qembedding.cpp) so that both check their inputs alike.
#pragma once

#include <cstdint>
#include <vector>

#include <strata/nn/functional.hpp>

namespace strata::nn::detail {

/// An integer tensor's values, on the host, as int64.
std::vector<int64_t> host_ints(const Tensor& t);
/// The start of each bag (2-d indices: one bag per row; 1-d: a.offsets, without the last one when
/// a.include_last_offset) and *count, the number of indices; checked as torch checks them.
std::vector<int64_t> bag_starts(const Tensor& indices, const functional::EmbeddingBagArgs& a, int64_t* count);

}  // namespace strata::nn::detail
