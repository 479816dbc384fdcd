// Checkpoints of the example's training run (strata::io::save_checkpoint): what goes in, one
// line printed per save and resume, and trimming the metrics CSV back to the resumed step.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "gpt.hpp"

namespace checkpointing {

namespace st = strata;

// The model's shape as strings; a checkpoint saved with another one is refused, naming the
// keys that differ.
inline std::map<std::string, std::string> model_config(const gpt::Config& c) {
  return {{"layers", std::to_string(c.layers)}, {"width", std::to_string(c.width)},
          {"heads", std::to_string(c.heads)},   {"context", std::to_string(c.context)},
          {"dropout", fmt::format("{}", c.dropout)}, {"vocab", std::to_string(c.vocab)}};
}

inline void save(const std::string& path, const st::io::TrainingState& state, int64_t step) {
  st::io::save_checkpoint(path, state, {.step = step});
  std::printf("checkpoint: saved step %lld to %s\n", (long long)step, path.c_str());
  std::fflush(stdout);
}

// Restores `state` from `path` and returns the step to continue from.
inline int64_t resume(const std::string& path, st::io::TrainingState& state) {
  STRATA_CHECK(std::filesystem::exists(path), "[transformer] --resume: no checkpoint at {}", path);
  int64_t step = st::io::load_checkpoint(path, state).step;
  std::printf("checkpoint: resumed from %s at step %lld\n", path.c_str(), (long long)step);
  return step;
}

// Keeps the header and the rows of steps up to `step` in the metrics CSV (a run stopped after
// its last checkpoint has logged steps the resumed run will log again).
inline void trim_metrics(const std::string& path, int64_t step) {
  std::vector<std::string> keep;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    char* end = nullptr;
    long long row = std::strtoll(line.c_str(), &end, 10);
    if (keep.empty() || (end != line.c_str() && *end == ',' && row <= step)) keep.push_back(line);
  }
  in.close();
  if (keep.empty()) keep.push_back("step,loss,lr,tokens_per_s,val_loss");  // no file yet
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : keep) out << l << '\n';
  STRATA_CHECK(out.good(), "[transformer] cannot write the metrics file {}", path);
}

}  // namespace checkpointing
