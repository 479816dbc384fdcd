// Encoding and parsing a checkpoint's metadata; see Note [Checkpoint layout] in checkpoint.cpp.
#include "io/checkpoint_format.h"

#include <charconv>
#include <system_error>

#include <fmt/format.h>

#include <strata/core/error.hpp>

#include "io/checksum.h"

namespace strata::io::detail {
namespace {

template <class T>
bool parse_number(std::string_view text, T& value) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size();
}

bool starts_with(std::string_view s, std::string_view prefix, std::string_view& rest) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  rest = s.substr(prefix.size());
  return true;
}

struct Part {
  const char* name;
  optim::StateDict CheckpointFile::*dict;
  bool CheckpointFile::*present;
};
constexpr Part kParts[] = {{"optim", &CheckpointFile::optimizer, &CheckpointFile::has_optimizer},
                           {"sched", &CheckpointFile::scheduler, &CheckpointFile::has_scheduler},
                           {"scaler", &CheckpointFile::scaler, &CheckpointFile::has_scaler}};

}  // namespace

std::string format_double(double v) { return fmt::format("{:.17g}", v); }

std::string format_rng(uint64_t seed, uint64_t offset) { return fmt::format("{},{}", seed, offset); }

uint64_t metadata_hash(const Metadata& meta) {
  Hasher h;
  for (const auto& [k, v] : meta) {
    if (k == "checksum.metadata") continue;
    h.update(k.data(), k.size() + 1);  // with the terminating '\0' as separator
    h.update(v.data(), v.size() + 1);
  }
  return h.digest();
}

void parse_layout(const std::string& path, const SafetensorsFile& f, CheckpointFile& out) {
  bool has_step = false;
  for (const auto& [key, value] : f.metadata) {
    std::string_view k = key, rest;
    auto bad = [&](const char* what) {
      return Error(fmt::format("[checkpoint] {}: metadata entry '{}' = '{}' is not {}", path, key, value, what));
    };
    if (k == "format" || starts_with(k, "checksum.", rest)) continue;
    if (k == "step") {
      if (!parse_number(value, out.progress.step)) throw bad("an integer");
      has_step = true;
    } else if (starts_with(k, "config.", rest)) {
      out.config[std::string(rest)] = value;
    } else if (starts_with(k, "user.", rest)) {
      out.progress.metadata[std::string(rest)] = value;
    } else if (starts_with(k, "loader.", rest)) {
      if (!parse_number(value, out.progress.loader[std::string(rest)])) throw bad("an integer");
    } else if (starts_with(k, "rng.", rest)) {
      size_t comma = value.find(',');
      uint64_t seed = 0, offset = 0;
      if (comma == std::string::npos || !parse_number(std::string_view(value).substr(0, comma), seed) ||
          !parse_number(std::string_view(value).substr(comma + 1), offset))
        throw bad("a generator state '<seed>,<offset>'");
      out.generators[std::string(rest)] = {seed, offset};
    } else {
      bool known = false;
      for (const Part& p : kParts) {
        std::string_view sub;
        if (!starts_with(k, p.name, sub) || !starts_with(sub, ".", sub)) continue;
        if (sub == "type") {
          (out.*p.dict).type = value;
          out.*p.present = true;
          known = true;
        } else if (starts_with(sub, "scalar.", rest)) {
          double v = 0;
          if (!parse_number(value, v)) throw bad("a number");
          (out.*p.dict).scalars[std::string(rest)] = v;
          known = true;
        }
      }
      STRATA_CHECK(known, "[checkpoint] {}: unknown metadata entry '{}'", path, key);
    }
  }
  STRATA_CHECK(has_step, "[checkpoint] {}: the metadata has no 'step'", path);
  STRATA_CHECK(out.generators.count("default"), "[checkpoint] {}: the metadata has no 'rng.default'", path);

  for (const auto& [key, t] : f.tensors) {
    std::string_view k = key, rest;
    if (starts_with(k, "model.", rest)) {
      out.model[std::string(rest)] = t;
      continue;
    }
    bool known = false;
    for (const Part& p : kParts)
      if (starts_with(k, p.name, rest) && starts_with(rest, ".", rest)) {
        (out.*p.dict).tensors[std::string(rest)] = t;
        known = true;
      }
    STRATA_CHECK(known, "[checkpoint] {}: unknown tensor '{}'", path, key);
  }
  for (const Part& p : kParts)
    STRATA_CHECK(out.*p.present || ((out.*p.dict).scalars.empty() && (out.*p.dict).tensors.empty()),
                 "[checkpoint] {}: '{}' entries without '{}.type'", path, p.name, p.name);
}

}  // namespace strata::io::detail
