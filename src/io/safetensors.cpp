// Writing safetensors files byte-for-byte as the reference implementation does, and turning
// validated views into strata Tensors (aliasing an mmap'd file, or copying).
#include <strata/io/safetensors.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include <strata/io/atomic_file.hpp>
#include <strata/ops/creation.hpp>

#include "io/json.h"

namespace strata::io {

static_assert(std::endian::native == std::endian::little, "safetensors stores little-endian bytes");

namespace {

// Position of each dtype in the reference's Dtype enum, whose order it sorts by (descending,
// so the most-aligned tensors come first and every tensor stays aligned to its itemsize).
int reference_rank(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::UInt8: return 1;
    case DType::Int8: return 2;
    case DType::Float16: return 3;
    case DType::BFloat16: return 4;
    case DType::Int32: return 5;
    case DType::Float32: return 6;
    case DType::Float64: return 7;
    case DType::Int64: return 8;
  }
  return 0;
}

void check_utf8(std::string_view s, std::string_view what) {
  size_t bad = json::find_invalid_utf8(s);
  STRATA_CHECK(bad == std::string_view::npos, "[safetensors] {} \"{}\" is not valid UTF-8 (byte {})", what, s, bad);
}

// What a file holds, ready to be written: the padded header and the contiguous CPU tensors
// in file order.
struct Plan {
  std::string header;
  std::vector<Tensor> tensors;
  uint64_t data_bytes = 0;
};

Plan make_plan(const TensorMap& tensors, const Metadata& metadata) {
  std::vector<std::pair<std::string, Tensor>> order;
  for (const auto& [name, t] : tensors) {
    STRATA_CHECK(name != "__metadata__", "[safetensors] \"__metadata__\" is reserved and cannot name a tensor");
    STRATA_CHECK(t.defined(), "[safetensors] tensor \"{}\" is undefined", name);
    STRATA_CHECK(static_cast<size_t>(t.dim()) <= kMaxSafetensorsDims,
                 "[safetensors] tensor \"{}\" has {} dimensions; at most {} can be read back", name, t.dim(),
                 kMaxSafetensorsDims);
    check_utf8(name, "tensor name");
    order.emplace_back(name, t);
  }
  for (const auto& [k, v] : metadata) {
    check_utf8(k, "metadata key");
    check_utf8(v, "metadata value");
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return reference_rank(a.second.dtype()) > reference_rank(b.second.dtype());
  });

  Plan plan;
  std::string& h = plan.header;
  h += '{';
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      json::append_string(h, k);
      h += ':';
      json::append_string(h, v);
    }
    h += '}';
    if (!order.empty()) h += ',';
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& [name, t] = order[i];
    Tensor c = t.detach().to(kCPU).contiguous();
    uint64_t begin = plan.data_bytes;
    plan.data_bytes += c.nbytes();
    if (i) h += ',';
    json::append_string(h, name);
    h += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", safetensors_dtype_name(c.dtype()),
                     fmt::join(c.shape(), ","), begin, plan.data_bytes);
    plan.tensors.push_back(std::move(c));
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');  // 8 + N stays a multiple of 8
  // refused before anything is written: readers (this one too) refuse larger headers
  STRATA_CHECK(h.size() <= kMaxSafetensorsHeaderBytes,
               "[safetensors] the header of {} bytes (names, shapes and metadata) is larger than the format's limit "
               "of {} bytes", h.size(), kMaxSafetensorsHeaderBytes);
  return plan;
}

std::array<uint8_t, 8> le64(uint64_t v) {
  std::array<uint8_t, 8> b{};
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return b;
}

}  // namespace

std::vector<uint8_t> serialize_safetensors(const TensorMap& tensors, const Metadata& metadata) {
  Plan plan = make_plan(tensors, metadata);
  std::vector<uint8_t> out;
  out.reserve(8 + plan.header.size() + plan.data_bytes);
  auto n = le64(plan.header.size());
  out.insert(out.end(), n.begin(), n.end());
  out.insert(out.end(), plan.header.begin(), plan.header.end());
  for (const Tensor& t : plan.tensors) {
    const auto* p = static_cast<const uint8_t*>(t.data());
    out.insert(out.end(), p, p + t.nbytes());
  }
  return out;
}

void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata) {
  // The plan (and any GPU-to-CPU copy) is made before the file is touched.
  Plan plan = make_plan(tensors, metadata);
  write_file_atomically(path, [&](std::FILE* f) {
    auto put = [&](const void* p, size_t n) {
      STRATA_CHECK(n == 0 || std::fwrite(p, 1, n, f) == n, "[safetensors] write to {} failed: {}", path,
                   std::strerror(errno));
    };
    auto n = le64(plan.header.size());
    put(n.data(), n.size());
    put(plan.header.data(), plan.header.size());
    for (const Tensor& t : plan.tensors) put(t.data(), t.nbytes());
  });
}

Tensor entry_to_tensor(const SafetensorsView& view, const SafetensorsEntry& entry) {
  std::optional<DType> dtype = dtype_from_safetensors(entry.dtype);
  STRATA_CHECK(dtype.has_value(),
               "[safetensors] tensor \"{}\" has dtype {}, which strata has no Tensor type for "
               "(it holds BOOL, U8, I8, I32, I64, F16, BF16, F32, F64)",
               entry.name, entry.dtype);
  if (*dtype == kBool) {
    // Any other byte would break strata's bool kernels, which assume 0 or 1.
    for (uint64_t i = 0; i < entry.nbytes(); ++i)
      STRATA_CHECK(entry.data[i] <= 1, "[safetensors] tensor \"{}\": BOOL element {} is {}, not 0 or 1", entry.name, i,
                   entry.data[i]);
  }
  bool aligned = reinterpret_cast<uintptr_t>(entry.data) % itemsize(*dtype) == 0;
  if (view.owner && aligned && entry.nbytes() > 0) {
    // The deleter's copy of the owner keeps the mapping alive as long as the storage.
    std::shared_ptr<const void> owner = view.owner;
    return from_blob(const_cast<uint8_t*>(entry.data), entry.shape, *dtype, [owner](void*) {});
  }
  Tensor t = empty(entry.shape, *dtype);
  if (entry.nbytes() > 0) std::memcpy(t.data(), entry.data, entry.nbytes());
  return t;
}

namespace {
SafetensorsFile to_file(const SafetensorsView& view) {
  SafetensorsFile file;
  file.metadata = view.metadata;
  for (const SafetensorsEntry& e : view.entries) file.tensors.emplace(e.name, entry_to_tensor(view, e));
  return file;
}
}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsView view = view_safetensors_file(path);
  try {
    return to_file(view);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (in {})", e.what(), path));
  }
}

SafetensorsFile parse_safetensors(const void* data, size_t size) { return to_file(view_safetensors(data, size)); }

}  // namespace strata::io
