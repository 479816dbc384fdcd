// Validation of safetensors bytes into a SafetensorsView: the header length, UTF-8, the
// JSON header, each entry's dtype, shape and byte range, and the byte buffer as a whole
// (no holes, no overlaps, no trailing bytes). Nothing is read outside [data, data + size).
#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include <strata/io/safetensors.hpp>

#include "io/json.h"
#include "io/mapped_file.h"

namespace strata::io {
namespace {

struct FormatDType {
  std::string_view name;
  size_t itemsize;
  std::optional<DType> dtype;  // nullopt: the format has it, strata does not
};

constexpr std::array<FormatDType, 16> kFormatDTypes{{
    {"BOOL", 1, kBool},        {"U8", 1, kUInt8},      {"I8", 1, kInt8},       {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},  {"F16", 2, kFloat16},   {"BF16", 2, kBFloat16}, {"I32", 4, kInt32},
    {"U32", 4, std::nullopt},  {"F32", 4, kFloat32},   {"F64", 8, kFloat64},   {"I64", 8, kInt64},
    {"U64", 8, std::nullopt},  {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
    {"F8_E8M0", 1, std::nullopt},
}};

const FormatDType* find_dtype(std::string_view name) {
  for (const auto& d : kFormatDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// One tensor's object, read field by field; checked in a fixed order once it is closed.
SafetensorsEntry read_entry(json::Reader& r, std::string name) {
  SafetensorsEntry e;
  e.name = std::move(name);
  const std::string& n = e.name;
  if (json::Kind k = r.next_kind(); k != json::Kind::Object)
    STRATA_CHECK(false, "[safetensors] tensor \"{}\": expected an object, found {}", n, json::kind_name(k));
  bool has_dtype = false, has_shape = false, has_offsets = false;
  std::string key;
  r.begin_object();
  for (bool first = true; r.next_member(key, first); first = false) {
    bool* seen = key == "dtype" ? &has_dtype : key == "shape" ? &has_shape : key == "data_offsets" ? &has_offsets
                                                                                                   : nullptr;
    STRATA_CHECK(seen != nullptr, "[safetensors] tensor \"{}\": unknown field \"{}\"", n, key);
    if (*seen) r.fail_at(r.key_position(), "duplicate key \"{}\"", key);
    *seen = true;
    json::Kind kind = r.next_kind();
    if (seen == &has_dtype) {
      STRATA_CHECK(kind == json::Kind::String, "[safetensors] tensor \"{}\": dtype must be a string", n);
      e.dtype = r.string();
    } else if (seen == &has_shape) {
      STRATA_CHECK(kind == json::Kind::Array, "[safetensors] tensor \"{}\": shape must be an array", n);
      r.begin_array();
      for (bool f = true; r.next_element(f); f = false) {
        STRATA_CHECK(r.next_kind() == json::Kind::Integer,
                     "[safetensors] tensor \"{}\": shape entries must be integers", n);
        STRATA_CHECK(e.shape.size() < kMaxSafetensorsDims, "[safetensors] tensor \"{}\": shape has more than {} "
                     "dimensions", n, kMaxSafetensorsDims);
        uint64_t d = r.integer();
        STRATA_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                     "[safetensors] tensor \"{}\": shape size {} does not fit in int64", n, d);
        e.shape.push_back(static_cast<int64_t>(d));
      }
    } else {
      const char* bad = "[safetensors] tensor \"{}\": data_offsets must be an array of two integers";
      STRATA_CHECK(kind == json::Kind::Array, fmt::runtime(bad), n);
      uint64_t offsets[2];
      size_t count = 0;
      r.begin_array();
      for (bool f = true; r.next_element(f); f = false) {
        STRATA_CHECK(count < 2 && r.next_kind() == json::Kind::Integer, fmt::runtime(bad), n);
        offsets[count++] = r.integer();
      }
      STRATA_CHECK(count == 2, fmt::runtime(bad), n);
      e.begin = offsets[0];
      e.end = offsets[1];
    }
  }
  for (auto [has, field] : {std::pair{has_dtype, "dtype"}, {has_shape, "shape"}, {has_offsets, "data_offsets"}})
    STRATA_CHECK(has, "[safetensors] tensor \"{}\": missing \"{}\"", n, field);

  const FormatDType* fd = find_dtype(e.dtype);
  STRATA_CHECK(fd != nullptr, "[safetensors] tensor \"{}\": unknown dtype \"{}\"", n, e.dtype);
  uint64_t numel = 1;
  bool overflow = false;
  for (int64_t s : e.shape) {
    auto d = static_cast<uint64_t>(s);
    // A zero anywhere makes the product 0, whatever else overflows.
    if (d == 0) numel = 0, overflow = false;
    else if (numel != 0 && (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / d))
      overflow = true;
    else if (numel != 0) numel *= d;
  }
  STRATA_CHECK(!overflow, "[safetensors] tensor \"{}\": the element count of shape {} overflows int64", n, e.shape);
  STRATA_CHECK(numel <= std::numeric_limits<uint64_t>::max() / fd->itemsize,
               "[safetensors] tensor \"{}\": the byte count of shape {} overflows", n, e.shape);
  STRATA_CHECK(e.end >= e.begin, "[safetensors] tensor \"{}\": data_offsets [{}, {}] end before begin", n, e.begin,
               e.end);
  STRATA_CHECK(e.end - e.begin == numel * fd->itemsize,
               "[safetensors] tensor \"{}\": data_offsets [{}, {}] span {} bytes but {} {} needs {} x {} = {}", n,
               e.begin, e.end, e.end - e.begin, e.dtype, e.shape, numel, fd->itemsize, numel * fd->itemsize);
  return e;
}

Metadata read_metadata(json::Reader& r) {
  json::Kind k = r.next_kind();
  if (k == json::Kind::Null) {  // serde's Option: the reference reader takes null for none
    r.null();
    return {};
  }
  if (k != json::Kind::Object)
    STRATA_CHECK(false, "[safetensors] __metadata__ must be an object, found {}", json::kind_name(k));
  Metadata m;
  std::string key;
  r.begin_object();
  for (bool first = true; r.next_member(key, first); first = false) {
    size_t key_pos = r.key_position();
    json::Kind kind = r.next_kind();
    STRATA_CHECK(kind == json::Kind::String, "[safetensors] __metadata__ \"{}\" must be a string, found {}", key,
                 json::kind_name(kind));
    if (!m.emplace(key, r.string()).second) r.fail_at(key_pos, "duplicate key \"{}\"", key);
  }
  return m;
}

// The header's top-level object: __metadata__ and one entry per tensor, names unique.
void read_header(std::string_view header, SafetensorsView& view) {
  json::Reader r(header);
  std::vector<size_t> key_positions;  // of each entry, for a duplicate's message
  bool has_metadata = false;
  std::string key;
  r.begin_object();
  for (bool first = true; r.next_member(key, first); first = false) {
    if (key == "__metadata__") {
      if (has_metadata) r.fail_at(r.key_position(), "duplicate key \"__metadata__\"");
      has_metadata = true;
      view.metadata = read_metadata(r);
    } else {
      key_positions.push_back(r.key_position());
      view.entries.push_back(read_entry(r, std::move(key)));
    }
  }
  r.end();
  std::vector<size_t> order(view.entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(view.entries[a].name, key_positions[a]) < std::tie(view.entries[b].name, key_positions[b]);
  });
  for (size_t i = 1; i < order.size(); ++i)
    if (view.entries[order[i]].name == view.entries[order[i - 1]].name)
      r.fail_at(key_positions[order[i]], "duplicate key \"{}\"", view.entries[order[i]].name);
}

}  // namespace

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  const FormatDType* d = find_dtype(name);
  STRATA_CHECK(d != nullptr, "[safetensors] unknown dtype \"{}\"", name);
  return d->dtype;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& d : kFormatDTypes)
    if (d.dtype == dtype) return d.name;
  STRATA_CHECK(false, "[safetensors] no format name for dtype {}", dtype);
}

size_t safetensors_itemsize(std::string_view name) {
  const FormatDType* d = find_dtype(name);
  STRATA_CHECK(d != nullptr, "[safetensors] unknown dtype \"{}\"", name);
  return d->itemsize;
}

SafetensorsView view_safetensors(const void* data, size_t size) {
  STRATA_CHECK(data != nullptr || size == 0, "[safetensors] null data");
  STRATA_CHECK(size >= 8, "[safetensors] {} bytes is too short: a file starts with an 8-byte header length", size);
  const auto* bytes = static_cast<const uint8_t*>(data);
  SafetensorsView view;
  view.file_size = size;
  uint64_t n = read_le64(bytes);
  STRATA_CHECK(n <= std::numeric_limits<uint64_t>::max() - 8, "[safetensors] header length {} overflows", n);
  STRATA_CHECK(n <= kMaxSafetensorsHeaderBytes, "[safetensors] header length {} exceeds the limit of {} bytes", n,
               kMaxSafetensorsHeaderBytes);
  STRATA_CHECK(n <= size - 8, "[safetensors] header length {} is larger than the {} bytes that follow it (truncated?)",
               n, size - 8);
  view.header_size = n;
  std::string_view header(reinterpret_cast<const char*>(bytes + 8), static_cast<size_t>(n));
  STRATA_CHECK(!header.empty() && header[0] == '{', "[safetensors] header does not start with '{{'");
  size_t bad = json::find_invalid_utf8(header);
  STRATA_CHECK(bad == std::string_view::npos, "[safetensors] header: invalid UTF-8 at byte {}", bad);
  read_header(header, view);
  // The byte buffer is tiled by the entries in offset order (the header's key order is
  // free), from 0 to its very end.
  std::sort(view.entries.begin(), view.entries.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t buffer = size - 8 - n;
  uint64_t expected = 0;
  const SafetensorsEntry* prev = nullptr;
  for (SafetensorsEntry& e : view.entries) {
    STRATA_CHECK(e.begin <= expected, "[safetensors] tensor \"{}\": hole of {} bytes before data_offsets [{}, {}]", e.name,
                 e.begin - expected, e.begin, e.end);
    STRATA_CHECK(e.begin == expected, "[safetensors] tensor \"{}\": data_offsets [{}, {}] overlap tensor \"{}\" [{}, {}]",
                 e.name, e.begin, e.end, prev ? prev->name : "", prev ? prev->begin : 0, prev ? prev->end : 0);
    STRATA_CHECK(e.end <= buffer, "[safetensors] tensor \"{}\": data_offsets [{}, {}] reach past the {} data bytes of "
                 "the file (truncated?)", e.name, e.begin, e.end, buffer);
    e.data = bytes + 8 + n + e.begin;
    expected = e.end;
    prev = &e;
  }
  STRATA_CHECK(expected == buffer, "[safetensors] {} trailing bytes after the last tensor", buffer - expected);
  return view;
}

SafetensorsView view_safetensors_file(const std::string& path) {
  auto file = MappedFile::open(path);
  SafetensorsView view;
  try {
    view = view_safetensors(file->data(), file->size());
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {})", e.what(), path));
  }
  view.owner = std::shared_ptr<const void>(file, file->data());
  return view;
}

}  // namespace strata::io
