// HistogramObserver (include/strata/quant/observer.hpp), PyTorch's algorithm in float64 on the
// host: histc of each batch over the running range, re-binning of the old histogram when the
// range grows (_combine_histograms, _upscale_histogram), and the greedy search for the range of
// whole bins with the least L2 quantization error (_non_linear_param_search,
// _compute_quantization_error).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/error.hpp>
#include <strata/ops/creation.hpp>
#include <strata/quant/observer.hpp>

namespace strata::quant {

namespace {

constexpr int64_t kUpsampleRate = 16;  // parts each old bin is split into when the range grows

std::vector<double> host_doubles(const Tensor& t) {
  const Tensor h = t.detach().to(kCPU).to(kFloat64).contiguous();
  const double* p = h.data_ptr<double>();
  return std::vector<double>(p, p + h.numel());
}

// torch.histc: `bins` equal bins over [lo, hi] (widened by 1 each way when lo == hi), the value hi
// in the last bin, values outside (and non-finite ones) left out.
std::vector<double> histc(const std::vector<double>& x, int64_t bins, double lo, double hi) {
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  std::vector<double> h(static_cast<size_t>(bins), 0.0);
  for (double v : x) {
    if (!(v >= lo && v <= hi)) continue;
    const auto pos = std::min(static_cast<int64_t>((v - lo) / (hi - lo) * static_cast<double>(bins)), bins - 1);
    h[static_cast<size_t>(pos)] += 1;
  }
  return h;
}

// The old histogram over [lo, hi] moved into `bins` bins over [new_lo, new_hi] (which holds it):
// each old bin split into kUpsampleRate parts, each part put in the new bin holding its centre.
std::vector<double> upscale(const std::vector<double>& old, double lo, double hi, double new_lo, double new_hi) {
  const auto bins = static_cast<int64_t>(old.size());
  std::vector<double> bounds(static_cast<size_t>(bins + 1)), out(static_cast<size_t>(bins), 0.0);
  for (int64_t i = 0; i <= bins; ++i)
    bounds[static_cast<size_t>(i)] = new_lo + (new_hi - new_lo) * static_cast<double>(i) / static_cast<double>(bins);
  const int64_t parts = bins * kUpsampleRate;
  const double part = (hi - lo) / static_cast<double>(parts);
  for (int64_t j = 0; j < parts; ++j) {
    const double mid = lo + (hi - lo) * static_cast<double>(j) / static_cast<double>(parts) + 0.5 * part;
    int64_t b = std::upper_bound(bounds.begin(), bounds.end(), mid) - bounds.begin() - 1;
    b = std::clamp<int64_t>(b, 0, bins - 1);
    out[static_cast<size_t>(b)] += old[static_cast<size_t>(j / kUpsampleRate)] / kUpsampleRate;
  }
  return out;
}

// density * integral of x^2 over [a, b]
double l2_norm(double a, double b, double density) { return density * (b * b * b - a * a * a) / 3; }

}  // namespace

HistogramObserver::HistogramObserver(ObserverOptions options, int64_t bins)
    : Observer(std::move(options), false, 0), bins_(bins) {
  STRATA_CHECK(bins >= 1, "[HistogramObserver] bins must be positive, got {}", bins);
  histogram = register_buffer("histogram", zeros({bins}));
}

void HistogramObserver::update(const Tensor&, const Tensor&) {
  throw Error("[HistogramObserver] internal: update is not used (forward keeps the histogram)");
}

Tensor HistogramObserver::forward(const Tensor& x) {
  checked_axis(x);
  NoGradGuard no_grad;
  const std::vector<double> values = host_doubles(x);
  // the finite range here (finite_aminmax gives a batch without finite values [0, 0], which would
  // widen the range to 0)
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values)
    if (std::isfinite(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (lo > hi) return x;  // no finite value (or none at all), as PyTorch skips an empty batch
  std::vector<double> hist;
  double new_lo = lo, new_hi = hi;
  if (!observed()) {
    hist = histc(values, bins_, lo, hi);
  } else {
    const double cur_lo = min_val.item<double>(), cur_hi = max_val.item<double>();
    new_lo = std::min(cur_lo, lo);
    new_hi = std::max(cur_hi, hi);
    hist = histc(values, bins_, new_lo, new_hi);
    std::vector<double> old = host_doubles(histogram);
    if (cur_lo == cur_hi) {  // every earlier value was cur_lo: its mass goes to cur_lo's new bin
      double mass = 0;
      for (double c : old) mass += c;
      old = histc({cur_lo}, bins_, new_lo, new_hi);
      for (double& c : old) c *= mass;
    } else if (new_lo != cur_lo || new_hi != cur_hi) {
      old = upscale(old, cur_lo, cur_hi, new_lo, new_hi);
    }
    for (size_t i = 0; i < hist.size(); ++i) hist[i] += old[i];
  }
  histogram.copy_(from_vector(hist).to(histogram.device(), kFloat32));
  min_val.fill_(new_lo);
  max_val.fill_(new_hi);
  return x;
}

double HistogramObserver::quantization_error(int64_t start, int64_t end) const {
  STRATA_CHECK(start >= 0 && start <= end && end < bins_, "[HistogramObserver] bins [{}, {}] are not a range of "
               "[0, {})", start, end, bins_);
  return l2_error(host_doubles(histogram), (max_val.item<double>() - min_val.item<double>()) / bins_, start, end);
}

double HistogramObserver::l2_error(const std::vector<double>& hist, double bin_width, int64_t start,
                                   int64_t end) const {
  const double levels = range().quant_max - range().quant_min + 1;
  const double dst = bin_width * static_cast<double>(end - start + 1) / levels;
  if (dst == 0.0) return 0.0;
  double norm = 0;
  for (int64_t b = 0; b < bins_; ++b) {
    const double density = hist[static_cast<size_t>(b)] / bin_width;
    // the source bin [begin, end) measured from the first level's start, and the levels holding its ends
    const double begin = static_cast<double>(b - start) * bin_width, finish = begin + bin_width;
    const double first = std::clamp(std::floor(begin / dst), 0.0, levels - 1);
    const double last = std::clamp(std::floor(finish / dst), 0.0, levels - 1);
    norm += l2_norm(begin - (first + 0.5) * dst, dst / 2, density);
    norm += (last - first - 1) * l2_norm(-dst / 2, dst / 2, density);
    norm += l2_norm(-dst / 2, finish - (last + 0.5) * dst, density);
  }
  return norm;
}

std::pair<double, double> HistogramObserver::search_range() const {
  const std::vector<double> hist = host_doubles(histogram);
  const double lo = min_val.item<double>(), hi = max_val.item<double>();
  const double bin_width = (hi - lo) / static_cast<double>(bins_);
  std::vector<double> cumulative(hist.size());
  double total = 0;
  for (size_t i = 0; i < hist.size(); ++i) cumulative[i] = total += hist[i];
  const double step = 1e-5;  // the quantile granularity
  double alpha = 0, beta = 1, norm_min = std::numeric_limits<double>::infinity();
  int64_t start = 0, end = bins_ - 1;
  const auto cum = [&](int64_t i) { return cumulative[static_cast<size_t>(i)]; };
  while (alpha < beta) {
    const double next_alpha = alpha + step, next_beta = beta - step;
    int64_t l = start, r = end;
    while (l < end && cum(l) < next_alpha * total) ++l;
    while (r > start && cum(r) > next_beta * total) --r;
    // move the bound that would move further
    int64_t next_start = start, next_end = end;
    if (l - start > end - r) {
      next_start = l;
      alpha = next_alpha;
    } else {
      next_end = r;
      beta = next_beta;
    }
    if (next_start == start && next_end == end) continue;
    const double norm = l2_error(hist, bin_width, next_start, next_end);
    if (norm > norm_min) break;
    norm_min = norm;
    start = next_start;
    end = next_end;
  }
  return {lo + bin_width * static_cast<double>(start), lo + bin_width * static_cast<double>(end + 1)};
}

std::pair<Tensor, Tensor> HistogramObserver::calculate_qparams() const {
  if (!observed()) return Observer::calculate_qparams();
  const auto [lo, hi] = search_range();
  return quant::calculate_qparams(full({}, lo, TensorOptions(kFloat32, min_val.device())),
                                  full({}, hi, TensorOptions(kFloat32, min_val.device())), range(),
                                  is_symmetric(options().qscheme), options().eps);
}

}  // namespace strata::quant
