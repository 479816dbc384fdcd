// A whole file mapped read-only-from-disk into memory (private copy-on-write), owned by a
// shared_ptr so tensors that alias it keep it alive through their storage's deleter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata::io {

class MappedFile {
 public:
  /// Maps `path`; raises strata::Error naming the path and errno text on failure.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile() = default;
  uint8_t* data_ = nullptr;  // null for an empty file
  size_t size_ = 0;
};

}  // namespace strata::io
