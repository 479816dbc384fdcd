// Restoring a checkpoint into live training objects, all or nothing: every mismatch is
// collected and reported in one Error before anything is written, and the parts whose own
// load_state_dict may still refuse (optimizer, scheduler, scaler) are rolled back from
// snapshots if one of them does.
#include <strata/io/checkpoint.hpp>

#include <functional>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <strata/core/error.hpp>

namespace strata::io {
namespace {

// "key: old -> new" for every key whose value differs (or exists on one side only).
void diff_config(const std::map<std::string, std::string>& saved, const std::map<std::string, std::string>& current,
                 std::vector<std::string>& problems) {
  std::vector<std::string> lines;
  auto show = [](const std::map<std::string, std::string>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? std::string("(absent)") : fmt::format("'{}'", it->second);
  };
  std::map<std::string, bool> keys;
  for (const auto& [k, v] : saved) keys[k] = true;
  for (const auto& [k, v] : current) keys[k] = true;
  for (const auto& [k, unused] : keys) {
    auto a = saved.find(k), b = current.find(k);
    if (a == saved.end() || b == current.end() || a->second != b->second)
      lines.push_back(fmt::format("    {}: {} -> {}", k, show(saved, k), show(current, k)));
  }
  if (!lines.empty())
    problems.push_back(fmt::format("the model configuration differs (checkpoint -> current):\n{}", fmt::join(lines, "\n")));
}

// What the model's own load_state_dict would refuse (strict), and a dtype that differs: exact
// resume needs the weights in the precision they were trained in.
void check_model(const nn::StateDict& saved, const nn::Module& model, std::vector<std::string>& problems) {
  for (const std::string& p : model.check_state_dict(saved, /*strict=*/true)) problems.push_back("model " + p);
  for (const auto& [k, t] : model.state_dict()) {
    auto it = saved.find(k);
    if (it == saved.end() || !it->second.defined() || it->second.dtype() == t.dtype()) continue;
    // a shape that would not load is reported above
    if (nn::Module::shape_loads_into(it->second, t))
      problems.push_back(fmt::format("{} is {} in the checkpoint, {} in the model", k, it->second.dtype(), t.dtype()));
  }
}

void check_part(const char* what, bool saved, const std::string& saved_type, bool live,
                const std::optional<std::string>& live_type, std::vector<std::string>& problems) {
  if (saved && !live) problems.push_back(fmt::format("the checkpoint has {} state ({}) but none was given", what, saved_type));
  if (!saved && live) problems.push_back(fmt::format("the checkpoint has no {} state", what));
  if (saved && live && live_type && *live_type != saved_type)
    problems.push_back(fmt::format("the {} is {} but the checkpoint's was {}", what, *live_type, saved_type));
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path, TrainingState& s) {
  CheckpointFile ck = read_checkpoint(path);  // checksums verified, layout parsed

  std::vector<std::string> problems;
  diff_config(ck.config, s.config, problems);
  if (s.model) check_model(ck.model, *s.model, problems);
  else if (!ck.model.empty()) problems.push_back("the checkpoint has model weights but no model was given");
  check_part("optimizer", ck.has_optimizer, ck.optimizer.type, s.optimizer != nullptr,
             s.optimizer ? std::optional<std::string>(s.optimizer->name()) : std::nullopt, problems);
  // a scheduler's or scaler's type is only known from its state dict
  std::optional<optim::StateDict> sched_before, scaler_before;
  if (s.scheduler) sched_before = s.scheduler.save();
  if (s.scaler) scaler_before = s.scaler.save();
  check_part("scheduler", ck.has_scheduler, ck.scheduler.type, sched_before.has_value(),
             sched_before ? std::optional<std::string>(sched_before->type) : std::nullopt, problems);
  check_part("grad scaler", ck.has_scaler, ck.scaler.type, scaler_before.has_value(),
             scaler_before ? std::optional<std::string>(scaler_before->type) : std::nullopt, problems);
  for (const auto& [name, g] : s.generators) {
    if (name == "default") problems.push_back("the generator name 'default' is reserved for default_generator()");
    else if (!g) problems.push_back(fmt::format("generator '{}' is null", name));
    else if (!ck.generators.count(name)) problems.push_back(fmt::format("the checkpoint has no generator '{}'", name));
  }
  for (const auto& [name, st] : ck.generators)
    if (name != "default" && !s.generators.count(name))
      problems.push_back(fmt::format("the checkpoint has generator '{}' but none of that name was given", name));
  if (!problems.empty())
    throw Error(fmt::format("[checkpoint] cannot load {}:\n  {}", path, fmt::join(problems, "\n  ")));

  // Apply. The model, fully checked above, goes last; the other parts can still refuse their
  // state dict (a different param group layout, say), so each is restored from its snapshot.
  std::function<void()> restore_optimizer;
  if (s.optimizer) restore_optimizer = s.optimizer->restore_point();
  int stage = 0;  // the part being loaded: 1 scheduler, 2 scaler, 3 optimizer, 4 model
  try {
    stage = 1;
    if (s.scheduler) s.scheduler.load(ck.scheduler);
    stage = 2;
    if (s.scaler) s.scaler.load(ck.scaler);
    stage = 3;
    if (s.optimizer) s.optimizer->load_state_dict(ck.optimizer);
    stage = 4;
    if (s.model) s.model->load_state_dict(ck.model);
  } catch (const std::exception& e) {
    // The part that refused is restored too, in case it changed anything before refusing.
    // Each restore is tried whatever the others do, and the first error is the one reported.
    std::vector<std::string> unrestored;
    auto restore = [&](bool needed, const char* part, const std::function<void()>& load) {
      if (!needed) return;
      try {
        load();
      } catch (const std::exception& r) {
        unrestored.push_back(fmt::format("the {} could not be restored ({})", part, r.what()));
      }
    };
    restore(stage >= 3 && s.optimizer, "optimizer", restore_optimizer);
    restore(stage >= 2 && s.scaler, "grad scaler", [&] { s.scaler.load(*scaler_before); });
    restore(stage >= 1 && s.scheduler, "scheduler", [&] { s.scheduler.load(*sched_before); });
    // The model's own checks passed above, so only a failing copy (a device error) stops it
    // midway; its earlier tensors are then already written.
    std::string outcome = stage == 4 ? "the model may be partly loaded; " : "";
    outcome += unrestored.empty() ? (stage == 4 ? "the other parts were restored" : "nothing was changed")
                                  : fmt::format("{}", fmt::join(unrestored, "; "));
    throw Error(fmt::format("[checkpoint] cannot load {} ({}): {}", path, outcome, e.what()));
  }
  for (const auto& [name, st] : ck.generators) {
    Generator& g = name == "default" ? default_generator() : *s.generators.at(name);
    g.set_state(st.first, st.second);
  }
  return ck.progress;
}

}  // namespace strata::io
