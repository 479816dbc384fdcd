// Checkpoints of the example's training run: what goes in (the model's configuration and schedule), and
// the shared save, resume and metrics trimming of examples/common/checkpoints.hpp.
#pragma once

#include <map>
#include <string>

#include <strata/strata.hpp>

#include "../common/checkpoints.hpp"
#include "gpt.hpp"

namespace checkpointing {

namespace st = strata;

// What a checkpoint must agree on to be continued exactly (Note [Exact resume] in
// train_loop.hpp), as strings: the model's shape, the batches it is fed (their size and the
// seed), the update (clipping, and the weight decay, which the optimizer's state carries, so
// another would be ignored), the learning-rate schedule (another would mix two) and the
// validation batches the metrics report. A checkpoint saved with others is refused, naming
// the keys that differ.
struct RunSettings {
  int64_t batch = 0, steps = 0, warmup = 0, eval_batches = 0;
  double lr = 0, min_lr = 0, weight_decay = 0, clip = 0;
  uint64_t seed = 0;
};

inline std::map<std::string, std::string> run_config(const gpt::Config& c, const RunSettings& r) {
  std::map<std::string, std::string> config{
      {"layers", std::to_string(c.layers)},     {"width", std::to_string(c.width)},
      {"heads", std::to_string(c.heads)},       {"context", std::to_string(c.context)},
      {"dropout", fmt::format("{}", c.dropout)}, {"vocab", std::to_string(c.vocab)},
      {"batch", std::to_string(r.batch)},       {"seed", std::to_string(r.seed)},
      {"clip", fmt::format("{}", r.clip)},      {"weight_decay", fmt::format("{}", r.weight_decay)},
      {"eval_batches", std::to_string(r.eval_batches)}};
  config.merge(example::schedule_config(r.steps, r.warmup, r.lr, r.min_lr));
  return config;
}

inline void save(const std::string& path, const st::io::TrainingState& state, int64_t step) {
  example::save_checkpoint(path, state, {.step = step});
}

// Restores `state` from `path` and returns the step to continue from.
inline int64_t resume(const std::string& path, st::io::TrainingState& state) {
  return example::resume(path, state, "transformer").step;
}

inline constexpr const char* kMetricsHeader = "step,loss,lr,tokens_per_s,val_loss";

}  // namespace checkpointing
