// LoaderState to and from integer key/value metadata.
#include <strata/data/loader_state.hpp>

#include <cstring>

#include <strata/core/error.hpp>

namespace strata::data {

std::map<std::string, int64_t> LoaderState::to_map() const {
  int64_t seed_bits = 0;
  std::memcpy(&seed_bits, &seed, sizeof seed_bits);
  return {{"epoch", epoch}, {"batches", batches}, {"seed", seed_bits}};
}

LoaderState LoaderState::from_map(const std::map<std::string, int64_t>& map) {
  auto get = [&](const char* key) {
    auto it = map.find(key);
    STRATA_CHECK(it != map.end(), "[LoaderState] the map has no \"{}\" key", key);
    return it->second;
  };
  LoaderState state;
  state.epoch = get("epoch");
  state.batches = get("batches");
  int64_t seed_bits = get("seed");
  std::memcpy(&state.seed, &seed_bits, sizeof seed_bits);
  STRATA_CHECK(state.epoch >= 0, "[LoaderState] negative epoch {}", state.epoch);
  STRATA_CHECK(state.batches >= 0, "[LoaderState] negative batch count {}", state.batches);
  return state;
}

}  // namespace strata::data
