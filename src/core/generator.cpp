// Generator state: (seed, offset) under a mutex, so concurrent draws get disjoint counters.
#include <strata/core/generator.hpp>

namespace strata {

Generator::Generator(const Generator& other) {
  std::lock_guard<std::mutex> lock(other.mutex_);
  seed_ = other.seed_;
  offset_ = other.offset_;
}

Generator& Generator::operator=(const Generator& other) {
  if (this == &other) return *this;
  uint64_t s, o;
  {
    std::lock_guard<std::mutex> lock(other.mutex_);
    s = other.seed_;
    o = other.offset_;
  }
  set_state(s, o);
  return *this;
}

void Generator::manual_seed(uint64_t seed) { set_state(seed, 0); }

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return offset_;
}

void Generator::set_state(uint64_t seed, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = offset;
}

uint64_t Generator::reserve(uint64_t blocks) { return reserve_draw(blocks).offset; }

RandomDraw Generator::reserve_draw(uint64_t blocks) {
  std::lock_guard<std::mutex> lock(mutex_);
  const RandomDraw draw{seed_, offset_};
  offset_ += blocks;
  return draw;
}

RandomDraw Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {seed_, offset_};
}

Generator& default_generator() {
  static Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace strata
