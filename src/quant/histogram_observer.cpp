// HistogramObserver and PerChannelHistogramObserver (include/strata/quant/observer.hpp), PyTorch's
// algorithm in float64 on the host, once per channel for the latter: histc of each batch over the
// running range, re-binning of the old histogram when the range grows (_combine_histograms,
// _upscale_histogram), and the greedy search for the range of whole bins with the least L2
// quantization error (_non_linear_param_search, _compute_quantization_error).
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

// Folds `values` into one histogram of hist.size() bins over [*lo, *hi] (observed when *lo <= *hi):
// histc of the batch over the grown range, the old counts re-binned into it. No finite value: no change.
void observe(std::vector<double>& hist, double* lo, double* hi, const std::vector<double>& values) {
  const auto bins = static_cast<int64_t>(hist.size());
  // the finite range here (finite_aminmax gives a batch without finite values [0, 0], which would
  // widen the range to 0)
  double b_lo = std::numeric_limits<double>::infinity(), b_hi = -b_lo;
  for (double v : values)
    if (std::isfinite(v)) {
      b_lo = std::min(b_lo, v);
      b_hi = std::max(b_hi, v);
    }
  if (b_lo > b_hi) return;  // no finite value (or none at all), as PyTorch skips an empty batch
  if (!(*lo <= *hi)) {
    hist = histc(values, bins, b_lo, b_hi);
    *lo = b_lo;
    *hi = b_hi;
    return;
  }
  const double new_lo = std::min(*lo, b_lo), new_hi = std::max(*hi, b_hi);
  std::vector<double> old = std::move(hist);
  hist = histc(values, bins, new_lo, new_hi);
  if (*lo == *hi) {  // every earlier value was lo: its mass goes to lo's new bin
    double mass = 0;
    for (double c : old) mass += c;
    old = histc({*lo}, bins, new_lo, new_hi);
    for (double& c : old) c *= mass;
  } else if (new_lo != *lo || new_hi != *hi) {
    old = upscale(old, *lo, *hi, new_lo, new_hi);
  }
  for (size_t i = 0; i < hist.size(); ++i) hist[i] += old[i];
  *lo = new_lo;
  *hi = new_hi;
}

// The L2 error of quantizing hist (bins of bin_width) to `levels` levels over bins [start, end].
double l2_error(const std::vector<double>& hist, double bin_width, int64_t start, int64_t end, double levels) {
  const double dst = bin_width * static_cast<double>(end - start + 1) / levels;
  if (dst == 0.0) return 0.0;
  double norm = 0;
  for (size_t b = 0; b < hist.size(); ++b) {
    const double density = hist[b] / bin_width;
    // the source bin [begin, end) measured from the first level's start, and the levels holding its ends
    const double begin = (static_cast<double>(b) - static_cast<double>(start)) * bin_width, finish = begin + bin_width;
    const double first = std::clamp(std::floor(begin / dst), 0.0, levels - 1);
    const double last = std::clamp(std::floor(finish / dst), 0.0, levels - 1);
    norm += l2_norm(begin - (first + 0.5) * dst, dst / 2, density);
    norm += (last - first - 1) * l2_norm(-dst / 2, dst / 2, density);
    norm += l2_norm(-dst / 2, finish - (last + 0.5) * dst, density);
  }
  return norm;
}

// PyTorch's _non_linear_param_search on hist over [lo, hi]: the range of whole bins it settles on.
std::pair<double, double> search(const std::vector<double>& hist, double lo, double hi, double levels) {
  const auto bins = static_cast<int64_t>(hist.size());
  const double bin_width = (hi - lo) / static_cast<double>(bins);
  std::vector<double> cumulative(hist.size());
  double total = 0;
  for (size_t i = 0; i < hist.size(); ++i) cumulative[i] = total += hist[i];
  const double step = 1e-5;  // the quantile granularity
  double alpha = 0, beta = 1, norm_min = std::numeric_limits<double>::infinity();
  int64_t start = 0, end = bins - 1;
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
    const double norm = l2_error(hist, bin_width, next_start, next_end, levels);
    if (norm > norm_min) break;
    norm_min = norm;
    start = next_start;
    end = next_end;
  }
  return {lo + bin_width * static_cast<double>(start), lo + bin_width * static_cast<double>(end + 1)};
}

double levels_of(QRange r) { return static_cast<double>(r.quant_max - r.quant_min + 1); }

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
  std::vector<double> hist = host_doubles(histogram);
  double lo = min_val.item<double>(), hi = max_val.item<double>();
  observe(hist, &lo, &hi, host_doubles(x));
  histogram.copy_(from_vector(hist).to(histogram.device(), kFloat32));
  min_val.fill_(lo);
  max_val.fill_(hi);
  return x;
}

double HistogramObserver::quantization_error(int64_t start, int64_t end) const {
  STRATA_CHECK(start >= 0 && start <= end && end < bins_, "[HistogramObserver] bins [{}, {}] are not a range of "
               "[0, {})", start, end, bins_);
  return l2_error(host_doubles(histogram), (max_val.item<double>() - min_val.item<double>()) / bins_, start, end,
                  levels_of(range()));
}

std::pair<double, double> HistogramObserver::search_range() const {
  return search(host_doubles(histogram), min_val.item<double>(), max_val.item<double>(), levels_of(range()));
}

std::pair<Tensor, Tensor> HistogramObserver::calculate_qparams() const {
  if (!observed()) return Observer::calculate_qparams();
  const auto [lo, hi] = search_range();
  return quant::calculate_qparams(full({}, lo, TensorOptions(kFloat32, min_val.device())),
                                  full({}, hi, TensorOptions(kFloat32, min_val.device())), range(),
                                  is_symmetric(options().qscheme), options().eps);
}

PerChannelHistogramObserver::PerChannelHistogramObserver(ObserverOptions options, int64_t num_channels, int64_t bins)
    : Observer(std::move(options), true, num_channels), bins_(bins) {
  STRATA_CHECK(bins >= 1, "[PerChannelHistogramObserver] bins must be positive, got {}", bins);
  histogram = register_buffer("histogram", zeros({num_channels, bins}));
}

void PerChannelHistogramObserver::update(const Tensor&, const Tensor&) {
  throw Error("[PerChannelHistogramObserver] internal: update is not used (forward keeps the histograms)");
}

Tensor PerChannelHistogramObserver::forward(const Tensor& x) {
  const int64_t axis = checked_axis(x);
  NoGradGuard no_grad;
  const int64_t C = x.size(axis);
  if (min_val.numel() != C) {
    STRATA_CHECK(min_val.numel() == 0, "[{}] observed {} channels, then an input of shape {} with {} along ch_axis "
                 "{}", name(), min_val.numel(), x.shape(), C, axis);
    const TensorOptions o(min_val.device());
    set_tensor("min_val", full({C}, std::numeric_limits<float>::infinity(), o));
    set_tensor("max_val", full({C}, -std::numeric_limits<float>::infinity(), o));
    set_tensor("histogram", zeros({C, bins_}, o));
  }
  if (C == 0) return x;
  const std::vector<double> values = host_doubles(x.transpose(0, axis).reshape({C, -1}));
  std::vector<double> hists = host_doubles(histogram), lo = host_doubles(min_val), hi = host_doubles(max_val);
  const auto per = static_cast<ptrdiff_t>(values.size()) / C, bins = static_cast<ptrdiff_t>(bins_);
  for (ptrdiff_t c = 0; c < C; ++c) {
    std::vector<double> h(hists.begin() + c * bins, hists.begin() + (c + 1) * bins);
    observe(h, &lo[size_t(c)], &hi[size_t(c)],
            std::vector<double>(values.begin() + c * per, values.begin() + (c + 1) * per));
    std::copy(h.begin(), h.end(), hists.begin() + c * bins);
  }
  histogram.copy_(from_vector(hists, Shape{C, bins_}).to(histogram.device(), kFloat32));
  min_val.copy_(from_vector(lo).to(min_val.device(), kFloat32));
  max_val.copy_(from_vector(hi).to(max_val.device(), kFloat32));
  return x;
}

std::vector<std::pair<double, double>> PerChannelHistogramObserver::search_ranges() const {
  const std::vector<double> hists = host_doubles(histogram), lo = host_doubles(min_val), hi = host_doubles(max_val);
  const auto bins = static_cast<ptrdiff_t>(bins_);
  std::vector<std::pair<double, double>> out;
  for (size_t c = 0; c < lo.size(); ++c) {
    if (!(lo[c] <= hi[c])) {  // never observed
      out.emplace_back(lo[c], hi[c]);
      continue;
    }
    const auto first = hists.begin() + static_cast<ptrdiff_t>(c) * bins;
    out.push_back(search(std::vector<double>(first, first + bins), lo[c], hi[c], levels_of(range())));
  }
  return out;
}

std::pair<Tensor, Tensor> PerChannelHistogramObserver::calculate_qparams() const {
  if (min_val.numel() == 0) return Observer::calculate_qparams();
  std::vector<double> lo, hi;
  for (const auto& [l, h] : search_ranges()) {
    lo.push_back(l);
    hi.push_back(h);
  }
  const Device d = min_val.device();
  return quant::calculate_qparams(from_vector(lo).to(d, kFloat32), from_vector(hi).to(d, kFloat32), range(),
                                  is_symmetric(options().qscheme), options().eps);
}

}  // namespace strata::quant
