// Chrome trace-event JSON (the "JSON Object Format" chrome://tracing and Perfetto read): one
// complete ("X") event per op or range, ts and dur in microseconds, on this process's id and
// the profiler's thread numbers; ops with device time get a second event on a process named
// after their GPU. Written through io's atomic writer, so a failed export leaves no half file.
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>

#include <fmt/format.h>

#include <strata/io/atomic_file.hpp>
#include <strata/profiler/events.hpp>

#include "io/json.h"
#include "profiler/shapes_text.h"

namespace strata::profiler {

namespace {

constexpr int64_t kDevicePidBase = 1'000'000'000;  // far above real process ids

std::string quoted(std::string_view s) {
  std::string out;
  io::json::append_string(out, s);
  return out;
}

std::string args_of(const ProfilerEvent& e) {
  std::string a = fmt::format("\"Device\": \"{}\"", e.device);
  if (!e.input_shapes.empty()) {
    a += ", \"Input Dims\": " + detail::shapes_text(e.input_shapes) + ", \"Input type\": [";
    for (size_t i = 0; i < e.input_dtypes.size(); ++i) a += (i ? ", " : "") + quoted(e.input_dtypes[i]);
    a += "]";
  }
  if (e.flops > 0) a += fmt::format(", \"FLOPs\": {:.0f}", e.flops);
  if (e.allocated_bytes || e.freed_bytes)
    a += fmt::format(", \"Allocated bytes\": {}, \"Freed bytes\": {}", e.allocated_bytes, e.freed_bytes);
  if (e.parent_id >= 0) a += fmt::format(", \"Parent id\": {}", e.parent_id);
  return fmt::format("{{\"Event id\": {}, {}}}", e.id, a);
}

void write_event(std::FILE* f, bool& first, const std::string& body) {
  std::fputs(first ? "\n  " : ",\n  ", f);
  std::fputs(body.c_str(), f);
  first = false;
}

std::string metadata(int64_t pid, std::string_view name) {
  return fmt::format("{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {}, \"tid\": 0, "
                     "\"args\": {{\"name\": {}}}}}",
                     pid, quoted(name));
}

}  // namespace

void export_chrome_trace(const std::vector<ProfilerEvent>& events, const std::string& path) {
  const int64_t pid = ::getpid();
  io::write_file_atomically(path, [&](std::FILE* f) {
    std::fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [", f);
    bool first = true;
    write_event(f, first, metadata(pid, "strata (CPU)"));
    std::set<int> devices;
    for (const ProfilerEvent& e : events) {
      const char* cat = e.kind == EventKind::Op ? "cpu_op" : "user_annotation";
      write_event(f, first, fmt::format("{{\"ph\": \"X\", \"cat\": \"{}\", \"name\": {}, \"pid\": {}, \"tid\": {}, "
                                        "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {}}}",
                                        cat, quoted(e.name), pid, e.thread_id, double(e.start_ns) / 1e3,
                                        double(e.duration_ns()) / 1e3, args_of(e)));
      if (!e.has_device_time()) continue;
      devices.insert(e.device.index);
      write_event(f, first, fmt::format("{{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": {}, \"pid\": {}, \"tid\": 0, "
                                        "\"ts\": {:.3f}, \"dur\": {:.3f}, \"args\": {{\"Event id\": {}}}}}",
                                        quoted(e.name), kDevicePidBase + e.device.index,
                                        double(e.device_start_ns) / 1e3, double(e.device_duration_ns()) / 1e3, e.id));
    }
    for (int d : devices) write_event(f, first, metadata(kDevicePidBase + d, fmt::format("cuda:{}", d)));
    std::fputs("\n]}\n", f);
  });
}

}  // namespace strata::profiler
