// Checksums for checkpoint integrity: xxHash64 (libxxhash) of byte ranges, written as 16 hex
// digits. Fast enough (~10 GB/s) to verify every tensor on every load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::io::detail {

/// xxHash64 of `size` bytes at `data`, seed 0.
uint64_t xxhash64(const void* data, size_t size);

/// Streaming xxHash64, for a hash over several pieces (the checkpoint's metadata).
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  uint64_t digest() const;

 private:
  void* state_;  // XXH64_state_t, kept out of this header
};

/// `value` as 16 lowercase hex digits.
std::string to_hex64(uint64_t value);
/// The value of exactly 16 hex digits; nullopt for anything else.
std::optional<uint64_t> parse_hex64(std::string_view text);

}  // namespace strata::io::detail
