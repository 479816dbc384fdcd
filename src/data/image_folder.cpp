// ImageFolder: scans root/<class>/**/<image> once at construction; get() reads, decodes and
// transforms one file, so it runs in whichever data-loader worker asks for it.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include <strata/data/image_folder.hpp>
#include <strata/ops/creation.hpp>

namespace strata::data {

namespace fs = std::filesystem;

bool ImageFolder::is_image_file(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

ImageFolder::ImageFolder(const std::string& root, Transform transform, uint64_t seed)
    : root_(root), transform_(std::move(transform)), seed_(seed) {
  std::error_code ec;
  STRATA_CHECK(fs::is_directory(root, ec), "[ImageFolder] {} is not a directory", root);
  // a dangling link is skipped, as PyTorch's ImageFolder skips it: its error is its own
  // (type_ec), not the listing's (ec)
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec)) classes_.push_back(it->path().filename().string());
  }
  STRATA_CHECK(!ec, "[ImageFolder] cannot list {}: {}", root, ec.message());
  STRATA_CHECK(!classes_.empty(), "[ImageFolder] {} has no class subfolders", root);
  std::sort(classes_.begin(), classes_.end());
  for (size_t c = 0; c < classes_.size(); ++c) {
    class_to_idx_[classes_[c]] = static_cast<int64_t>(c);
    std::vector<std::pair<std::string, std::string>> files;  // (folder, file name)
    const fs::path dir = fs::path(root) / classes_[c];
    auto options = fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
    // symlinked folders are followed once each: a link back up (to the root, the class folder
    // or a folder already listed) would repeat samples, or loop forever
    std::set<fs::path> seen{fs::canonical(root, ec), fs::canonical(dir, ec)};
    for (fs::recursive_directory_iterator it(dir, options, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;  // a dangling link: skipped
      if (it->is_directory(type_ec)) {
        std::error_code resolve;  // a folder that cannot be resolved is listed as it is
        const fs::path real = fs::canonical(it->path(), resolve);
        if (!resolve && !seen.insert(real).second) it.disable_recursion_pending();
      } else if (it->is_regular_file(type_ec) && is_image_file(it->path().string())) {
        files.emplace_back(it->path().parent_path().string(), it->path().filename().string());
      }
    }
    STRATA_CHECK(!ec, "[ImageFolder] cannot list {}: {}", dir.string(), ec.message());
    STRATA_CHECK(!files.empty(), "[ImageFolder] class folder {} holds no .jpg, .jpeg or .png file", dir.string());
    // torchvision's order: folders by their path, then the files of each by name (a class
    // folder's own files before its subfolders', "sub/" before "sub-x/")
    std::sort(files.begin(), files.end());
    for (auto& [folder, name] : files)
      samples_.emplace_back((fs::path(folder) / name).string(), static_cast<int64_t>(c));
  }
}

Example ImageFolder::get(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < size(), "[ImageFolder] index {} out of range for {} samples", index, size());
  const auto& [path, label] = samples_[static_cast<size_t>(index)];
  ImageOrTensor value = read_image(path);
  if (transform_) {
    Generator gen = sample_generator(seed_, index, epoch_);
    value = transform_(std::move(value), gen);
  }
  Tensor input = std::holds_alternative<Tensor>(value) ? std::get<Tensor>(value) : image_to_tensor(std::get<Image>(value));
  return {std::move(input), scalar_tensor(label, kInt64)};
}

void ImageFolder::set_epoch(int64_t epoch) {
  STRATA_CHECK(epoch >= 0, "[ImageFolder] negative epoch {}", epoch);
  epoch_ = static_cast<uint64_t>(epoch);
}

// ---- SyntheticImageDataset ------------------------------------------------------------------

SyntheticImageDataset::SyntheticImageDataset(int64_t n, int64_t channels, int64_t height, int64_t width,
                                             int64_t classes, uint64_t seed)
    : n_(n), channels_(channels), height_(height), width_(width), classes_(classes), seed_(seed) {
  STRATA_CHECK(n >= 0 && channels > 0 && height > 0 && width > 0 && classes > 0,
               "[SyntheticImageDataset] invalid n={} shape ({}, {}, {}) classes={}", n, channels, height, width,
               classes);
}

Example SyntheticImageDataset::get(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < n_, "[SyntheticImageDataset] index {} out of range for {} samples", index, n_);
  Generator gen = sample_generator(seed_, index);
  Tensor image = randn({channels_, height_, width_}, kFloat32, &gen);
  const auto label = std::min(static_cast<int64_t>(uniform(gen) * static_cast<double>(classes_)), classes_ - 1);
  return {std::move(image), scalar_tensor(label, kInt64)};
}

}  // namespace strata::data
