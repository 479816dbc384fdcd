// Image datasets: ImageFolder (root/<class>/<image>, decoded in get(), so in the data loader's
// worker threads) and SyntheticImageDataset (random images of any shape, for throughput runs
// that should not measure disk or decoding).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <strata/core/export.hpp>
#include <strata/data/dataset.hpp>
#include <strata/data/transforms.hpp>

namespace strata::data {

/// A classification dataset laid out as root/<class name>/**/<image>: each subfolder of root
/// is a class, numbered in sorted name order; the files under it (searched recursively)
/// whose extension is .jpg, .jpeg or .png (any case) are its samples, in torchvision's order:
/// folders sorted by path, and the files of each sorted by name.
///
/// get(i) decodes sample i, applies the transform with sample_generator(seed, i, epoch), and
/// returns {input, target}: input is the transform's tensor (a uint8 (H, W, 3) tensor when
/// the transform leaves an Image), target an int64 0-d tensor holding the class index.
class STRATA_API ImageFolder : public Dataset<Example> {
 public:
  /// Scans `root`; raises strata::Error when it is missing, has no class folders, or a class
  /// folder holds no image.
  explicit ImageFolder(const std::string& root, Transform transform = {}, uint64_t seed = 0);

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  Example get(int64_t index) const override;

  /// Class names in index order.
  const std::vector<std::string>& classes() const { return classes_; }
  const std::map<std::string, int64_t>& class_to_idx() const { return class_to_idx_; }
  /// (path, class index) of every sample, in index order.
  const std::vector<std::pair<std::string, int64_t>>& samples() const { return samples_; }
  /// Changes the augmentation stream for a new epoch (a DataLoader calls it as each pass
  /// starts). Raises strata::Error for a negative epoch.
  void set_epoch(int64_t epoch) override;
  /// Whether `path`'s extension is one ImageFolder loads.
  static bool is_image_file(const std::string& path);

 private:
  std::string root_;
  Transform transform_;
  uint64_t seed_;
  std::atomic<uint64_t> epoch_{0};  // atomic: a user may call set_epoch while get() runs elsewhere
  std::vector<std::string> classes_;
  std::map<std::string, int64_t> class_to_idx_;
  std::vector<std::pair<std::string, int64_t>> samples_;
};

/// `n` random images of shape (channels, height, width), standard normal float32 (the range
/// of normalized images), with labels uniform in [0, classes). Sample i depends only on
/// (seed, i), and is generated in get(), so no memory is held for the images.
class STRATA_API SyntheticImageDataset : public Dataset<Example> {
 public:
  SyntheticImageDataset(int64_t n, int64_t channels = 3, int64_t height = 224, int64_t width = 224,
                        int64_t classes = 1000, uint64_t seed = 0);
  int64_t size() const override { return n_; }
  Example get(int64_t index) const override;

 private:
  int64_t n_, channels_, height_, width_, classes_;
  uint64_t seed_;
};

}  // namespace strata::data
