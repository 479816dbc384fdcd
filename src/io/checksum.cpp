// xxHash64 checksums through Debian's libxxhash, and their hex spelling.
#include "io/checksum.h"

#include <xxhash.h>

#include <fmt/format.h>

#include <strata/core/error.hpp>

namespace strata::io::detail {

uint64_t xxhash64(const void* data, size_t size) { return XXH64(data, size, 0); }

Hasher::Hasher() : state_(XXH64_createState()) {
  STRATA_CHECK(state_ != nullptr, "[checksum] out of memory creating an xxHash64 state");
  XXH64_reset(static_cast<XXH64_state_t*>(state_), 0);
}

Hasher::~Hasher() { XXH64_freeState(static_cast<XXH64_state_t*>(state_)); }

void Hasher::update(const void* data, size_t size) { XXH64_update(static_cast<XXH64_state_t*>(state_), data, size); }

uint64_t Hasher::digest() const { return XXH64_digest(static_cast<const XXH64_state_t*>(state_)); }

std::string to_hex64(uint64_t value) { return fmt::format("{:016x}", value); }

std::optional<uint64_t> parse_hex64(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace strata::io::detail
