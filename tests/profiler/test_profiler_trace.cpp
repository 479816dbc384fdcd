// The profiler's outputs over time: the Chrome trace, read back by Python's json module (an
// independent reader), and torch.profiler's schedule driven by step().
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "temp_dir.h"
#include "testing.h"

namespace st = strata;
namespace prof = strata::profiler;
using strata::Tensor;

namespace {

// The "X" events of a Chrome trace as Python's json module reads them, one per line:
// name, cat, ts, dur, tid, FLOPs, Input Dims; empty when python3 is missing.
std::vector<std::vector<std::string>> read_with_python(const st::testing::TempDir& dir, const std::string& trace) {
  const std::string script = dir / "read_trace.py", out = dir / "events.tsv";
  std::ofstream(script) << "import json, sys\n"
                           "doc = json.load(open(sys.argv[1]))\n"
                           "with open(sys.argv[2], 'w') as f:\n"
                           "    for e in doc['traceEvents']:\n"
                           "        if e['ph'] != 'X': continue\n"
                           "        a = e['args']\n"
                           "        f.write('\\t'.join([e['name'], e['cat'], repr(float(e['ts'])),\n"
                           "                           repr(float(e['dur'])), str(e['tid']),\n"
                           "                           repr(float(a.get('FLOPs', 0))),\n"
                           "                           json.dumps(a.get('Input Dims'))]) + '\\n')\n";
  if (std::system(("python3 " + script + " " + trace + " " + out).c_str()) != 0) return {};
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, '\t');) fields.push_back(f);
    rows.push_back(fields);
  }
  return rows;
}

}  // namespace

TEST(ProfilerTrace, ChromeTraceParsesAndHoldsTheEvents) {
  if (std::system("python3 -c 'import json' 2>/dev/null") != 0) GTEST_SKIP() << "python3 is not available";
  st::testing::TempDir dir("profiler");
  Tensor a = st::randn({8, 16}), b = st::randn({16, 4});
  prof::Profiler p({.record_shapes = true, .with_flops = true});
  {
    prof::ProfileScope scope(p);
    STRATA_RECORD_FUNCTION("step \"one\" \\ two");  // a name that needs escaping
    Tensor c = st::matmul(a, b);
    st::relu(c);
  }
  const std::string path = dir / "trace.json";
  p.export_chrome_trace(path);
  const auto rows = read_with_python(dir, path);
  ASSERT_EQ(rows.size(), p.events().size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& e = p.events()[i];
    const auto& r = rows[i];
    ASSERT_EQ(r.size(), 7u);
    EXPECT_EQ(r[0], e.name);
    EXPECT_EQ(r[1], e.kind == prof::EventKind::Op ? "cpu_op" : "user_annotation");
    EXPECT_NEAR(std::stod(r[2]), double(e.start_ns) / 1e3, 1e-3);
    EXPECT_NEAR(std::stod(r[3]), double(e.duration_ns()) / 1e3, 1e-3);
    EXPECT_EQ(std::stoll(r[4]), e.thread_id);
    EXPECT_DOUBLE_EQ(std::stod(r[5]), e.flops);
  }
  // the range comes first and encloses both ops on the trace's own numbers
  const double range_ts = std::stod(rows[0][2]), range_end = range_ts + std::stod(rows[0][3]);
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_GE(std::stod(rows[i][2]), range_ts);
    EXPECT_LE(std::stod(rows[i][2]) + std::stod(rows[i][3]), range_end + 1e-3);
  }
  EXPECT_EQ(rows[1][0], "matmul");
  EXPECT_EQ(std::stod(rows[1][5]), 2.0 * 8 * 16 * 4);
  EXPECT_EQ(rows[1][6], "[[8, 16], [16, 4]]");
}

TEST(ProfilerTrace, ExportRefusesAFolderAndLeavesNoFile) {
  st::testing::TempDir dir("profiler");
  prof::Profiler p;
  p.start();
  st::exp(st::ones({2}));
  p.stop();
  EXPECT_THROW(p.export_chrome_trace(dir.str()), st::Error);
  EXPECT_THROW(p.export_chrome_trace(dir / "missing/trace.json"), st::Error);
}

TEST(ProfilerSchedule, ActionsFollowTorchSchedule) {
  // torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=2, skip_first=1), by its definition
  const auto s = prof::schedule(1, 1, 2, 2, 1);
  using A = prof::ProfilerAction;
  const std::vector<A> expected = {A::None, A::None, A::Warmup, A::Record, A::RecordAndSave,
                                   A::None, A::Warmup, A::Record, A::RecordAndSave, A::None, A::None};
  for (size_t step = 0; step < expected.size(); ++step)
    EXPECT_EQ(s(int64_t(step)), expected[step]) << "step " << step;
  EXPECT_EQ(prof::schedule(0, 0, 1)(5), A::RecordAndSave);  // repeat 0: forever
  EXPECT_THROW(prof::schedule(-1, 0, 1), st::Error);
  EXPECT_THROW(prof::schedule(0, 0, 0), st::Error);
  EXPECT_THROW(prof::Profiler({.schedule = prof::Schedule{.warmup = -2}}), st::Error);
}

TEST(ProfilerSchedule, StepDrivesRecordingAndCallsBackPerCycle) {
  Tensor x = st::randn({4});
  std::vector<std::vector<std::string>> traces;  // the event names of each completed trace
  std::vector<int64_t> callback_steps;
  prof::Profiler p({.schedule = prof::schedule(1, 1, 2, 2), .on_trace_ready = [&](prof::Profiler& pr) {
                      std::vector<std::string> names;
                      for (const auto& e : pr.events()) names.push_back(e.name);
                      traces.push_back(names);
                      callback_steps.push_back(pr.step_num());
                    }});
  std::vector<prof::ProfilerAction> actions;
  p.start();
  for (int step = 0; step < 10; ++step) {
    actions.push_back(p.current_action());
    EXPECT_EQ(prof::is_profiling(), p.current_action() != prof::ProfilerAction::None) << "step " << step;
    for (int i = 0; i <= step; ++i) st::exp(x);  // step k runs k + 1 ops, so each step is told apart
    p.step();
  }
  p.stop();
  using A = prof::ProfilerAction;
  EXPECT_EQ(actions, (std::vector<A>{A::None, A::Warmup, A::Record, A::RecordAndSave, A::None, A::Warmup, A::Record,
                                     A::RecordAndSave, A::None, A::None}));
  ASSERT_EQ(traces.size(), 2u);
  EXPECT_EQ(callback_steps, (std::vector<int64_t>{4, 8}));
  // each trace holds its two active steps (2 and 3, then 6 and 7): a range per step around its ops
  auto expect_steps = [](const std::vector<std::string>& names, int first) {
    std::vector<std::string> want;
    for (int step = first; step < first + 2; ++step) {
      want.push_back("ProfilerStep#" + std::to_string(step));
      for (int i = 0; i <= step; ++i) want.push_back("exp");
    }
    EXPECT_EQ(names, want);
  };
  expect_steps(traces[0], 2);
  expect_steps(traces[1], 6);
  EXPECT_EQ(p.events().size(), traces[1].size());  // events() is the last trace
}

TEST(ProfilerSchedule, ARangeOpenAcrossStepsLeavesEveryStepRangeIntact) {
  // "epoch" opens inside ProfilerStep#0 and outlives it: each step's range still closes at its
  // step(), and the ranges closed out of order do not count their common time twice
  prof::Profiler p({.schedule = prof::schedule(0, 0, 3, 1)});
  p.start();
  std::optional<prof::RecordFunction> epoch;
  epoch.emplace("epoch");
  for (int step = 0; step < 3; ++step) {
    st::exp(st::ones({3}));
    p.step();
  }
  epoch.reset();
  p.stop();
  std::vector<std::string> steps;
  int64_t steps_ns = 0, ops_ns = 0;
  for (const auto& e : p.events()) {
    if (e.name.rfind("ProfilerStep#", 0) == 0) {
      steps.push_back(e.name);
      steps_ns += e.duration_ns();
    }
    if (e.name == "exp") {
      ops_ns += e.duration_ns();
      EXPECT_GE(e.depth, 1) << "an op outside any step range";
    }
    EXPECT_GE(e.self_ns, 0) << e.name;
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"}));
  EXPECT_GT(ops_ns, 0);
  EXPECT_GT(steps_ns, 0);
}

TEST(Profiler, RangesClosedOutOfOrderAreRecordedWithoutDoubleCounting) {
  prof::Profiler p;
  {
    prof::ProfileScope scope(p);
    std::optional<prof::RecordFunction> outer, inner;
    outer.emplace("outer");
    st::exp(st::ones({64}));
    inner.emplace("inner");
    st::exp(st::ones({64}));
    outer.reset();  // before inner
    st::exp(st::ones({64}));
    inner.reset();
  }
  const auto& ev = p.events();
  auto find = [&](std::string_view name) {
    auto it = std::find_if(ev.begin(), ev.end(), [&](const auto& e) { return e.name == name; });
    EXPECT_NE(it, ev.end()) << name;
    return *it;
  };
  const prof::ProfilerEvent outer = find("outer"), inner = find("inner");
  EXPECT_EQ(inner.parent_id, outer.id);
  EXPECT_LT(outer.end_ns, inner.end_ns);
  // the self times add up to the time covered, once: nothing is counted twice or lost
  int64_t self_sum = 0;
  for (const auto& e : ev) self_sum += e.self_ns;
  EXPECT_EQ(self_sum, inner.end_ns - outer.start_ns);
  EXPECT_GE(outer.self_ns, 0);
  EXPECT_GE(inner.self_ns, 0);
}

TEST(ProfilerSchedule, StopInsideAnActiveCycleCompletesTheTrace) {
  int ready = 0;
  prof::Profiler p({.schedule = prof::schedule(0, 0, 3), .on_trace_ready = [&](prof::Profiler&) { ++ready; }});
  p.start();
  st::exp(st::ones({3}));
  p.step();
  st::exp(st::ones({3}));
  p.stop();
  EXPECT_EQ(ready, 1);
  int exps = 0;
  for (const auto& e : p.events()) exps += e.name == "exp";
  EXPECT_EQ(exps, 2);
}
