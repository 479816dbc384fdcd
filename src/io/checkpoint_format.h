// The text encodings of a checkpoint's metadata (Note [Checkpoint layout] in checkpoint.cpp):
// exact doubles, generator states, the metadata checksum, and parsing a loaded file back into a
// CheckpointFile.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <strata/io/checkpoint.hpp>
#include <strata/io/safetensors.hpp>

namespace strata::io::detail {

inline constexpr const char* kCheckpointFormat = "strata.checkpoint/1";

/// "{:.17g}": parses back to the same bits (inf and nan included).
std::string format_double(double v);
std::string format_rng(uint64_t seed, uint64_t offset);

/// xxHash64 over every entry but "checksum.metadata", as "key\0value\0" in key order.
uint64_t metadata_hash(const Metadata& meta);

/// Splits a loaded (checksum-verified) file into `out`; raises Error naming `path` and the
/// entry for anything malformed or unknown.
void parse_layout(const std::string& path, const SafetensorsFile& f, CheckpointFile& out);

}  // namespace strata::io::detail
