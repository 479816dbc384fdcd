// Token shards (docs/data.md, written by strata-tokenize) read with plain C++, for programs
// that do not link strata, such as the LibTorch twin of the Transformer example: the whole
// shard in memory, the vocabulary it needs and the unigram baseline, as the example's
// corpus.hpp computes them. The reader refuses what strata's TokenShard refuses, raising
// std::runtime_error naming the file.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

namespace shard_detail {

inline uint64_t little_endian(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

[[noreturn]] inline void fail(const std::string& path, const std::string& why) {
  throw std::runtime_error("[token shard] " + path + ": " + why);
}

}  // namespace shard_detail

// The tokens of the shard at `path`, widened to int64.
inline std::vector<int64_t> read_token_shard(const std::string& path) {
  using shard_detail::fail;
  using shard_detail::little_endian;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file");
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "read error");
  const uint64_t size = bytes.size();
  if (size < 64) fail(path, "shorter than the 64-byte header (" + std::to_string(size) + " bytes)");
  if (std::string(bytes.begin(), bytes.begin() + 8) != "STRTOKEN") fail(path, "bad magic (not a token shard)");
  const uint64_t version = little_endian(&bytes[8], 4), code = little_endian(&bytes[12], 4);
  const uint64_t count = little_endian(&bytes[16], 8), header = little_endian(&bytes[24], 8);
  if (version != 1) fail(path, "format version " + std::to_string(version) + ", expected 1");
  if (code < 1 || code > 3) fail(path, "unknown token dtype code " + std::to_string(code));
  const int width = code == 1 ? 1 : code == 2 ? 2 : 4;
  if (header < 64 || header > size) fail(path, "header size " + std::to_string(header) + " is outside [64, file size]");
  if (count > (size - header) / width || header + count * width != size)
    fail(path, std::to_string(count) + " tokens of " + std::to_string(width) + " bytes after a " +
                   std::to_string(header) + "-byte header do not make its " + std::to_string(size) +
                   " bytes (truncated or trailing data)");
  std::vector<int64_t> tokens(count);
  const unsigned char* p = bytes.data() + header;
  for (uint64_t i = 0; i < count; ++i) tokens[i] = static_cast<int64_t>(little_endian(p + i * width, width));
  return tokens;
}

// The vocabulary the shards need: 256 bytes, or more when they hold larger ids.
inline int64_t shard_vocab_size(const std::vector<int64_t>& train, const std::vector<int64_t>& val) {
  int64_t top = 255;
  for (const auto* s : {&train, &val})
    if (!s->empty()) top = std::max(top, *std::max_element(s->begin(), s->end()));
  return top + 1;
}

// Cross-entropy on the validation tokens of the training tokens' frequencies (add-one
// smoothed): the loss of the best model that ignores context.
inline double unigram_entropy(const std::vector<int64_t>& train, const std::vector<int64_t>& val, int64_t vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 1.0);
  for (int64_t t : train) counts[static_cast<size_t>(t)] += 1;
  double total = 0;
  for (double c : counts) total += c;
  double nll = 0;
  for (int64_t t : val) nll -= std::log(counts[static_cast<size_t>(t)] / total);
  return nll / static_cast<double>(std::max<size_t>(1, val.size()));
}

}  // namespace bench
