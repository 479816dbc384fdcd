// How the loops that poll a communication for completion (a send's or receive's wait, NCCL's)
// pause between polls: they spin (yielding) for a while after the last progress, as a blocking
// MPI call would, so a normal operation completes with no added latency (MPI's nonblocking
// operations move data only while polled: a sleep in the middle of a large one slows it); past
// that a rank is likely late, and they sleep, longer each time up to a bound, so waiting for a
// late or missing rank does not burn a core.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace strata::dist::detail {

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Backoff(std::chrono::microseconds longest = std::chrono::microseconds(500)) : longest_(longest) {}
  /// Called on progress: spin again.
  void reset() {
    spinning_since_ = Clock::now();
    sleep_ = std::chrono::microseconds(0);
  }
  /// The pause to make now: zero (yield) while spinning, then growing sleeps.
  std::chrono::microseconds next() {
    if (Clock::now() - spinning_since_ < kSpin) return std::chrono::microseconds(0);
    sleep_ = std::min(longest_, std::max(std::chrono::microseconds(20), sleep_ * 2));
    return sleep_;
  }
  /// Pauses as next() says, never past `deadline`.
  void pause(Clock::time_point deadline) {
    const auto pause = next();
    if (pause.count() == 0) std::this_thread::yield();
    else std::this_thread::sleep_until(std::min(deadline, Clock::now() + pause));
  }

 private:
  static constexpr std::chrono::milliseconds kSpin{50};
  std::chrono::microseconds longest_;
  Clock::time_point spinning_since_ = Clock::now();
  std::chrono::microseconds sleep_{0};
};

}  // namespace strata::dist::detail
