// Checks the examples make before they train, so that a bad option is refused at once, naming
// it, rather than crashing, failing after all the training, or overwriting a file: option
// values, --threads, the output paths (each in an existing folder, not a folder itself, none
// naming an input or another output), and the training loss of each step (a non-finite loss
// stops the run before anything more is saved).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <strata/strata.hpp>

#include "../../tools/same_file.hpp"

namespace example {

namespace st = strata;

// Refuses `value` of `option` unless `ok`; `what` says what is allowed ("finite and > 0").
template <class T>
void require(const char* who, const char* option, T value, bool ok, const char* what) {
  STRATA_CHECK(ok, "[{}] {} must be {}, got {}", who, option, what, value);
}

inline bool finite_at_least(double v, double lo) { return std::isfinite(v) && v >= lo; }

// --threads: 0 uses every core; more than kMaxThreads is refused (libgomp crashes on huge counts).
inline constexpr int kMaxThreads = 1024;
inline void set_threads(const char* who, int threads) {
  const std::string allowed = fmt::format("in 0..{} (0: all cores)", kMaxThreads);
  require(who, "--threads", threads, threads >= 0 && threads <= kMaxThreads, allowed.c_str());
  if (threads > 0) st::set_num_threads(threads);
}

// An option naming a file, e.g. {"--metrics", "m.csv"}.
using NamedPath = std::pair<const char*, std::string>;

using strata_tools::same_file;  // shared with strata-tokenize

// Every output must be named, lie in an existing folder it can write to, not be a folder or
// a device, and differ from every input and every other output (an optional output that is
// not wanted is left out of `outputs`). So a path that cannot be written is refused before
// training, not after it.
inline void check_paths(const char* who, const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs) {
  namespace fs = std::filesystem;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [option, path] = outputs[i];
    STRATA_CHECK(!path.empty(), "[{}] {} is empty; give a file name", who, option);
    STRATA_CHECK(!fs::is_directory(path), "[{}] {} {} is a folder; give a file name", who, option, path);
    const fs::path folder = fs::path(path).parent_path();
    STRATA_CHECK(folder.empty() || fs::is_directory(folder), "[{}] {} {}: there is no folder {}", who, option, path,
                 folder.string());
    {  // a temporary beside it, removed at once: the folder takes new files, and the path is a file
      st::io::AtomicFile probe(path, fmt::format("{}] [{}", who, option));
    }
    for (const auto& [in_option, in_path] : inputs)
      STRATA_CHECK(in_path.empty() || !same_file(path, in_path), "[{}] {} {} would overwrite the input {} {}", who,
                   option, path, in_option, in_path);
    for (size_t j = 0; j < i; ++j)
      STRATA_CHECK(!same_file(path, outputs[j].second),
                   "[{}] {} and {} name the same file {}; one would overwrite the other", who, outputs[j].first,
                   option, path);
  }
}

// Stops the run when the training loss is NaN or infinite: the weights are lost by then.
inline void check_loss(const char* who, double loss, int64_t step) {
  STRATA_CHECK(std::isfinite(loss),
               "[{}] the training loss is {} at step {}: stopping without saving (try a lower --lr)", who, loss, step);
}

}  // namespace example
