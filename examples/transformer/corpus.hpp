// The text the example trains on: every plain-text file under a folder (or one file), as
// bytes, split 90/10 into training and held-out validation text, served as random windows.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <strata/strata.hpp>

namespace corpus {

namespace st = strata;

struct Text {
  std::vector<uint8_t> bytes;
  size_t split = 0;  // bytes before this are training text
  size_t files = 0;
};

inline bool is_text_file(const std::filesystem::path& p) {
  auto ext = p.extension().string();
  return std::filesystem::is_regular_file(p) && ext != ".dat" && ext != ".u8" && !std::filesystem::is_symlink(p);
}

inline Text load(const std::string& path) {
  namespace fs = std::filesystem;
  STRATA_CHECK(fs::exists(path), "[corpus] {} does not exist (install Debian's fortunes package, or pass --corpus)",
               path);
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::directory_iterator(path))
      if (is_text_file(e.path())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  Text t;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    t.bytes.insert(t.bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    ++t.files;
  }
  STRATA_CHECK(t.bytes.size() > 10000, "[corpus] {} holds only {} bytes of text", path, t.bytes.size());
  t.split = t.bytes.size() * 9 / 10;
  return t;
}

// Entropy of the training text's byte frequencies, evaluated on the validation text: the loss
// of the best model that ignores context.
inline double unigram_entropy(const std::vector<uint8_t>& bytes, size_t split) {
  std::vector<double> counts(256, 1.0);  // add-one smoothing
  for (size_t i = 0; i < split; ++i) counts[bytes[i]] += 1;
  double total = 0;
  for (double c : counts) total += c;
  double nll = 0;
  for (size_t i = split; i < bytes.size(); ++i) nll -= std::log(counts[bytes[i]] / total);
  return nll / static_cast<double>(bytes.size() - split);
}

class Windows {
 public:
  Windows(const std::vector<uint8_t>& bytes, size_t begin, size_t end) : bytes_(&bytes), begin_(begin), end_(end) {}

  // (input, target) windows of `context` bytes; target is input shifted by one.
  std::pair<st::Tensor, st::Tensor> batch(int64_t batch, int64_t context, st::Generator& g) const {
    int64_t span = static_cast<int64_t>(end_ - begin_) - context - 1;
    STRATA_CHECK(span > 0, "[corpus] text of {} bytes is shorter than the context {}", end_ - begin_, context);
    st::Tensor starts = st::randint(0, span, {batch}, st::kInt64, &g);
    std::vector<int64_t> x(static_cast<size_t>(batch * context)), y(x.size());
    const int64_t* s = starts.data_ptr<int64_t>();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < context; ++t) {
        size_t at = begin_ + static_cast<size_t>(s[b] + t);
        x[b * context + t] = (*bytes_)[at];
        y[b * context + t] = (*bytes_)[at + 1];
      }
    return {st::from_vector<int64_t>(x, st::Shape{batch, context}), st::from_vector<int64_t>(y, st::Shape{batch, context})};
  }

 private:
  const std::vector<uint8_t>* bytes_;
  size_t begin_, end_;
};

inline std::vector<double> to_vector(const st::Tensor& t) {
  st::Tensor c = t.contiguous().to(st::kFloat64);
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// Samples an index among the k largest logits, proportionally to softmax.
inline int64_t sample_top_k(const std::vector<double>& logits, int64_t k, st::Generator& g) {
  std::vector<int64_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  k = std::clamp<int64_t>(k, 1, static_cast<int64_t>(order.size()));
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  double top = logits[order[0]], total = 0;
  std::vector<double> w(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) total += (w[i] = std::exp(logits[order[i]] - top));
  double u = st::rand({1}, st::kFloat64, &g).item<double>() * total;
  for (int64_t i = 0; i < k; ++i) {
    if ((u -= w[i]) <= 0) return order[i];
  }
  return order[k - 1];
}

}  // namespace corpus
