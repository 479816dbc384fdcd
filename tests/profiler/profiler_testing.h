// Helpers shared by the profiler's tests: events by name, an event's children, and an op
// whose kernel runs other ops.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <strata/strata.hpp>

namespace profiler_testing {

namespace st = strata;
namespace prof = strata::profiler;
using strata::Tensor;

inline std::vector<const prof::ProfilerEvent*> named(const prof::Profiler& p, std::string_view name) {
  std::vector<const prof::ProfilerEvent*> out;
  for (const auto& e : p.events())
    if (e.name == name) out.push_back(&e);
  return out;
}

inline const prof::ProfilerEvent& only(const prof::Profiler& p, std::string_view name) {
  auto v = named(p, name);
  EXPECT_EQ(v.size(), 1u) << name;
  if (v.empty()) throw std::runtime_error("no event " + std::string(name));
  return *v[0];
}

inline std::vector<const prof::ProfilerEvent*> children(const prof::Profiler& p, const prof::ProfilerEvent& parent) {
  std::vector<const prof::ProfilerEvent*> out;
  for (const auto& e : p.events())
    if (e.parent_id == parent.id) out.push_back(&e);
  return out;
}

// An op whose kernel runs others: out = exp(x) + x, through a temporary it frees.
inline st::OpId composite_op() {
  static const st::OpId id = [] {
    st::OpId op = st::ext::register_op("test_exp_plus_x", 1);
    st::ext::register_kernel(op, st::DeviceType::CPU, st::kFloat32, [](const st::KernelCall& call) {
      Tensor tmp = st::exp(call.inputs[0]);
      call.outputs[0].copy_(tmp + call.inputs[0]);
    });
    return op;
  }();
  return id;
}

inline Tensor run_composite(const Tensor& x) {
  Tensor out = st::empty(x.shape());
  st::run_kernel(composite_op(), st::kFloat32, st::KernelCall{{&x, 1}, {&out, 1}});
  return out;
}

}  // namespace profiler_testing
