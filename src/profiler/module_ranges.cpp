// Module ranges (ProfilerOptions::with_modules, Profiler::record_modules): global forward hooks,
// installed while a session runs, open a RecordFunction before each module's forward and close
// it after, so the module's ops nest inside it.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <strata/nn/module.hpp>
#include <strata/profiler/profiler.hpp>

namespace strata::profiler {

namespace detail {

struct ModuleRanges {
  std::map<const nn::Module*, std::string> names;  // from record_modules
  bool all = false;                                 // with_modules: unnamed modules by class name
  std::vector<nn::RemovableHandle> hooks;
};

namespace {

// The module ranges open on this thread, innermost last. The closing hook is always_call, so a
// forward that raises closes its range too.
thread_local std::vector<std::pair<const nn::Module*, std::unique_ptr<RecordFunction>>> open_ranges;

void open_module_range(const ModuleRanges& r, const nn::Module& m) {
  auto it = r.names.find(&m);
  if (it == r.names.end() && !r.all) return;
  const std::string& name = it != r.names.end() ? it->second : m.name();
  open_ranges.emplace_back(&m, std::make_unique<RecordFunction>("nn.Module: " + name));
}

// Closes the ranges from index `keep` on, innermost first.
void close_ranges_from(size_t keep) {
  while (open_ranges.size() > keep) open_ranges.pop_back();
}

void close_module_range(const nn::Module& m) {
  for (auto i = open_ranges.size(); i-- > 0;)
    if (open_ranges[i].first == &m) return close_ranges_from(i);  // with any left inside it
}

}  // namespace

}  // namespace detail

void Profiler::record_modules(nn::Module& root) {
  if (!module_ranges_) module_ranges_ = std::make_shared<detail::ModuleRanges>();
  for (auto& [name, m] : root.named_modules()) module_ranges_->names[m] = name.empty() ? root.name() : name;
  if (running_) install_module_hooks();
}

void Profiler::install_module_hooks() {
  if (!options_.with_modules && !module_ranges_) return;
  if (!module_ranges_) module_ranges_ = std::make_shared<detail::ModuleRanges>();
  detail::ModuleRanges& r = *module_ranges_;
  r.all = options_.with_modules;
  if (!r.hooks.empty()) return;
  // the hooks share the names, so record_modules during the session adds to what they see
  std::shared_ptr<const detail::ModuleRanges> ranges = module_ranges_;
  r.hooks.push_back(nn::register_module_forward_pre_hook(
      [ranges](nn::Module& m, const Tensor&) { detail::open_module_range(*ranges, m); }));
  r.hooks.push_back(nn::register_module_forward_hook(
      [](nn::Module& m, const Tensor&, const Tensor&) { detail::close_module_range(m); }, /*always_call=*/true));
}

void Profiler::remove_module_hooks() {
  if (!module_ranges_) return;
  for (nn::RemovableHandle& h : module_ranges_->hooks) h.remove();
  module_ranges_->hooks.clear();
  detail::close_ranges_from(0);  // ranges of module calls still running on this thread
}

}  // namespace strata::profiler
