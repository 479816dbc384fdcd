// The fixed cost the profiler and module hooks add to a call, in interleaved rounds (median):
// exp of 16 floats with no profiling session, while a session records, and while it records
// shapes, memory and FLOPs too; nn::Identity through forward(), through operator() with no hook,
// and through operator() with one empty forward hook.
//
//   bench_overhead [--rounds R] [--calls N]      one thread
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/strata.hpp>

#include "machine.h"

namespace {

namespace st = strata;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// nanoseconds per call of fn over `calls` calls
double ns_per_call(int calls, const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / calls;
}

struct Case {
  const char* name;
  std::function<double(int)> run;  // ns per call over the given number of calls
  std::vector<double> ns;
};

}  // namespace

int main(int argc, char** argv) {
  bench::restart_with_bench_env(argv, 1);
  st::set_num_threads(1);
  int rounds = 5, calls = 200000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--calls") calls = std::atoi(argv[i + 1]);
  }
  const st::Tensor x = st::randn({16});
  st::nn::Identity plain, hooked;
  hooked.register_forward_hook([](st::nn::Module&, const st::Tensor&, const st::Tensor&) {});
  st::NoGradGuard no_grad;

  auto exp_in_session = [&](st::profiler::ProfilerOptions options) {
    return [&x, options](int n) {
      st::profiler::Profiler session(options);
      session.start();
      const double ns = ns_per_call(n, [&] { st::exp(x); });
      session.stop();
      return ns;
    };
  };
  std::vector<Case> cases = {
      {"exp, no session", [&](int n) { return ns_per_call(n, [&] { st::exp(x); }); }, {}},
      {"exp, recording", exp_in_session({}), {}},
      {"exp, recording shapes+memory+flops",
       exp_in_session({.record_shapes = true, .profile_memory = true, .with_flops = true}), {}},
      {"Identity.forward()", [&](int n) { return ns_per_call(n, [&] { plain.forward(x); }); }, {}},
      {"Identity(), no hook", [&](int n) { return ns_per_call(n, [&] { plain(x); }); }, {}},
      {"Identity(), one forward hook", [&](int n) { return ns_per_call(n, [&] { hooked(x); }); }, {}},
  };
  for (Case& c : cases) c.run(calls / 10);  // warm-up
  for (int r = 0; r < rounds; ++r)
    for (Case& c : cases) c.ns.push_back(c.run(calls));

  fmt::print("call overhead, 1 thread, {} calls x {} rounds (median), CPU {}\n", calls, rounds, bench::cpu_model());
  for (const Case& c : cases) fmt::print("  {:<36} {:8.1f} ns per call\n", c.name, median(c.ns));
}
