// Token shards: flat files of token ids for language-model training (format in docs/data.md:
// a 64-byte header, then the tokens little-endian as u8, u16 or u32). TokenShardWriter
// writes one atomically; TokenShard maps one read-only and validates its header;
// TokenWindowDataset serves (input, target) windows from one or more shards, copying only
// the window out of the mapping.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/core/generator.hpp>
#include <strata/core/tensor.hpp>
#include <strata/data/dataset.hpp>

namespace strata::io {
class AtomicFile;
}

namespace strata::data {

/// The stored width of one token; the value is the code written in the header.
enum class TokenDType : uint32_t { kU8 = 1, kU16 = 2, kU32 = 3 };

/// Bytes per token of `dtype`.
STRATA_API size_t token_bytes(TokenDType dtype);
/// The largest token id `dtype` holds.
STRATA_API uint64_t token_max(TokenDType dtype);

/// Constants of the file format (docs/data.md).
inline constexpr char kTokenShardMagic[8] = {'S', 'T', 'R', 'T', 'O', 'K', 'E', 'N'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr uint64_t kTokenShardHeaderSize = 64;

/// Writes a shard: tokens stream into a temporary file beside `path`; close() writes the
/// header, syncs and renames it over `path`. Destroying an unclosed writer (for example
/// after an exception) removes the temporary and leaves `path` untouched.
class STRATA_API TokenShardWriter {
 public:
  TokenShardWriter(std::string path, TokenDType dtype);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  /// Appends tokens; raises strata::Error (writing nothing of this call) when one does
  /// not fit the dtype.
  void append(std::span<const uint32_t> tokens);
  void append(uint32_t token) { append(std::span<const uint32_t>(&token, 1)); }
  /// Writes the header and syncs the temporary without replacing `path` yet: what can fail
  /// for lack of space or an I/O error fails here. Later appends raise an Error.
  void finish();
  /// Finishes the file (finish(), if not called) and renames it over `path`.
  void close();
  int64_t count() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  void write(const void* bytes, size_t size, const char* what);
  [[noreturn]] void fail(const char* step);  // removes the temporary and raises, naming `step`
  std::string path_;
  TokenDType dtype_;
  std::unique_ptr<io::AtomicFile> file_;  // null once closed, or after a failed write
  int64_t count_ = 0;
  bool finished_ = false;
};

/// A shard mapped read-only. Opening validates the header and the file size and raises
/// strata::Error naming the file and what is wrong. Safe to read from several threads.
class STRATA_API TokenShard {
 public:
  explicit TokenShard(std::string path);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  int64_t size() const { return count_; }
  TokenDType dtype() const { return dtype_; }
  const std::string& path() const { return path_; }
  /// Token `i` (checked).
  uint32_t at(int64_t i) const;
  /// Copies tokens [start, start + count) into `out`, widened to int64 (checked).
  void read(int64_t start, int64_t count, int64_t* out) const;

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* tokens_ = nullptr;
  int64_t count_ = 0;
  TokenDType dtype_ = TokenDType::kU8;
};

/// Language-model windows over token shards. Window j of a shard starts at token
/// j * stride; get(i) returns input = tokens[s, s + context) and target = tokens[s + 1,
/// s + context + 1), int64 tensors of shape (context). Windows never cross shard ends.
class STRATA_API TokenWindowDataset : public Dataset<Example> {
 public:
  /// `stride` defaults to `context` (non-overlapping inputs); 1 gives every position.
  TokenWindowDataset(const std::vector<std::string>& paths, int64_t context, int64_t stride = 0);
  TokenWindowDataset(std::vector<std::shared_ptr<const TokenShard>> shards, int64_t context, int64_t stride = 0);

  int64_t size() const override { return ends_.empty() ? 0 : ends_.back(); }
  Example get(int64_t index) const override;
  /// The window starting at token `start` of shard `shard`.
  Example window(int64_t shard, int64_t start) const;
  /// A window at a uniformly drawn start position over all shards (any offset, not only
  /// multiples of the stride), from `gen`.
  Example random_window(Generator& gen) const;

  int64_t context() const { return context_; }
  int64_t stride() const { return stride_; }
  const std::vector<std::shared_ptr<const TokenShard>>& shards() const { return shards_; }

 private:
  std::vector<std::shared_ptr<const TokenShard>> shards_;
  int64_t context_, stride_;
  std::vector<int64_t> ends_;    // cumulative window counts
  std::vector<int64_t> starts_;  // cumulative counts of valid start positions (random_window)
};

}  // namespace strata::data
