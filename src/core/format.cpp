// Tensor printing in PyTorch's style: one number format for the whole tensor (integers as
// "1.", fixed with 4 decimals, or scientific when magnitudes span a wide range).
#include <cmath>
#include <string>
#include <vector>

#include <strata/core/format.hpp>

namespace strata {

namespace {

constexpr int64_t kSummarizeThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

struct NumberFormat {
  bool integral_values = true;
  bool scientific = false;
  size_t width = 1;
};

std::string format_value(double v, const NumberFormat& f) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (f.scientific) return fmt::format("{:.4e}", v);
  if (f.integral_values) return fmt::format("{:.0f}.", v);
  return fmt::format("{:.4f}", v);
}

class Printer {
 public:
  explicit Printer(const Tensor& t) : t_(t.contiguous()), summarize_(t.numel() > kSummarizeThreshold) {
    if (!is_floating(t.dtype())) {  // integers print from int64: a double would round past 2^53
      Tensor d = t_.to(kInt64);
      const int64_t* p = static_cast<const int64_t*>(d.data());
      ints_.assign(p, p + d.numel());
      for (size_t i = 0; i < ints_.size(); ++i) fmt_.width = std::max(fmt_.width, text(static_cast<int64_t>(i)).size());
      return;
    }
    Tensor d = t_.to(kFloat64);
    const double* p = static_cast<const double*>(d.data());
    values_.assign(p, p + d.numel());
    double lo = INFINITY, hi = 0;
    for (double v : values_) {
      if (!std::isfinite(v)) continue;
      if (v != std::nearbyint(v)) fmt_.integral_values = false;
      double a = std::fabs(v);
      if (a > 0) lo = std::min(lo, a);
      hi = std::max(hi, a);
    }
    if (is_floating(t.dtype()) && hi > 0 && (hi >= 1e8 || (!fmt_.integral_values && (lo < 1e-4 || hi / lo > 1e3))))
      fmt_.scientific = true;
    for (size_t i = 0; i < values_.size(); ++i) fmt_.width = std::max(fmt_.width, text(static_cast<int64_t>(i)).size());
  }

  std::string body() {
    std::string out;
    if (t_.dim() == 0) return text(0);
    print_dim(out, 0, 0, 7);
    return out;
  }

 private:
  void print_dim(std::string& out, int64_t d, int64_t base, size_t indent) {
    int64_t n = t_.shape()[d];
    int64_t stride = t_.strides()[d];
    out += '[';
    bool last_dim = d == t_.dim() - 1;
    for (int64_t i = 0; i < n; ++i) {
      if (summarize_ && n > 2 * kEdgeItems && i == kEdgeItems) {
        out += last_dim ? "..., " : fmt::format("...,\n{:{}}", "", indent + 1);
        i = n - kEdgeItems;
      }
      if (last_dim) {
        std::string v = text(base + i * stride);
        out += fmt::format("{:>{}}", v, fmt_.width);
      } else {
        print_dim(out, d + 1, base + i * stride, indent + 1);
      }
      if (i + 1 < n) {
        out += last_dim ? ", " : ",";
        if (!last_dim) out += std::string(static_cast<size_t>(t_.dim() - d - 1), '\n') + std::string(indent + 1, ' ');
      }
    }
    out += ']';
  }

  // element i (in C order) as printed
  std::string text(int64_t i) const {
    const auto k = static_cast<size_t>(i);
    if (t_.dtype() == kBool) return ints_[k] != 0 ? "True" : "False";
    if (!is_floating(t_.dtype())) return fmt::format("{}", ints_[k]);
    return format_value(values_[k], fmt_);
  }

  Tensor t_;
  bool summarize_;
  std::vector<double> values_;   // floating dtypes
  std::vector<int64_t> ints_;    // integers and bool
  NumberFormat fmt_;
};

}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  std::string suffix;
  if (t.dtype() != kFloat32 && t.dtype() != kInt64 && t.dtype() != kBool) suffix += fmt::format(", dtype={}", t.dtype());
  if (!t.device().is_cpu()) suffix += fmt::format(", device='{}'", t.device());
  if (t.numel() == 0) return fmt::format("tensor([], size={}{})", t.shape(), suffix);
  Printer p(t.device().is_cpu() ? t : t.cpu());
  return fmt::format("tensor({}{})", p.body(), suffix);
}

}  // namespace strata
