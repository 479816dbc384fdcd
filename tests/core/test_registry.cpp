// The kernel registry: overriding a built-in kernel at run time, adding a new op with its
// own kernel, the observer hook, and the errors for missing kernels.
#include <atomic>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "testing.h"

using namespace strata;
using strata::testing::all_close;

TEST(Registry, OpTableNames) {
  EXPECT_EQ(op_name(OpId::exp), "exp");
  EXPECT_EQ(op_name(OpId::matmul), "matmul");
  EXPECT_EQ(ext::find_op("gelu"), OpId::gelu);
  EXPECT_THROW(ext::find_op("no_such_op"), Error);
  EXPECT_EQ(op_info(OpId::where).num_inputs, 3);
  EXPECT_TRUE(op_info(OpId::exp).differentiable);
  EXPECT_FALSE(op_info(OpId::argmax).differentiable);
}

TEST(Registry, OverrideBuiltinKernel) {
  KernelFn original = ext::get_kernel(OpId::exp, DeviceType::CPU, kFloat32);
  ASSERT_TRUE(original);
  int calls = 0;
  ext::register_kernel(OpId::exp, DeviceType::CPU, kFloat32, [&](const KernelCall& call) {
    ++calls;
    call.outputs[0].fill_(42);
  });
  Tensor y = exp(zeros({3}));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(all_close(y, {42, 42, 42}, 0, 0));
  EXPECT_TRUE(all_close(exp(zeros({2}, kFloat64)), {1, 1}, 0, 0));  // other dtypes untouched
  ext::register_kernel(OpId::exp, DeviceType::CPU, kFloat32, original);
  EXPECT_TRUE(all_close(exp(zeros({3})), {1, 1, 1}, 0, 0));
  EXPECT_THROW(ext::register_kernel(OpId::exp, DeviceType::CPU, kFloat32, KernelFn{}), Error);
}

TEST(Registry, NewOpWithOwnKernel) {
  OpId axpy = ext::register_op("test_axpy", 2, false);
  EXPECT_EQ(ext::find_op("test_axpy"), axpy);
  EXPECT_THROW(ext::register_op("test_axpy", 2), Error);
  EXPECT_THROW(ext::register_op("exp", 1), Error);
  struct Params { float alpha; };
  ext::register_kernel(axpy, DeviceType::CPU, kFloat32, [](const KernelCall& call) {
    const float* x = call.inputs[0].data_ptr<float>();
    const float* y = call.inputs[1].data_ptr<float>();
    float* out = call.outputs[0].data_ptr<float>();
    float a = call.param<Params>().alpha;
    for (int64_t i = 0; i < call.outputs[0].numel(); ++i) out[i] = a * x[i] + y[i];
  });
  Tensor x = arange(4, kFloat32), y = ones({4});
  Tensor out = empty({4});
  Params p{3};
  const Tensor ins[2] = {x, y};
  run_kernel(axpy, kFloat32, KernelCall{ins, {&out, 1}, &p});
  EXPECT_TRUE(all_close(out, {1, 4, 7, 10}, 0, 0));
  try {
    Tensor d = empty({4}, kFloat64);
    run_kernel(axpy, kFloat64, KernelCall{ins, {&d, 1}, &p});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_axpy"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos);
  }
}

TEST(Registry, KernelOutOfScratchMemoryRaisesError) {
  // a kernel whose own buffers (sort scratch, partial sums) cannot be allocated reports an
  // Error naming the op, not a bare std::bad_alloc
  OpId op = ext::register_op("test_scratch_hungry", 1, false);
  ext::register_kernel(op, DeviceType::CPU, kFloat32, [](const KernelCall&) { throw std::bad_alloc(); });
  ext::register_kernel(op, DeviceType::CPU, kFloat64, [](const KernelCall&) {
    std::vector<float>(std::numeric_limits<size_t>::max() / 2);  // throws std::length_error
  });
  for (DType t : {kFloat32, kFloat64}) {
    Tensor x = zeros({2}, t), out = empty({2}, t);
    try {
      run_kernel(op, t, KernelCall{{&x, 1}, {&out, 1}, nullptr});
      FAIL() << "no error for " << fmt::format("{}", t);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[test_scratch_hungry]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("scratch"), std::string::npos) << e.what();
    }
  }
}

// A kernel overridden from one thread while another runs it: the running call keeps the old
// function (and what it captured) alive to its end. Under AddressSanitizer a freed function
// would be reported; here every call also checks that its captured state is whole.
TEST(Registry, OverrideWhileAnotherThreadRuns) {
  OpId op = ext::register_op("test_override_race", 1, false);
  auto kernel = [](int64_t value) {
    auto state = std::make_shared<std::vector<int64_t>>(64, value);
    return [state](const KernelCall& call) {
      int64_t sum = 0;
      for (int64_t v : *state) sum += v;
      call.outputs[0].data_ptr<int64_t>()[0] = sum / 64;
    };
  };
  ext::register_kernel(op, DeviceType::CPU, kInt64, kernel(0));
  std::atomic<bool> done{false};
  std::thread overrider([&] {
    for (int64_t i = 1; i <= 2000; ++i) ext::register_kernel(op, DeviceType::CPU, kInt64, kernel(i));
    done = true;
  });
  Tensor x = zeros({1}, kInt64), out = zeros({1}, kInt64);
  int64_t last = 0, calls = 0;
  while (!done || calls < 100) {
    run_kernel(op, kInt64, KernelCall{{&x, 1}, {&out, 1}, nullptr});
    const int64_t v = out.item<int64_t>();
    ASSERT_GE(v, last);  // one of the registered values, never a torn or freed one
    ASSERT_LE(v, 2000);
    last = v;
    ++calls;
  }
  overrider.join();
  // names and infos taken before more ops are registered stay valid
  const std::string_view name = op_name(op);
  const OpInfo& info = op_info(op);
  for (int i = 0; i < 300; ++i) ext::register_op("test_many_ops_" + std::to_string(i), 1, false);
  EXPECT_EQ(name, "test_override_race");
  EXPECT_EQ(info.name, "test_override_race");
}

TEST(Registry, ObserverSeesEveryKernel) {
  struct Counter : OpObserver {
    std::vector<std::string> begun;
    int ended = 0;
    void on_begin(OpId op, const KernelCall&) override { begun.emplace_back(op_name(op)); }
    void on_end(OpId, const KernelCall&) override { ++ended; }
  } counter;
  Tensor a = ones({4});
  set_op_observer(&counter);
  Tensor b = exp(a) + a;
  set_op_observer(nullptr);
  EXPECT_EQ(counter.begun, (std::vector<std::string>{"exp", "add"}));
  EXPECT_EQ(counter.ended, 2);
}

TEST(Registry, ObserverEndsAKernelThatRaises) {
  struct Counter : OpObserver {
    int begun = 0, ended = 0;
    void on_begin(OpId, const KernelCall&) override { ++begun; }
    void on_end(OpId, const KernelCall&) override { ++ended; }
  } counter;
  const OpId op = ext::register_op("test_observed_failure", 1);
  ext::register_kernel(op, DeviceType::CPU, kFloat32, [](const KernelCall&) { throw std::bad_alloc(); });
  Tensor a = ones({4}), out = empty({4});
  set_op_observer(&counter);
  EXPECT_THROW(run_kernel(op, kFloat32, KernelCall{{&a, 1}, {&out, 1}}), Error);  // bad_alloc becomes an Error
  set_op_observer(nullptr);
  EXPECT_EQ(counter.begun, 1);
  EXPECT_EQ(counter.ended, 1);
}
