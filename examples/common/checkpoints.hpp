// What the examples share about training checkpoints (strata::io::save_checkpoint): one line
// printed per save and per resume, and trimming a metrics CSV back to the resumed step (a run
// stopped after its last checkpoint has logged steps the resumed run will log again).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <strata/strata.hpp>

namespace example {

namespace st = strata;

inline void save_checkpoint(const std::string& path, const st::io::TrainingState& state,
                            const st::io::Checkpoint& progress) {
  st::io::save_checkpoint(path, state, progress);
  std::printf("checkpoint: saved step %lld to %s\n", (long long)progress.step, path.c_str());
  std::fflush(stdout);
}

// Restores `state` from `path` and returns where the run was; `who` names the program in errors.
inline st::io::Checkpoint resume(const std::string& path, st::io::TrainingState& state, const char* who) {
  STRATA_CHECK(std::filesystem::exists(path), "[{}] --resume: no checkpoint at {}", who, path);
  st::io::Checkpoint progress = st::io::load_checkpoint(path, state);
  std::printf("checkpoint: resumed from %s at step %lld\n", path.c_str(), (long long)progress.step);
  return progress;
}

// Keeps `header` and the rows of steps up to `step` (rows start with their step number).
inline void trim_metrics(const std::string& path, int64_t step, const std::string& header, const char* who) {
  std::vector<std::string> keep;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    char* end = nullptr;
    long long row = std::strtoll(line.c_str(), &end, 10);
    if (keep.empty() || (end != line.c_str() && *end == ',' && row <= step)) keep.push_back(line);
  }
  in.close();
  if (keep.empty()) keep.push_back(header);  // no file yet
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : keep) out << l << '\n';
  STRATA_CHECK(out.good(), "[{}] cannot write the metrics file {}", who, path);
}

}  // namespace example
