// Reading and writing safetensors files: an 8-byte little-endian header length, a JSON
// header naming each tensor's dtype, shape and byte range, then the packed tensor bytes.
// Files are written atomically and loaded through mmap, with every field validated first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <strata/core/dtype.hpp>
#include <strata/core/export.hpp>
#include <strata/core/shape.hpp>
#include <strata/core/tensor.hpp>

namespace strata::io {

using TensorMap = std::map<std::string, Tensor>;
using Metadata = std::map<std::string, std::string>;

/// The largest JSON header a file may have (the reference implementation's limit, which bounds
/// what a hostile file can make a reader allocate). Writers refuse to go past it.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
/// The most dimensions a tensor's shape may have (as NumPy allows); readers refuse more, so
/// that a header's size, not its content, bounds what reading it allocates. Writers refuse too.
inline constexpr size_t kMaxSafetensorsDims = 64;

/// Writes tensors (any strides, CPU or GPU; copied to contiguous CPU bytes) and metadata
/// as one safetensors file, atomically (see atomic_file.hpp): after a crash the path holds
/// either the old file or the complete new one.
STRATA_API void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {});

/// The bytes save_safetensors would write.
STRATA_API std::vector<uint8_t> serialize_safetensors(const TensorMap& tensors, const Metadata& metadata = {});

struct SafetensorsFile {
  TensorMap tensors;
  Metadata metadata;
};

/// Maps the file (mmap) and validates it completely before returning; tensors alias the
/// mapping (kept alive by their storage's deleter) — no second read of the data. The
/// mapping is private: writing to a loaded tensor never changes the file.
STRATA_API SafetensorsFile load_safetensors(const std::string& path);

/// Parses and validates a whole file held in memory; the tensors own copies of the bytes.
STRATA_API SafetensorsFile parse_safetensors(const void* data, size_t size);

/// One tensor as the header states it, before any conversion to a strata Tensor.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;          ///< the format's name: "F32", "BF16", "U16", "F8_E4M3", ...
  Shape shape;
  uint64_t begin = 0;         ///< byte offsets relative to the start of the data buffer
  uint64_t end = 0;
  const uint8_t* data = nullptr;  ///< first byte of this tensor inside the viewed bytes
  uint64_t nbytes() const { return end - begin; }
};

/// A validated file without conversion: every entry, including dtypes strata has no
/// Tensor type for (I16, U16, U32, U64, F8_E4M3, F8_E5M2, F8_E8M0). Entries are in byte order.
struct SafetensorsView {
  std::vector<SafetensorsEntry> entries;
  Metadata metadata;
  uint64_t header_size = 0;  ///< N, the JSON header's length in bytes (padding included)
  uint64_t file_size = 0;
  std::shared_ptr<const void> owner;  ///< keeps the bytes alive (the mapping for files)
};

/// Validates `size` bytes at `data` completely; entries point into `data`, which the
/// caller keeps alive (owner stays empty).
STRATA_API SafetensorsView view_safetensors(const void* data, size_t size);
/// Maps the file and validates it; the view's owner holds the mapping.
STRATA_API SafetensorsView view_safetensors_file(const std::string& path);

/// A Tensor for one entry of a view, aliasing the view's bytes when `view.owner` is set
/// and the address is aligned, copying otherwise. Raises Error naming the dtype and the
/// tensor when strata has no Tensor type for the entry's dtype.
STRATA_API Tensor entry_to_tensor(const SafetensorsView& view, const SafetensorsEntry& entry);

/// The strata dtype of a format dtype name ("F32" -> kFloat32); nullopt for names the
/// format defines but strata cannot hold, Error for names the format does not define.
STRATA_API std::optional<DType> dtype_from_safetensors(std::string_view name);
/// The format's name of a strata dtype (kFloat32 -> "F32").
STRATA_API std::string_view safetensors_dtype_name(DType dtype);
/// Bytes per element of a format dtype name; Error for names the format does not define.
STRATA_API size_t safetensors_itemsize(std::string_view name);

}  // namespace strata::io
