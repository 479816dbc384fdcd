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

const json::Value& field(const json::Value& entry, const std::string& name, std::string_view key) {
  for (const auto& [k, v] : entry.object)
    if (k == key) return v;
  throw Error(fmt::format("[safetensors] tensor \"{}\": missing \"{}\"", name, key));
}

SafetensorsEntry parse_entry(const std::string& name, const json::Value& v) {
  STRATA_CHECK(v.kind == json::Value::Kind::Object, "[safetensors] tensor \"{}\": expected an object, found {}", name,
               json::kind_name(v.kind));
  for (const auto& [k, _] : v.object)
    STRATA_CHECK(k == "dtype" || k == "shape" || k == "data_offsets", "[safetensors] tensor \"{}\": unknown field \"{}\"",
                 name, k);
  SafetensorsEntry e;
  e.name = name;

  const json::Value& dtype = field(v, name, "dtype");
  STRATA_CHECK(dtype.kind == json::Value::Kind::String, "[safetensors] tensor \"{}\": dtype must be a string", name);
  const FormatDType* fd = find_dtype(dtype.string);
  STRATA_CHECK(fd != nullptr, "[safetensors] tensor \"{}\": unknown dtype \"{}\"", name, dtype.string);
  e.dtype = dtype.string;

  const json::Value& shape = field(v, name, "shape");
  STRATA_CHECK(shape.kind == json::Value::Kind::Array, "[safetensors] tensor \"{}\": shape must be an array", name);
  uint64_t numel = 1;
  bool overflow = false;
  for (const json::Value& d : shape.array) {
    STRATA_CHECK(d.kind == json::Value::Kind::Integer, "[safetensors] tensor \"{}\": shape entries must be integers",
                 name);
    STRATA_CHECK(d.integer <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "[safetensors] tensor \"{}\": shape size {} does not fit in int64", name, d.integer);
    e.shape.push_back(static_cast<int64_t>(d.integer));
    // A zero anywhere makes the product 0, whatever else overflows.
    if (d.integer == 0) numel = 0, overflow = false;
    else if (numel != 0 && (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / d.integer))
      overflow = true;
    else if (numel != 0) numel *= d.integer;
  }
  STRATA_CHECK(!overflow, "[safetensors] tensor \"{}\": the element count of shape {} overflows int64", name, e.shape);
  STRATA_CHECK(numel <= std::numeric_limits<uint64_t>::max() / fd->itemsize,
               "[safetensors] tensor \"{}\": the byte count of shape {} overflows", name, e.shape);

  const json::Value& offsets = field(v, name, "data_offsets");
  STRATA_CHECK(offsets.kind == json::Value::Kind::Array && offsets.array.size() == 2 &&
                   offsets.array[0].kind == json::Value::Kind::Integer &&
                   offsets.array[1].kind == json::Value::Kind::Integer,
               "[safetensors] tensor \"{}\": data_offsets must be an array of two integers", name);
  e.begin = offsets.array[0].integer;
  e.end = offsets.array[1].integer;
  STRATA_CHECK(e.end >= e.begin, "[safetensors] tensor \"{}\": data_offsets [{}, {}] end before begin", name, e.begin,
               e.end);
  STRATA_CHECK(e.end - e.begin == numel * fd->itemsize,
               "[safetensors] tensor \"{}\": data_offsets [{}, {}] span {} bytes but {} {} needs {} x {} = {}", name,
               e.begin, e.end, e.end - e.begin, e.dtype, e.shape, numel, fd->itemsize, numel * fd->itemsize);
  return e;
}

Metadata parse_metadata(const json::Value& v) {
  STRATA_CHECK(v.kind == json::Value::Kind::Object, "[safetensors] __metadata__ must be an object, found {}",
               json::kind_name(v.kind));
  Metadata m;
  for (const auto& [k, item] : v.object) {
    STRATA_CHECK(item.kind == json::Value::Kind::String, "[safetensors] __metadata__ \"{}\" must be a string, found {}",
                 k, json::kind_name(item.kind));
    m.emplace(k, item.string);
  }
  return m;
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
  json::Value root = json::parse(header);
  STRATA_CHECK(root.kind == json::Value::Kind::Object, "[safetensors] header must be a JSON object");

  for (const auto& [key, v] : root.object) {
    if (key == "__metadata__") view.metadata = parse_metadata(v);
    else view.entries.push_back(parse_entry(key, v));
  }
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
