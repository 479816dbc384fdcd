// What the examples share about training checkpoints (strata::io::save_checkpoint): one line
// printed per save and per resume, trimming a metrics CSV back to the resumed step (a run
// stopped after its last checkpoint has logged steps the resumed run will log again), and the
// metrics CSV itself, opened only when its first row is written.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
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

// The learning-rate schedule's entries of a run's checkpoint config (a resume with another
// schedule would mix two), spelled the same by every example.
inline std::map<std::string, std::string> schedule_config(int64_t steps, int64_t warmup, double lr, double min_lr) {
  return {{"steps", std::to_string(steps)},
          {"warmup", std::to_string(warmup)},
          {"lr", fmt::format("{}", lr)},
          {"min_lr", fmt::format("{}", min_lr)}};
}

// Restores `state` from `path` and returns where the run was; `who` names the program in errors.
inline st::io::Checkpoint resume(const std::string& path, st::io::TrainingState& state, const char* who) {
  STRATA_CHECK(std::filesystem::exists(path), "[{}] --resume: no checkpoint at {}", who, path);
  st::io::Checkpoint progress = st::io::load_checkpoint(path, state);
  std::printf("checkpoint: resumed from %s at step %lld\n", path.c_str(), (long long)progress.step);
  return progress;
}

// Keeps `header` and the rows of steps up to `step` (rows start with their step number),
// replacing the file atomically: a crash or a full disk leaves the old rows, never none.
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
  try {
    st::io::write_file_atomically(path, [&](std::FILE* f) {
      for (const auto& l : keep) std::fprintf(f, "%s\n", l.c_str());
    });
  } catch (const st::Error& e) {
    throw st::Error(fmt::format("[{}] cannot write the metrics file {}: {}", who, path, e.what()));
  }
}

// A metrics CSV opened at its first row, so that a run failing before its first step leaves an
// existing file as it was; a resumed run (start > 0) keeps the rows up to `start` and appends.
class MetricsCsv {
 public:
  MetricsCsv(std::string path, std::string header, int64_t start, const char* who)
      : path_(std::move(path)), header_(std::move(header)), start_(start), who_(who) {}
  std::ofstream& row() {
    if (!out_.is_open()) open();
    return out_;
  }
  // Raises when a row could not be written (a full disk), naming the file.
  void flush() {
    if (!out_.is_open()) return;
    out_.flush();
    STRATA_CHECK(out_.good(), "[{}] writing the metrics file {} (--metrics) failed: {}", who_, path_,
                 std::strerror(errno));
  }

 private:
  void open() {
    if (start_ > 0) {
      trim_metrics(path_, start_, header_, who_);
      out_.open(path_, std::ios::app);
    } else {
      out_.open(path_);
      out_ << header_ << '\n';
    }
    STRATA_CHECK(out_.good(), "[{}] cannot write the metrics file {}", who_, path_);
  }
  std::string path_, header_;
  int64_t start_;
  const char* who_;
  std::ofstream out_;
};

}  // namespace example
