// Where a strata training step spends its time, op by op: an OpObserver (the profiler's hook
// around every kernel) that adds up wall time per op and input shapes, for bench_train's
// --ops flag. Nested kernels (an op whose kernel runs others) count in both.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <strata/strata.hpp>

namespace bench {

class OpTimes final : public strata::OpObserver {
 public:
  OpTimes() { strata::set_op_observer(this); }
  ~OpTimes() override { strata::set_op_observer(nullptr); }
  OpTimes(const OpTimes&) = delete;
  OpTimes& operator=(const OpTimes&) = delete;

  void on_begin(strata::OpId, const strata::KernelCall&) override { starts_.push_back(Clock::now()); }
  void on_end(strata::OpId op, const strata::KernelCall& call) override {
    const double s = std::chrono::duration<double>(Clock::now() - starts_.back()).count();
    starts_.pop_back();
    std::string key(strata::op_name(op));
    for (const strata::Tensor& t : call.inputs) key += " " + shape(t);
    Entry& e = by_key_[key];
    e.seconds += s, ++e.calls;
    Entry& o = by_op_[std::string(strata::op_name(op))];
    o.seconds += s, ++o.calls;
  }

  // The `top` most costly ops, then op-with-shapes rows, in ms per step.
  void print(int steps, double step_seconds, int top) const {
    auto rows = [&](const std::map<std::string, Entry>& m, const char* what) {
      std::vector<std::pair<std::string, Entry>> v(m.begin(), m.end());
      std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
      std::printf("  strata kernels by %s (ms per step; step %.1f ms):\n", what, 1e3 * step_seconds / steps);
      for (int i = 0; i < std::min<int>(top, static_cast<int>(v.size())); ++i)
        std::printf("    %8.1f ms %5.1f%%  %4lld calls  %s\n", 1e3 * v[i].second.seconds / steps,
                    100 * v[i].second.seconds / step_seconds, (long long)(v[i].second.calls / steps),
                    v[i].first.c_str());
    };
    rows(by_op_, "op");
    rows(by_key_, "op and input shapes");
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    double seconds = 0;
    int64_t calls = 0;
  };
  static std::string shape(const strata::Tensor& t) {
    if (!t.defined()) return "-";
    std::string s = "(";
    for (int64_t d = 0; d < t.dim(); ++d) s += (d ? "," : "") + std::to_string(t.size(d));
    return s + (t.is_contiguous() ? ")" : ")nc");
  }
  std::vector<Clock::time_point> starts_;
  std::map<std::string, Entry> by_key_, by_op_;
};

}  // namespace bench
