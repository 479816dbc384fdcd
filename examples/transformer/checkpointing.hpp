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

// The model's shape, the learning-rate schedule (a resume with another would mix two) and the
// weight decay (the optimizer's state carries it, so another would be ignored) as strings; a
// checkpoint saved with others is refused, naming the keys that differ.
inline std::map<std::string, std::string> run_config(const gpt::Config& c, int64_t steps, int64_t warmup, double lr,
                                                     double min_lr, double weight_decay) {
  std::map<std::string, std::string> config{
      {"layers", std::to_string(c.layers)},     {"width", std::to_string(c.width)},
      {"heads", std::to_string(c.heads)},       {"context", std::to_string(c.context)},
      {"dropout", fmt::format("{}", c.dropout)}, {"vocab", std::to_string(c.vocab)},
      {"weight_decay", fmt::format("{}", weight_decay)}};
  config.merge(example::schedule_config(steps, warmup, lr, min_lr));
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
