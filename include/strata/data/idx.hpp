// The IDX format of MNIST and Fashion-MNIST: a magic number (two zero bytes, a type byte,
// the number of dims), the dims as big-endian uint32, then the data in C order. Files may be
// gzip-compressed (read through zlib, which also reads plain files). Only unsigned-byte data
// (type 0x08) is supported, which is what those datasets use.
#pragma once

#include <cstdint>
#include <string>

#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>
#include <strata/data/dataset.hpp>

namespace strata::data {

/// Reads an unsigned-byte IDX file (plain or gzip) into a uint8 CPU tensor of its dims.
/// Raises strata::Error naming the file for a bad magic, a non-byte type, zero or too many
/// dims, a truncated body or trailing bytes.
STRATA_API Tensor read_idx(const std::string& path);
/// Writes `t` (uint8, 1 to 8 dims) as an IDX file, gzip-compressed when `gzip`.
STRATA_API void write_idx(const std::string& path, const Tensor& t, bool gzip = false);

/// The folder holding Fashion-MNIST's four .gz files: $STRATA_FASHION_MNIST_DIR when set,
/// else /usr/share/datasets/fashion-mnist (where Debian's dataset-fashion-mnist installs them).
STRATA_API std::string fashion_mnist_dir();

/// Images and labels from a pair of IDX files: images (N, H, W) uint8, labels (N) uint8.
/// get(i) returns input = float32 (1, H, W) in [0, 1] (pixel / 255) and target = an int64
/// 0-d tensor. Both files are read at construction.
class STRATA_API IdxDataset : public Dataset<Example> {
 public:
  IdxDataset(const std::string& images_path, const std::string& labels_path);
  /// Fashion-MNIST's train (60000) or test (10000) split from `dir`.
  static IdxDataset fashion_mnist(bool train, const std::string& dir = fashion_mnist_dir());

  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;

  /// All images, uint8 (N, H, W).
  const Tensor& images() const { return images_; }
  /// All labels, int64 (N).
  const Tensor& labels() const { return labels_; }

 private:
  Tensor images_;
  Tensor labels_;
};

}  // namespace strata::data
