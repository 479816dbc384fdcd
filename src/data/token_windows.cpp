// TokenWindowDataset: (input, target) windows over mapped token shards. Only the window is
// copied out of the mapping (widened to int64); the shards are never read whole.
#include <strata/data/token_shard.hpp>

#include <algorithm>

#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>

#include "kernels/common/philox.h"

namespace strata::data {
namespace {

std::vector<std::shared_ptr<const TokenShard>> open_all(const std::vector<std::string>& paths) {
  std::vector<std::shared_ptr<const TokenShard>> shards;
  shards.reserve(paths.size());
  for (const std::string& p : paths) shards.push_back(std::make_shared<const TokenShard>(p));
  return shards;
}

}  // namespace

TokenWindowDataset::TokenWindowDataset(const std::vector<std::string>& paths, int64_t context, int64_t stride)
    : TokenWindowDataset(open_all(paths), context, stride) {}

TokenWindowDataset::TokenWindowDataset(std::vector<std::shared_ptr<const TokenShard>> shards, int64_t context,
                                       int64_t stride)
    : shards_(std::move(shards)), context_(context), stride_(stride == 0 ? context : stride) {
  STRATA_CHECK(!shards_.empty(), "[TokenWindowDataset] needs at least one shard");
  // a window holds context + 1 tokens, and each is a tensor of `context` int64 values
  STRATA_CHECK(context >= 1 && context < (int64_t{1} << 40), "[TokenWindowDataset] context must be in [1, 2^40), got {}",
               context);
  STRATA_CHECK(stride_ >= 1, "[TokenWindowDataset] stride must be at least 1, got {}", stride);
  int64_t windows = 0, starts = 0;
  for (size_t k = 0; k < shards_.size(); ++k) {
    STRATA_CHECK(shards_[k] != nullptr, "[TokenWindowDataset] shard {} is null", k);
    // A window needs context + 1 tokens: the last input token's target comes after it.
    int64_t valid = std::max<int64_t>(0, shards_[k]->size() - context_);  // start positions
    windows += valid == 0 ? 0 : (valid - 1) / stride_ + 1;
    starts += valid;
    ends_.push_back(windows);
    starts_.push_back(starts);
  }
  STRATA_CHECK(windows > 0, "[TokenWindowDataset] no shard holds the {} tokens one window needs", context_ + 1);
}

Example TokenWindowDataset::window(int64_t shard, int64_t start) const {
  STRATA_CHECK(shard >= 0 && shard < static_cast<int64_t>(shards_.size()),
               "[TokenWindowDataset] shard {} is outside [0, {})", shard, shards_.size());
  const TokenShard& s = *shards_[static_cast<size_t>(shard)];
  STRATA_CHECK(start >= 0 && start <= s.size() - context_ - 1,
               "[TokenWindowDataset] a window of {} tokens at {} does not fit in shard {} ({} tokens)", context_ + 1,
               start, shard, s.size());
  // Two reads rather than two views of one buffer, so an in-place op on the input cannot
  // change the target.
  Tensor input = empty({context_}, kInt64), target = empty({context_}, kInt64);
  s.read(start, context_, input.data_ptr<int64_t>());
  s.read(start + 1, context_, target.data_ptr<int64_t>());
  return Example{input, target};
}

Example TokenWindowDataset::get(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < size(), "[TokenWindowDataset] index {} is outside [0, {})", index, size());
  auto k = static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), index) - ends_.begin());
  int64_t local = index - (k == 0 ? 0 : ends_[k - 1]);
  return window(static_cast<int64_t>(k), local * stride_);
}

Example TokenWindowDataset::random_window(Generator& gen) const {
  const RandomDraw draw = gen.reserve_draw(1);
  auto total = static_cast<uint64_t>(starts_.back());
  uint64_t bits = philox::bits64_at(draw.seed, draw.offset, 0);
  auto pos = static_cast<int64_t>((static_cast<unsigned __int128>(bits) * total) >> 64);  // uniform in [0, total)
  auto k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin());
  return window(static_cast<int64_t>(k), pos - (k == 0 ? 0 : starts_[k - 1]));
}

}  // namespace strata::data
