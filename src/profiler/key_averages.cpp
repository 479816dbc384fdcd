// Per-name aggregates of a trace and the table PyTorch's key_averages().table() prints.
#include <algorithm>
#include <functional>
#include <map>
#include <utility>

#include <fmt/format.h>

#include <strata/core/error.hpp>
#include <strata/profiler/events.hpp>

#include "core/format_bytes.h"
#include "profiler/shapes_text.h"

namespace strata::profiler {

std::string detail::shapes_text(const std::vector<Shape>& shapes) {
  std::string s = "[";
  for (size_t i = 0; i < shapes.size(); ++i) {
    s += i ? ", [" : "[";
    for (size_t d = 0; d < shapes[i].size(); ++d) s += fmt::format("{}{}", d ? ", " : "", shapes[i][d]);
    s += "]";
  }
  return s + "]";
}

namespace {

// As PyTorch prints times: seconds, milliseconds or microseconds, three decimals.
std::string format_time(double ns) {
  const double us = ns / 1e3;
  if (us >= 1e6) return fmt::format("{:.3f}s", us / 1e6);
  if (us >= 1e3) return fmt::format("{:.3f}ms", us / 1e3);
  return fmt::format("{:.3f}us", us);
}

std::string percent(double part, double whole) { return fmt::format("{:.2f}%", whole > 0 ? 100 * part / whole : 0); }

std::string clip(const std::string& s, size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

using SortKey = std::function<double(const EventAverage&)>;

SortKey sort_key(std::string_view by) {
  static const std::map<std::string_view, SortKey> keys = {
      {"self_cpu_time_total", [](const EventAverage& r) { return double(r.self_cpu_time_total_ns); }},
      {"cpu_time_total", [](const EventAverage& r) { return double(r.cpu_time_total_ns); }},
      {"cpu_time_avg", [](const EventAverage& r) { return r.cpu_time_avg_ns(); }},
      {"self_cpu_time_avg", [](const EventAverage& r) { return r.self_cpu_time_avg_ns(); }},
      {"count", [](const EventAverage& r) { return double(r.count); }},
      {"cuda_time_total", [](const EventAverage& r) { return double(r.device_time_total_ns); }},
      {"flops", [](const EventAverage& r) { return r.flops; }},
      {"cpu_memory_usage", [](const EventAverage& r) { return double(r.allocated_bytes - r.freed_bytes); }},
      {"self_cpu_memory_usage",
       [](const EventAverage& r) { return double(r.self_allocated_bytes - r.self_freed_bytes); }},
  };
  auto it = keys.find(by);
  if (it == keys.end()) {
    std::string names;
    for (const auto& [name, key] : keys) names += (names.empty() ? "" : ", ") + std::string(name);
    strata::detail::throw_error("[profiler] table cannot sort by '{}'; sort_by is one of {}", by, names);
  }
  return it->second;
}

}  // namespace

KeyAverages key_averages(const std::vector<ProfilerEvent>& events, bool group_by_input_shape) {
  std::vector<EventAverage> rows;
  std::map<std::pair<std::string, std::string>, size_t> index;  // (name, shapes) -> row
  for (const ProfilerEvent& e : events) {
    std::string shapes = group_by_input_shape ? detail::shapes_text(e.input_shapes) : "";
    auto [it, added] = index.try_emplace({e.name, shapes}, rows.size());
    if (added) rows.push_back(EventAverage{.name = e.name, .input_shapes = std::move(shapes)});
    EventAverage& r = rows[it->second];
    ++r.count;
    r.cpu_time_total_ns += e.duration_ns();
    r.self_cpu_time_total_ns += e.self_ns;
    r.device_time_total_ns += e.device_duration_ns();
    r.flops += e.flops;
    r.allocated_bytes += e.allocated_bytes;
    r.self_allocated_bytes += e.self_allocated_bytes;
    r.freed_bytes += e.freed_bytes;
    r.self_freed_bytes += e.self_freed_bytes;
  }
  return KeyAverages(std::move(rows), group_by_input_shape);
}

const EventAverage& KeyAverages::at(std::string_view name) const {
  for (const EventAverage& r : rows_)
    if (r.name == name) return r;
  strata::detail::throw_error("[profiler] key_averages has no row named '{}'", name);
}

std::string KeyAverages::table(std::string_view sort_by, int row_limit) const {
  const SortKey key = sort_key(sort_by);
  std::vector<const EventAverage*> sorted;
  for (const EventAverage& r : rows_) sorted.push_back(&r);
  std::stable_sort(sorted.begin(), sorted.end(), [&](auto* a, auto* b) { return key(*a) > key(*b); });
  if (row_limit >= 0 && sorted.size() > size_t(row_limit)) sorted.resize(size_t(row_limit));

  double self_total = 0, device_total = 0;
  bool memory = false, flops = false;
  for (const EventAverage& r : rows_) {
    self_total += double(r.self_cpu_time_total_ns);
    device_total += double(r.device_time_total_ns);
    memory = memory || r.allocated_bytes != 0 || r.freed_bytes != 0;
    flops = flops || r.flops > 0;
  }
  const bool device = device_total > 0;

  // one column: its header and the text of each printed row
  struct Column {
    std::string header;
    std::function<std::string(const EventAverage&)> cell;
    size_t width = 12;
  };
  size_t name_width = 4;
  for (const EventAverage* r : sorted) name_width = std::max(name_width, std::min<size_t>(r->name.size(), 55));
  std::vector<Column> columns = {
      {"Name", [&](const EventAverage& r) { return clip(r.name, name_width); }, name_width},
      {"Self CPU %", [&](const EventAverage& r) { return percent(double(r.self_cpu_time_total_ns), self_total); }},
      {"Self CPU", [](const EventAverage& r) { return format_time(double(r.self_cpu_time_total_ns)); }},
      {"CPU total %", [&](const EventAverage& r) { return percent(double(r.cpu_time_total_ns), self_total); }},
      {"CPU total", [](const EventAverage& r) { return format_time(double(r.cpu_time_total_ns)); }},
      {"CPU time avg", [](const EventAverage& r) { return format_time(r.cpu_time_avg_ns()); }},
  };
  if (device) {
    columns.push_back(
        {"CUDA total", [](const EventAverage& r) { return format_time(double(r.device_time_total_ns)); }});
    columns.push_back({"CUDA time avg", [](const EventAverage& r) {
                         return format_time(r.count ? double(r.device_time_total_ns) / double(r.count) : 0);
                       }});
  }
  if (memory) {
    using strata::detail::format_bytes;
    columns.push_back({"Mem", [](const EventAverage& r) { return format_bytes(r.allocated_bytes - r.freed_bytes); }});
    columns.push_back({"Self Mem", [](const EventAverage& r) {
                         return format_bytes(r.self_allocated_bytes - r.self_freed_bytes);
                       }});
  }
  columns.push_back({"# of Calls", [](const EventAverage& r) { return std::to_string(r.count); }});
  if (by_shape_) {
    size_t w = 12;
    for (const EventAverage* r : sorted) w = std::max(w, std::min<size_t>(r->input_shapes.size(), 80));
    columns.push_back({"Input Shapes", [w](const EventAverage& r) { return clip(r.input_shapes, w); }, w});
  }
  if (flops) {
    columns.push_back({"Total GFLOPs", [](const EventAverage& r) { return fmt::format("{:.3f}", r.flops / 1e9); }});
    columns.push_back({"GFLOP/s", [](const EventAverage& r) { return fmt::format("{:.3f}", r.gflops_per_second()); }});
  }

  // Name and Input Shapes align left, numbers right, two spaces apart, as PyTorch prints them
  auto line = [&](const std::function<std::string(const Column&)>& text) {
    std::string s;
    for (size_t i = 0; i < columns.size(); ++i) {
      const Column& c = columns[i];
      const bool left = c.header == "Name" || c.header == "Input Shapes";
      s += left ? fmt::format("{:<{}}", text(c), c.width) : fmt::format("{:>{}}", text(c), c.width);
      s += i + 1 < columns.size() ? "  " : "\n";
    }
    return s;
  };
  const std::string rule = line([](const Column& c) { return std::string(c.width, '-'); });
  std::string out = rule + line([](const Column& c) { return c.header; }) + rule;
  for (const EventAverage* r : sorted) out += line([&](const Column& c) { return c.cell(*r); });
  out += rule + fmt::format("Self CPU time total: {}\n", format_time(self_total));
  if (device) out += fmt::format("CUDA time total: {}\n", format_time(device_total));
  return out;
}

}  // namespace strata::profiler
