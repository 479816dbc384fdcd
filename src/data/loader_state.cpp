// LoaderState to and from integer key/value metadata.
#include <strata/data/loader_state.hpp>

#include <cstring>

#include <strata/core/error.hpp>

namespace strata::data {

std::map<std::string, int64_t> LoaderState::to_map() const {
  int64_t seed_bits = 0;
  std::memcpy(&seed_bits, &seed, sizeof seed_bits);
  std::map<std::string, int64_t> map{{"epoch", epoch}, {"batches", batches}, {"seed", seed_bits}};
  if (dataset_size) map["dataset_size"] = *dataset_size;
  if (samples) map["samples"] = *samples;
  if (batch_size) map["batch_size"] = *batch_size;
  if (shuffle) map["shuffle"] = *shuffle;
  if (drop_last) map["drop_last"] = *drop_last;
  return map;
}

LoaderState LoaderState::from_map(const std::map<std::string, int64_t>& map) {
  auto get = [&](const char* key) {
    auto it = map.find(key);
    STRATA_CHECK(it != map.end(), "[LoaderState] the map has no \"{}\" key", key);
    return it->second;
  };
  // The keys added after the first checkpoints were written: absent means unknown.
  auto find = [&](const char* key, int64_t min, int64_t max) -> std::optional<int64_t> {
    auto it = map.find(key);
    if (it == map.end()) return std::nullopt;
    STRATA_CHECK(it->second >= min && it->second <= max, "[LoaderState] \"{}\" is {}, outside [{}, {}]", key,
                 it->second, min, max);
    return it->second;
  };
  auto flag = [&](const char* key) -> std::optional<bool> {
    if (auto v = find(key, 0, 1)) return *v != 0;
    return std::nullopt;
  };
  LoaderState state;
  state.epoch = get("epoch");
  state.batches = get("batches");
  int64_t seed_bits = get("seed");
  std::memcpy(&state.seed, &seed_bits, sizeof seed_bits);
  STRATA_CHECK(state.epoch >= 0, "[LoaderState] negative epoch {}", state.epoch);
  STRATA_CHECK(state.batches >= 0, "[LoaderState] negative batch count {}", state.batches);
  state.dataset_size = find("dataset_size", 0, INT64_MAX);
  state.samples = find("samples", 0, INT64_MAX);
  state.batch_size = find("batch_size", 1, INT64_MAX);
  state.shuffle = flag("shuffle");
  state.drop_last = flag("drop_last");
  return state;
}

}  // namespace strata::data
