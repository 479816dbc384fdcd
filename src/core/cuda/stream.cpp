// Streams, the per-thread current stream, StreamGuard and events.
//
// Note [Stream pool]: user streams are never destroyed. Each device has, per priority
// level, a fixed pool of kStreamsPerPool non-blocking streams created on first use, and
// Stream::create hands them out round-robin (PyTorch does the same). A Stream is then a
// plain value that cannot dangle, and the caching allocator, which keys its free lists by
// stream handle, never sees a handle reused by an unrelated stream.
#include <array>
#include <atomic>
#include <mutex>
#include <utility>

#include <strata/core/cuda.hpp>

#include "core/cuda/capture.h"
#include "core/cuda/check.h"
#include "core/cuda/internal.h"
#include "core/cuda/stream.h"

namespace strata::cuda {

namespace {

constexpr int kStreamsPerPool = 32;

// The calling thread's current stream per device; nullptr (zero-initialised) is the default
// stream.
thread_local std::array<cudaStream_t, kMaxDevices> tls_current{};

struct StreamPool {
  std::once_flag once;
  std::array<cudaStream_t, kStreamsPerPool> normal{};
  std::array<cudaStream_t, kStreamsPerPool> high{};
  std::atomic<unsigned> next_normal{0}, next_high{0};
};

StreamPool& pool_for(int device) {
  static std::array<StreamPool, kMaxDevices> pools;
  StreamPool& p = pools[device];
  std::call_once(p.once, [&] {
    DeviceGuard guard(device);
    int least = 0, greatest = 0;  // numerically least = lowest priority; greatest is negative
    STRATA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "Stream::create");
    try {
      for (int i = 0; i < kStreamsPerPool; ++i) {
        STRATA_CUDA_CHECK(cudaStreamCreateWithPriority(&p.normal[i], cudaStreamNonBlocking, least), "Stream::create");
        STRATA_CUDA_CHECK(cudaStreamCreateWithPriority(&p.high[i], cudaStreamNonBlocking, greatest), "Stream::create");
      }
    } catch (const Error&) {  // call_once runs again next time: the streams made so far are not leaked
      for (auto* streams : {&p.normal, &p.high})
        for (cudaStream_t& s : *streams)
          if (s) cudaStreamDestroy(std::exchange(s, nullptr));
      throw;
    }
  });
  return p;
}

cudaStream_t raw(const Stream& s) { return static_cast<cudaStream_t>(s.handle()); }

}  // namespace

cudaStream_t current_stream(int device) {
  STRATA_CHECK(device >= 0 && device < kMaxDevices, "[current_stream] bad CUDA device index {}", device);
  return tls_current[device];
}

Stream Stream::default_stream(int device) { return Stream(resolve_device(device, "default_stream"), nullptr); }

Stream Stream::current(int device) {
  device = resolve_device(device, "current_stream");
  return Stream(device, tls_current[device]);
}

Stream Stream::create(int device, int priority) {
  device = resolve_device(device, "Stream::create");
  StreamPool& p = pool_for(device);
  if (priority < 0) return Stream(device, p.high[p.next_high++ % kStreamsPerPool]);
  return Stream(device, p.normal[p.next_normal++ % kStreamsPerPool]);
}

int Stream::priority() const {
  if (is_default()) return 0;
  int prio = 0;
  STRATA_CUDA_CHECK(cudaStreamGetPriority(raw(*this), &prio), "Stream::priority");
  return prio;
}

bool Stream::query() const {
  DeviceGuard guard(device_);
  check_not_capturing(raw(*this), "Stream::query", "a query of the capturing stream", "its work is not running");
  cudaError_t err = cudaStreamQuery(raw(*this));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  STRATA_CUDA_CHECK(err, "Stream::query");
  return true;
}

void Stream::synchronize() const {
  DeviceGuard guard(device_);
  check_not_capturing(raw(*this), "Stream::synchronize", "waiting for the capturing stream",
                      "synchronize before the capture or after capture_end");
  STRATA_CUDA_CHECK(cudaStreamSynchronize(raw(*this)), "Stream::synchronize");
}

void Stream::wait(const Event& event) const {
  if (!event.is_recorded()) return;
  DeviceGuard guard(device_);
  STRATA_CUDA_CHECK(cudaStreamWaitEvent(raw(*this), static_cast<cudaEvent_t>(event.handle()), 0), "Stream::wait");
}

StreamGuard::StreamGuard(const Stream& stream)
    : previous_(Stream::current(stream.device())), previous_device_(current_device()) {
  if (previous_device_ != stream.device()) STRATA_CUDA_CHECK(cudaSetDevice(stream.device()), "StreamGuard");
  tls_current[stream.device()] = raw(stream);
}

StreamGuard::~StreamGuard() {
  tls_current[previous_.device()] = raw(previous_);
  STRATA_CUDA_WARN(cudaSetDevice(previous_device_), "StreamGuard");
}

// ---- events --------------------------------------------------------------------------

struct Event::Impl {
  bool timing = false;
  int device = -1;
  cudaEvent_t event = nullptr;
  ~Impl() {
    if (event) STRATA_CUDA_WARN(cudaEventDestroy(event), "Event");
  }
};

Event::Event(bool enable_timing) : impl_(std::make_shared<Impl>()) { impl_->timing = enable_timing; }

void Event::record() { record(Stream::current()); }

void Event::record(const Stream& stream) {
  DeviceGuard guard(stream.device());
  if (!impl_->event) {
    unsigned flags = impl_->timing ? cudaEventDefault : cudaEventDisableTiming;
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->event, flags), "Event::record");
    impl_->device = stream.device();
  }
  STRATA_CHECK(impl_->device == stream.device(), "[Event::record] event of cuda:{} recorded on a stream of cuda:{}",
               impl_->device, stream.device());
  STRATA_CUDA_CHECK(cudaEventRecord(impl_->event, raw(stream)), "Event::record");
}

bool Event::is_recorded() const { return impl_->event != nullptr; }
void* Event::handle() const { return impl_->event; }

bool Event::query() const {
  if (!impl_->event) return true;
  STRATA_CHECK(!this_thread_capturing(), "[Event::query] an event query cannot run while this thread captures a "
               "CUDA graph: query after capture_end");
  cudaError_t err = cudaEventQuery(impl_->event);
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  STRATA_CUDA_CHECK(err, "Event::query");
  return true;
}

void Event::synchronize() const {
  STRATA_CHECK(!impl_->event || !this_thread_capturing(), "[Event::synchronize] waiting for an event cannot be "
               "captured in a CUDA graph: wait after capture_end (Stream::wait orders streams inside a capture)");
  if (impl_->event) STRATA_CUDA_CHECK(cudaEventSynchronize(impl_->event), "Event::synchronize");
}

float Event::elapsed_time(const Event& end) const {
  STRATA_CHECK(impl_->timing && end.impl_->timing, "[Event::elapsed_time] both events need enable_timing=true");
  STRATA_CHECK(impl_->event && end.impl_->event, "[Event::elapsed_time] both events must be recorded first");
  float ms = 0;
  STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->event, end.impl_->event), "Event::elapsed_time");
  return ms;
}

}  // namespace strata::cuda

namespace strata::cuda {

// Runs on deallocation, often from a destructor, so it cannot raise: when no event can be
// recorded it reports why on stderr, waits for the stream instead and returns nullptr (the
// buffer is free to reuse at once).
void* record_free_event(int device, uintptr_t stream, const char* op) noexcept {
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  try {
    DeviceGuard guard(device);
    cudaEvent_t ev = nullptr;
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err == cudaSuccess) {
      err = cudaEventRecord(ev, s);
      if (err == cudaSuccess) return ev;
      cudaEventDestroy(ev);
    }
    fmt::print(stderr, "[{}] recording a free event failed ({}): waiting for the stream instead\n", op,
               cudaGetErrorString(err));
    STRATA_CUDA_WARN(cudaStreamSynchronize(s), op);
  } catch (const std::exception& e) {
    fmt::print(stderr, "[{}] recording a free event failed: {}\n", op, e.what());
  }
  return nullptr;
}

bool free_event_done(void* event, const char* op) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: clear it
    return false;
  }
  STRATA_CUDA_CHECK(err, op);
  return true;
}

void synchronize_free_event(void* event, const char* op) {
  STRATA_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)), op);
}

void release_free_event(void* event, const char* op) {
  STRATA_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)), op);
}

}  // namespace strata::cuda
