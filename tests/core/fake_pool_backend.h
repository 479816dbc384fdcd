// A fake device for the block pool tests (test_block_pool.cpp, test_block_pool_graph.cpp):
// real host memory for segments, events whose completion the test decides.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "core/block_pool.h"

namespace strata_test {

using strata::detail::PoolBackend;
using strata::detail::StreamId;

class FakeBackend final : public PoolBackend {
 public:
  size_t capacity = size_t(1) << 30;  // bytes the fake device holds
  size_t in_use = 0;
  int raw_allocs = 0, raw_frees = 0, failed_allocs = 0;
  std::map<void*, size_t> segments;
  struct Ev {
    StreamId stream;
    bool done;
  };
  std::map<int, Ev> events;
  int next_event = 1;
  StreamId unrecordable = ~StreamId(0);  // record_event on this stream fails: the backend waits

  void* raw_alloc(size_t n) override {
    if (in_use + n > capacity) {
      ++failed_allocs;
      return nullptr;
    }
    void* p = std::aligned_alloc(512, n);
    segments[p] = n;
    in_use += n;
    ++raw_allocs;
    return p;
  }
  void raw_free(void* p, size_t n) override {
    EXPECT_EQ(segments.at(p), n);
    segments.erase(p);
    in_use -= n;
    ++raw_frees;
    std::free(p);
  }
  void* record_event(StreamId s) override {
    if (s == unrecordable) return nullptr;
    events[next_event] = {s, false};
    return reinterpret_cast<void*>(static_cast<uintptr_t>(next_event++));
  }
  bool event_done(void* e) override { return events.at(id(e)).done; }
  void synchronize_event(void* e) override { events.at(id(e)).done = true; }
  void release_event(void* e) override { events.erase(id(e)); }
  std::string oom_detail() override { return "fake device full"; }

  void complete(StreamId s) {  // the stream's queued work finishes
    for (auto& [k, e] : events)
      if (e.stream == s) e.done = true;
  }
  static int id(void* e) { return static_cast<int>(reinterpret_cast<uintptr_t>(e)); }
};

constexpr size_t KiB = 1024, MiB = 1024 * 1024;
constexpr StreamId kS0 = 0, kS1 = 0x1000, kS2 = 0x2000;

inline char* as_char(void* p) { return static_cast<char*>(p); }

}  // namespace strata_test
