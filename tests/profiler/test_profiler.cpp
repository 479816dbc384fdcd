// The profiler's recording: which events a known sequence of ops gives, nesting and self time
// checked on the recorded numbers, FLOPs against the closed-form counts computed here, memory
// against the known sizes of outputs and temporaries, one session at a time, the table.
#include <algorithm>
#include <map>

#include "profiler/profiler_testing.h"
#include "testing.h"

namespace st = strata;
namespace prof = strata::profiler;
namespace F = strata::nn::functional;
using strata::Tensor;
using namespace profiler_testing;

TEST(Profiler, RecordsOneEventPerKernelInOrder) {
  Tensor a = st::randn({4, 5}), b = st::randn({4, 5});
  prof::Profiler p({.record_shapes = true});
  {
    prof::ProfileScope scope(p);
    Tensor c = a + b;
    Tensor d = c * a;
    Tensor e = st::exp(d);
    Tensor f = st::exp(e);
  }
  std::vector<std::string> names;
  for (const auto& e : p.events()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"add", "mul", "exp", "exp"}));
  const auto& add = p.events()[0];
  EXPECT_EQ(add.kind, prof::EventKind::Op);
  EXPECT_EQ(add.input_shapes, (std::vector<st::Shape>{{4, 5}, {4, 5}}));
  EXPECT_EQ(add.input_dtypes, (std::vector<std::string>{"float32", "float32"}));
  EXPECT_EQ(add.device, st::kCPU);
  for (size_t i = 1; i < p.events().size(); ++i) EXPECT_GE(p.events()[i].start_ns, p.events()[i - 1].end_ns);
  EXPECT_EQ(p.key_averages().at("exp").count, 2);
  EXPECT_EQ(p.key_averages().at("add").count, 1);
  // nothing is recorded once stopped
  Tensor g = st::exp(a);
  EXPECT_EQ(p.events().size(), 4u);
}

TEST(Profiler, RangesEncloseTheirOpsAndSelfTimeIsTotalLessChildren) {
  Tensor x = st::randn({64, 64});
  prof::Profiler p;
  {
    prof::ProfileScope scope(p);
    STRATA_RECORD_FUNCTION("outer");
    Tensor y = st::matmul(x, x);
    {
      prof::RecordFunction inner("inner");
      y = run_composite(y);
    }
    y = st::relu(y);
  }
  const auto& outer = only(p, "outer");
  const auto& inner = only(p, "inner");
  const auto& comp = only(p, "test_exp_plus_x");
  EXPECT_EQ(outer.kind, prof::EventKind::UserRange);
  EXPECT_EQ(outer.parent_id, -1);
  EXPECT_EQ(inner.parent_id, outer.id);
  EXPECT_EQ(comp.parent_id, inner.id);
  EXPECT_EQ(only(p, "matmul").parent_id, outer.id);
  EXPECT_EQ(only(p, "relu").parent_id, outer.id);
  EXPECT_EQ(comp.depth, 2);
  // the composite op's kernel ran exp, add and copy: its children, one level deeper
  std::vector<std::string> kids;
  for (const auto* c : children(p, comp)) kids.push_back(c->name);
  EXPECT_EQ(kids, (std::vector<std::string>{"exp", "add", "copy"}));
  for (const auto& e : p.events()) {
    int64_t child_total = 0;
    for (const auto* c : children(p, e)) {
      EXPECT_GE(c->start_ns, e.start_ns) << c->name << " in " << e.name;
      EXPECT_LE(c->end_ns, e.end_ns) << c->name << " in " << e.name;
      EXPECT_EQ(c->depth, e.depth + 1);
      child_total += c->duration_ns();
    }
    EXPECT_EQ(e.self_ns, e.duration_ns() - child_total) << e.name;
    EXPECT_GE(e.self_ns, 0) << e.name;
  }
  // key_averages adds the same numbers up
  const auto avg = p.key_averages();
  EXPECT_EQ(avg.at("outer").cpu_time_total_ns, outer.duration_ns());
  EXPECT_EQ(avg.at("outer").self_cpu_time_total_ns, outer.self_ns);
}

TEST(Profiler, RangesWithoutASessionRecordNothing) {
  EXPECT_FALSE(prof::is_profiling());
  { STRATA_RECORD_FUNCTION("idle"); }
  prof::Profiler p;
  p.start();
  EXPECT_TRUE(prof::is_profiling());
  p.stop();
  EXPECT_FALSE(prof::is_profiling());
  EXPECT_TRUE(p.events().empty());
}

TEST(Profiler, FlopsMatchClosedFormCounts) {
  const int64_t M = 6, K = 7, N = 5, B = 3;
  Tensor a = st::randn({M, K}), b = st::randn({K, N});
  Tensor ba = st::randn({B, M, K}), bb = st::randn({B, K, N});
  Tensor x = st::randn({M, K}), w = st::randn({N, K}), bias = st::randn({N});
  // conv: N=2, C=4, 9x8 image, O=6, groups=2, 3x3 kernel, stride 2, padding 1
  const int64_t cn = 2, cc = 4, ch = 9, cw = 8, co = 6, g = 2, kh = 3, kw = 3, s = 2, pad = 1;
  Tensor img = st::randn({cn, cc, ch, cw}, st::TensorOptions().requires_grad());
  Tensor filt = st::randn({co, cc / g, kh, kw}, st::TensorOptions().requires_grad());
  // conv3d where it runs natively (composed, it would add conv2d events): depth 5, kernel depth 2
  const bool conv3d_native = st::ext::has_kernel(st::OpId::conv3d, st::DeviceType::CPU, st::kFloat32);
  Tensor vol = st::randn({cn, cc, 5, ch, cw}, st::TensorOptions().requires_grad());
  Tensor filt3 = st::randn({co, cc / g, 2, kh, kw}, st::TensorOptions().requires_grad());
  prof::Profiler p({.with_flops = true});
  {
    prof::ProfileScope scope(p);
    { STRATA_RECORD_FUNCTION("mm"); st::mm(a, b); }
    { STRATA_RECORD_FUNCTION("bmm"); st::bmm(ba, bb); }
    st::linear(x, w, bias);
    Tensor y = F::conv2d(img, filt, Tensor(), {.stride = s, .padding = pad, .groups = g});
    y.sum().backward();
    if (conv3d_native)
      F::conv3d(vol, filt3, Tensor(), {.stride = {1, s, s}, .padding = {0, pad, pad}, .groups = g}).sum().backward();
  }
  auto flops_in = [&](std::string_view range) {
    return children(p, only(p, range)).at(0)->flops;
  };
  EXPECT_DOUBLE_EQ(flops_in("mm"), 2.0 * M * N * K);
  EXPECT_DOUBLE_EQ(flops_in("bmm"), 2.0 * B * M * N * K);
  EXPECT_DOUBLE_EQ(only(p, "linear").flops, 2.0 * M * K * N);
  const int64_t ho = (ch + 2 * pad - kh) / s + 1, wo = (cw + 2 * pad - kw) / s + 1;
  const double conv = 2.0 * cn * co * ho * wo * (cc / g) * kh * kw;
  EXPECT_DOUBLE_EQ(only(p, "conv2d").flops, conv);
  EXPECT_DOUBLE_EQ(only(p, "conv2d_backward_input").flops, conv);
  EXPECT_DOUBLE_EQ(only(p, "conv2d_backward_weight").flops, conv);
  if (conv3d_native) {
    const double conv3 = conv * 4 * 2;  // 4 output depths, 2 depth taps
    EXPECT_DOUBLE_EQ(only(p, "conv3d").flops, conv3);
    EXPECT_DOUBLE_EQ(only(p, "conv3d_backward_input").flops, conv3);
    EXPECT_DOUBLE_EQ(only(p, "conv3d_backward_weight").flops, conv3);
  }
  for (const auto& e : p.events())  // FLOPs are counted for the GEMM and convolution kernels only
    if (e.name != "matmul" && e.name != "linear" && e.name.rfind("conv", 0) != 0) EXPECT_EQ(e.flops, 0) << e.name;
  const auto avg = p.key_averages();
  EXPECT_DOUBLE_EQ(avg.at("matmul").flops, 2.0 * M * N * K + 2.0 * B * M * N * K);
  const auto& lin = avg.at("linear");
  EXPECT_NEAR(lin.gflops_per_second(), lin.flops / (double(lin.cpu_time_total_ns) * 1e-9) / 1e9, 1e-9);
}

TEST(Profiler, MatmulFlopsForTransposedBatchedBroadcastAndVectorShapes) {
  const int64_t B = 4, M = 3, K = 5, N = 2;
  Tensor at = st::randn({K, M}), bt = st::randn({N, K});
  Tensor ba = st::randn({B, M, K}), b = st::randn({K, N}), bb = st::randn({B, 1, K, N}), v = st::randn({K});
  Tensor x3 = st::randn({B, M, K}), w = st::randn({N, K});
  prof::Profiler p({.with_flops = true});
  {
    prof::ProfileScope scope(p);
    { STRATA_RECORD_FUNCTION("transposed"); st::matmul(at.t(), bt.t()); }  // (M, K) @ (K, N) as views
    { STRATA_RECORD_FUNCTION("broadcast"); st::matmul(ba, b); }            // (B, M, K) @ (K, N)
    { STRATA_RECORD_FUNCTION("both_batched"); st::matmul(ba, bb); }        // (B, M, K) @ (B, 1, K, N)
    { STRATA_RECORD_FUNCTION("vector_left"); st::matmul(v, b); }           // (K) @ (K, N)
    { STRATA_RECORD_FUNCTION("vector_right"); st::matmul(ba, v); }         // (B, M, K) @ (K)
    { STRATA_RECORD_FUNCTION("linear3d"); st::linear(x3, w, Tensor()); }   // (B, M, K) x (N, K)^T
  }
  auto flops_in = [&](std::string_view range) {
    double f = 0;
    for (const auto* e : children(p, only(p, range))) f += e->flops;
    return f;
  };
  EXPECT_DOUBLE_EQ(flops_in("transposed"), 2.0 * M * K * N);
  EXPECT_DOUBLE_EQ(flops_in("broadcast"), 2.0 * B * M * K * N);
  EXPECT_DOUBLE_EQ(flops_in("both_batched"), 2.0 * B * B * M * K * N);  // batch dims broadcast to (B, B)
  EXPECT_DOUBLE_EQ(flops_in("vector_left"), 2.0 * K * N);
  EXPECT_DOUBLE_EQ(flops_in("vector_right"), 2.0 * B * M * K);
  EXPECT_DOUBLE_EQ(flops_in("linear3d"), 2.0 * B * M * K * N);
}

TEST(Profiler, AttentionFlops) {
  const int64_t B = 2, H = 3, L = 5, S = 7, E = 8, Ev = 4;
  Tensor q = st::randn({B, H, L, E}), k = st::randn({B, H, S, E}), v = st::randn({B, H, S, Ev});
  prof::Profiler p({.with_flops = true});
  {
    prof::ProfileScope scope(p);
    F::scaled_dot_product_attention(q, k, v);
  }
  auto att = named(p, "attention");
  if (att.empty()) GTEST_SKIP() << "the fused attention kernel does not run on this CPU path";
  // Q K^T: 2 B H L S E, then P V: 2 B H L S Ev
  EXPECT_DOUBLE_EQ(att[0]->flops, 2.0 * B * H * L * S * E + 2.0 * B * H * L * S * Ev);
}

TEST(Profiler, AttentionBackwardFlopsAreTwiceTheForward) {
  // four GEMMs of the forward's two sizes (dV, dP, dQ, dK), as torch's flop counter counts them
  const int64_t B = 2, H = 2, L = 3, S = 6, E = 4, Ev = 5;
  const auto opts = st::TensorOptions().requires_grad();
  Tensor q = st::randn({B, H, L, E}, opts), k = st::randn({B, H, S, E}, opts), v = st::randn({B, H, S, Ev}, opts);
  prof::Profiler p({.with_flops = true});
  {
    prof::ProfileScope scope(p);
    F::scaled_dot_product_attention(q, k, v).sum().backward();
  }
  auto back = named(p, "attention_backward");
  if (back.empty()) GTEST_SKIP() << "the fused attention kernel does not run on this CPU path";
  EXPECT_DOUBLE_EQ(back[0]->flops, 2.0 * (2.0 * B * H * L * S * E + 2.0 * B * H * L * S * Ev));
}

TEST(Profiler, MemoryOfOutputsAndTemporaries) {
  Tensor x = st::randn({64, 64});  // 16 KiB, a size the allocator does not round
  const int64_t bytes = 64 * 64 * 4;
  prof::Profiler p({.profile_memory = true});
  Tensor y, z;
  {
    prof::ProfileScope scope(p);
    y = st::exp(x);
    z = run_composite(x);
  }
  const prof::ProfilerEvent* e = named(p, "exp").at(0);
  EXPECT_EQ(e->allocated_bytes, bytes);
  EXPECT_EQ(e->freed_bytes, 0);
  EXPECT_EQ(e->self_allocated_bytes, bytes);
  // the composite op: its output, plus exp's and add's outputs, which it frees before returning
  const auto& c = only(p, "test_exp_plus_x");
  EXPECT_EQ(c.allocated_bytes, 3 * bytes);
  EXPECT_EQ(c.freed_bytes, 2 * bytes);
  EXPECT_EQ(c.self_allocated_bytes, bytes);
  EXPECT_EQ(c.self_freed_bytes, 2 * bytes);
  EXPECT_EQ(only(p, "copy").allocated_bytes, 0);  // into the composite's output: nothing new
  EXPECT_EQ(only(p, "add").allocated_bytes, bytes);
  const auto avg = p.key_averages();
  EXPECT_EQ(avg.at("exp").allocated_bytes, 2 * bytes);
  EXPECT_NE(avg.table().find("Self Mem"), std::string::npos);
}

TEST(Profiler, AStorageFreedWhileNotRecordingIsNotChargedToALaterOp) {
  prof::Profiler p({.profile_memory = true});
  Tensor x = st::randn({8});
  std::vector<Tensor> kept, outputs;
  {
    prof::ProfileScope scope(p);
    for (int i = 0; i < 8; ++i) kept.push_back(st::empty({1000}));  // allocated while recording, outside any op
  }
  kept.clear();  // freed while not recording: the thread's records of them stay behind
  {
    prof::ProfileScope scope(p);
    for (int i = 0; i < 64; ++i) outputs.push_back(st::exp(x));  // some take the freed storages' addresses
  }
  for (const auto* e : named(p, "exp")) EXPECT_EQ(e->allocated_bytes, 8 * 4);
}

TEST(Profiler, OneSessionAtATime) {
  prof::Profiler first, second;
  first.start();
  try {
    second.start();
    FAIL() << "a second session started";
  } catch (const st::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another Profiler session is already running"), std::string::npos);
  }
  EXPECT_THROW(first.start(), st::Error);
  first.stop();
  second.start();  // free again
  second.stop();
  EXPECT_THROW(second.step(), st::Error);  // not running
}

TEST(Profiler, TableSortsAndGroupsByShape) {
  Tensor small = st::randn({2, 3}), big = st::randn({40, 50});
  prof::Profiler p({.record_shapes = true});
  {
    prof::ProfileScope scope(p);
    for (int i = 0; i < 3; ++i) st::exp(small);
    st::exp(big);
    st::sin(big);
    st::cos(big);
    st::cos(small);
  }
  const std::string t = p.key_averages().table("count", 2);
  for (const char* h : {"Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls"})
    EXPECT_NE(t.find(h), std::string::npos) << h;
  // sorted by count: exp (4), cos (2); sin is past the row limit
  ASSERT_NE(t.find("exp"), std::string::npos);
  ASSERT_NE(t.find("cos"), std::string::npos);
  EXPECT_LT(t.find("exp"), t.find("cos"));
  EXPECT_EQ(t.find("sin"), std::string::npos);
  EXPECT_NE(t.find("Self CPU time total"), std::string::npos);

  // sorted by total time: the order of the recorded totals
  const auto avg = p.key_averages();
  std::vector<st::profiler::EventAverage> rows = avg.rows();
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.cpu_time_total_ns > b.cpu_time_total_ns; });
  const std::string by_total = avg.table("cpu_time_total", -1);
  for (size_t i = 1; i < rows.size(); ++i)
    if (rows[i - 1].cpu_time_total_ns > rows[i].cpu_time_total_ns)
      EXPECT_LT(by_total.find("\n" + rows[i - 1].name + " "), by_total.find("\n" + rows[i].name + " "));
  EXPECT_THROW(avg.table("no_such_key"), st::Error);

  const auto shaped = p.key_averages(true);
  int64_t exp_small = 0, exp_big = 0;
  for (const auto& r : shaped.rows()) {
    if (r.name == "exp" && r.input_shapes == "[[2, 3]]") exp_small = r.count;
    if (r.name == "exp" && r.input_shapes == "[[40, 50]]") exp_big = r.count;
  }
  EXPECT_EQ(exp_small, 3);
  EXPECT_EQ(exp_big, 1);
  EXPECT_NE(shaped.table().find("Input Shapes"), std::string::npos);
  EXPECT_THROW(prof::Profiler().key_averages(true), st::Error);  // needs record_shapes
}

TEST(Profiler, AKernelThatRaisesIsRecordedAndLeavesNestingIntact) {
  static const st::OpId failing = [] {
    st::OpId op = st::ext::register_op("test_failing_kernel", 1);
    st::ext::register_kernel(op, st::DeviceType::CPU, st::kFloat32, [](const st::KernelCall&) {
      STRATA_CHECK(false, "[test_failing_kernel] fails on purpose");
    });
    return op;
  }();
  Tensor x = st::randn({3}), out = st::empty({3});
  prof::Profiler p;
  {
    prof::ProfileScope scope(p);
    EXPECT_THROW(st::run_kernel(failing, st::kFloat32, st::KernelCall{{&x, 1}, {&out, 1}}), st::Error);
    st::exp(x);
  }
  ASSERT_EQ(p.events().size(), 2u);
  EXPECT_EQ(p.events()[0].name, "test_failing_kernel");
  EXPECT_EQ(p.events()[1].name, "exp");
  EXPECT_EQ(p.events()[1].parent_id, -1);  // not left inside the failed op
  EXPECT_EQ(p.events()[1].depth, 0);
}
