// Every optimizer on CUDA parameters against the same optimizer on CPU parameters: 50 steps
// over fresh random gradients, parameters of odd sizes (empty, one element, several chunks of
// the multi-tensor kernels, a group of 40 that takes two launches), three groups with their
// own options (weight decay on and off), one parameter that skips steps (so the tensors of a
// launch are at different step counts) and one grad in transposed memory. 8-bit Adam's states
// match the CPU's within one quantization step. Also: state dicts across devices, LAMB's trust
// ratios, gradient clipping. Without a GPU every test is skipped.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <strata/kernels/common/quant8.h>

#include "cuda/cuda_testing.h"
#include "testing.h"

namespace strata {
namespace {

using cuda_testing::gpu;
using testing::values;

constexpr int kSteps = 50;

struct Tolerance {
  double rtol, atol;
};

// float32 parameters: the GPU computes in float, the CPU in double, so results differ by a few
// float roundings per step; float64 agrees to about the last digits.
Tolerance param_tol(DType dt) { return dt == kFloat32 ? Tolerance{1e-4, 2e-5} : Tolerance{1e-9, 1e-11}; }

// Parameters 0-3 in group 0 ({40001}: three chunks, skips every fifth step; {129, 130}: its grad
// comes transposed), 4-7 in group 1 (the first empty: its states have no memory, and the
// group's momentum or centering must not be read from them), and 40 small ones in group 2.
struct ParamSetup {
  std::vector<Shape> shapes;
  std::vector<size_t> group;
};

ParamSetup make_setup() {
  ParamSetup s;
  s.shapes = {{7, 13}, {40001}, {0, 3}, {129, 130}, {0}, {5}, {300, 70}, {1}};
  s.group = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int k = 0; k < 40; ++k) {
    s.shapes.push_back({2 * k + 1});
    s.group.push_back(2);
  }
  return s;
}

template <class Options>
std::vector<optim::ParamGroup<Options>> groups_of(const ParamSetup& s, const std::vector<Tensor>& ps,
                                                  const std::vector<Options>& opts) {
  std::vector<optim::ParamGroup<Options>> groups;
  for (size_t g = 0; g < opts.size(); ++g) groups.emplace_back(std::vector<Tensor>{}, opts[g]);
  for (size_t i = 0; i < ps.size(); ++i) groups[s.group[i]].params.push_back(ps[i]);
  return groups;
}

// The same parameters on the CPU and on the GPU, both leaves that require grad.
struct Twins {
  std::vector<Tensor> cpu, cuda;
};

Twins make_twins(const ParamSetup& s, DType dt) {
  Twins t;
  for (const Shape& shape : s.shapes) {
    Tensor p = cuda_testing::random(shape, dt);
    t.cuda.push_back(gpu(p).requires_grad_());
    t.cpu.push_back(p.requires_grad_());
  }
  return t;
}

// One step's grads: the same fresh values on both devices (none for parameter 1 every fifth step).
void set_grads(const ParamSetup& s, const Twins& t, int step) {
  for (size_t i = 0; i < s.shapes.size(); ++i) {
    if (i == 1 && step % 5 == 3) {
      t.cpu[i].set_grad(Tensor());
      t.cuda[i].set_grad(Tensor());
      continue;
    }
    const double scale = 0.5 + 0.25 * static_cast<double>(i % 4);
    Tensor g = cuda_testing::random(s.shapes[i], t.cpu[i].dtype(), -scale, scale);
    t.cpu[i].set_grad(g);
    t.cuda[i].set_grad(i == 3 ? testing::with_layout(gpu(g), testing::Layout::Transposed) : gpu(g));
  }
}

void expect_params_close(const Twins& t, Tolerance tol) {
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    EXPECT_TRUE(t.cuda[i].device().is_cuda());
    EXPECT_TRUE(testing::all_close(values(t.cuda[i]), values(t.cpu[i]), tol.rtol, tol.atol));
  }
}

// Every state tensor of the CPU optimizer exists on the GPU optimizer, on the device, close.
void expect_states_close(const optim::Optimizer& cpu_opt, const optim::Optimizer& cuda_opt, const Twins& t,
                         Tolerance tol) {
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    const optim::ParamState* a = cpu_opt.state(t.cpu[i]);
    const optim::ParamState* b = cuda_opt.state(t.cuda[i]);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->step, b->step);
    EXPECT_EQ(a->tensors.size(), b->tensors.size());
    for (const auto& [name, want] : a->tensors) {
      SCOPED_TRACE("state " + name);
      auto it = b->tensors.find(name);
      ASSERT_NE(it, b->tensors.end());
      EXPECT_TRUE(it->second.device().is_cuda());
      EXPECT_TRUE(testing::all_close(values(it->second), values(want), tol.rtol, tol.atol));
    }
  }
}

// Runs Opt with `opts` on both devices for kSteps steps and compares parameters and states.
template <class Opt, class Options>
void check_optimizer(const std::vector<Options>& opts, bool compare_states = true) {
  for (DType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const ParamSetup s = make_setup();
    Twins t = make_twins(s, dt);
    Opt cpu_opt(groups_of(s, t.cpu, opts)), cuda_opt(groups_of(s, t.cuda, opts));
    for (int step = 0; step < kSteps; ++step) {
      set_grads(s, t, step);
      cpu_opt.step();
      cuda_opt.step();
    }
    expect_params_close(t, param_tol(dt));
    if (compare_states) expect_states_close(cpu_opt, cuda_opt, t, param_tol(dt));
  }
}

}  // namespace

TEST(CudaOptim, SGD) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  check_optimizer<optim::SGD>(std::vector<optim::SGDOptions>{
      {.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-2},
      {.lr = 0.05, .momentum = 0.9, .nesterov = true},
      {.lr = 0.1, .weight_decay = 1e-3, .maximize = true}});
}

TEST(CudaOptim, Adam) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  check_optimizer<optim::Adam>(std::vector<optim::AdamOptions>{
      {.lr = 1e-2, .weight_decay = 1e-2}, {.lr = 1e-2, .amsgrad = true, .maximize = true}, {.lr = 3e-3}});
}

TEST(CudaOptim, AdamW) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  check_optimizer<optim::AdamW>(std::vector<optim::AdamWOptions>{
      {.lr = 1e-2, .weight_decay = 0.1}, {.lr = 1e-2, .weight_decay = 0, .amsgrad = true}, {}});
}

TEST(CudaOptim, LAMB) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  check_optimizer<optim::LAMB>(std::vector<optim::LAMBOptions>{
      {.lr = 1e-2, .weight_decay = 1e-2},
      {.lr = 1e-2, .bias_correction = false, .clamp_min = 0.1, .clamp_max = 5},
      {.lr = 5e-3, .maximize = true}});
}

TEST(CudaOptim, LAMBTrustRatios) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const ParamSetup s = make_setup();
  Twins t = make_twins(s, kFloat32);
  std::vector<optim::LAMBOptions> opts(3, optim::LAMBOptions{.lr = 1e-2, .weight_decay = 1e-2});
  optim::LAMB cpu_opt(groups_of(s, t.cpu, opts)), cuda_opt(groups_of(s, t.cuda, opts));
  for (int step = 0; step < 3; ++step) {
    set_grads(s, t, step);
    cpu_opt.step();
    cuda_opt.step();
  }
  for (size_t i = 0; i < t.cpu.size(); ++i)
    EXPECT_NEAR(cuda_opt.last_trust_ratio(t.cuda[i]), cpu_opt.last_trust_ratio(t.cpu[i]),
                1e-5 * std::max(1.0, cpu_opt.last_trust_ratio(t.cpu[i])))
        << "parameter " << i;
  EXPECT_EQ(cuda_opt.last_trust_ratio(t.cuda[2]), 1.0);  // empty: both norms are 0
}

TEST(CudaOptim, Adagrad) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  check_optimizer<optim::Adagrad>(std::vector<optim::AdagradOptions>{
      {.lr = 0.05, .lr_decay = 0.01, .weight_decay = 1e-2, .initial_accumulator_value = 0.1},
      {.lr = 0.05},
      {.lr = 0.02, .maximize = true}});
}

TEST(CudaOptim, RMSprop) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  check_optimizer<optim::RMSprop>(std::vector<optim::RMSpropOptions>{
      {.lr = 1e-3, .weight_decay = 1e-2, .momentum = 0.9, .centered = true},
      {.lr = 1e-3, .centered = true},
      {.lr = 1e-3, .momentum = 0.5, .maximize = true}});
  check_optimizer<optim::RMSprop>(std::vector<optim::RMSpropOptions>{{.lr = 1e-3}, {.lr = 2e-3}, {.lr = 1e-3}});
}

// The optimizers without a device kernel update CUDA parameters through host copies.
TEST(CudaOptim, HostUpdatedOptimizers) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  check_optimizer<optim::NAdam>(std::vector<optim::NAdamOptions>{
      {.weight_decay = 1e-2}, {.decoupled_weight_decay = true}, {.maximize = true}});
  check_optimizer<optim::RAdam>(std::vector<optim::RAdamOptions>{{.weight_decay = 1e-2}, {}, {.maximize = true}});
  check_optimizer<optim::Adamax>(std::vector<optim::AdamaxOptions>{{.weight_decay = 1e-2}, {}, {.maximize = true}});
  check_optimizer<optim::Adadelta>(std::vector<optim::AdadeltaOptions>{{.weight_decay = 1e-2}, {}, {.maximize = true}});
}

// Codes and scales as the CPU stores them: the dequantized moments of the two runs differ by at
// most one quantization step (the gap between neighbouring codes, scaled by the block's absmax),
// and nearly all codes are identical, since both devices run the same float math.
TEST(CudaOptim, Adam8bit) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  float signed_map[256], unsigned_map[256];
  quant8::build_dynamic_map(signed_map, true);
  quant8::build_dynamic_map(unsigned_map, false);
  // group 0: blocks of 2048 for the two large parameters; group 1: blocks of 256 for {300, 70};
  // group 2: blocks of 100 (not a multiple of a warp), every parameter quantized
  const std::vector<optim::Adam8bitOptions> opts{{.lr = 1e-2, .weight_decay = 1e-2},
                                                 {.lr = 1e-2, .min_8bit_size = 100, .block_size = 256},
                                                 {.lr = 5e-3, .maximize = true, .min_8bit_size = 1, .block_size = 100}};
  for (DType dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const ParamSetup s = make_setup();
    Twins t = make_twins(s, dt);
    optim::Adam8bit cpu_opt(groups_of(s, t.cpu, opts)), cuda_opt(groups_of(s, t.cuda, opts));
    for (int step = 0; step < kSteps; ++step) {
      set_grads(s, t, step);
      cpu_opt.step();
      cuda_opt.step();
    }
    int64_t codes = 0, same_codes = 0;
    for (size_t i = 0; i < t.cpu.size(); ++i) {
      SCOPED_TRACE("parameter " + std::to_string(i));
      ASSERT_EQ(cpu_opt.is_quantized(t.cpu[i]), cuda_opt.is_quantized(t.cuda[i]));
      if (!cpu_opt.is_quantized(t.cpu[i])) {
        EXPECT_TRUE(testing::all_close(values(t.cuda[i]), values(t.cpu[i]), param_tol(dt).rtol, param_tol(dt).atol));
        continue;
      }
      const optim::ParamState& a = *cpu_opt.state(t.cpu[i]);
      const optim::ParamState& b = *cuda_opt.state(t.cuda[i]);
      const int64_t block = opts[s.group[i]].block_size;
      for (const char* m : {"exp_avg", "exp_avg_sq"}) {
        const float* map = std::string(m) == "exp_avg" ? signed_map : unsigned_map;
        const std::vector<double> ca = values(a.tensors.at(std::string(m) + "_codes")),
                                  cb = values(b.tensors.at(std::string(m) + "_codes")),
                                  sa = values(a.tensors.at(std::string(m) + "_absmax")),
                                  sb = values(b.tensors.at(std::string(m) + "_absmax"));
        EXPECT_TRUE(b.tensors.at(std::string(m) + "_codes").device().is_cuda());
        ASSERT_EQ(ca.size(), cb.size());
        int bad = 0;
        for (size_t j = 0; j < ca.size() && bad < 5; ++j) {
          const int c = static_cast<int>(ca[j]);
          const double scale = sa[j / block];
          const double gap = std::max(c < 255 ? map[c + 1] - map[c] : 0.0f, c > 0 ? map[c] - map[c - 1] : 0.0f);
          const double x = map[c] * scale, y = map[static_cast<int>(cb[j])] * sb[j / block];
          ++codes;
          same_codes += ca[j] == cb[j];
          if (std::fabs(x - y) > 1.001 * gap * scale + 1e-7 * scale) {
            ADD_FAILURE() << m << " element " << j << ": cpu " << x << " (code " << c << ") cuda " << y << " (code "
                          << cb[j] << ")";
            ++bad;
          }
        }
      }
      // one code apart moves the update by a fraction of lr: the parameters stay close
      EXPECT_TRUE(testing::all_close(values(t.cuda[i]), values(t.cpu[i]), 0, 0.05 * opts[s.group[i]].lr * kSteps));
    }
    EXPECT_GE(same_codes, codes - codes / 100) << same_codes << " of " << codes << " codes identical";
  }
}

// The CPU optimizer's state continues a run on the GPU (moved to the device on load), and the
// GPU's state dict loads back into a CPU optimizer.
TEST(CudaOptim, StateDictAcrossDevices) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const ParamSetup s = make_setup();
  Twins t = make_twins(s, kFloat32);
  const std::vector<optim::AdamWOptions> opts(3, optim::AdamWOptions{.lr = 1e-2, .amsgrad = true});
  optim::AdamW cpu_opt(groups_of(s, t.cpu, opts));
  for (int step = 0; step < 5; ++step) {
    set_grads(s, t, step);
    cpu_opt.step();
  }
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    NoGradGuard no_grad;
    t.cuda[i].copy_(t.cpu[i]);
  }
  optim::AdamW cuda_opt(groups_of(s, t.cuda, opts));
  cuda_opt.load_state_dict(cpu_opt.state_dict());
  for (int step = 5; step < 15; ++step) {
    set_grads(s, t, step);
    cpu_opt.step();
    cuda_opt.step();
  }
  expect_params_close(t, param_tol(kFloat32));
  expect_states_close(cpu_opt, cuda_opt, t, param_tol(kFloat32));

  const optim::StateDict d = cuda_opt.state_dict();
  for (const auto& [key, tensor] : d.tensors) EXPECT_TRUE(tensor.device().is_cuda()) << key;
  optim::AdamW back(groups_of(s, t.cpu, opts));
  back.load_state_dict(d);
  expect_states_close(back, cuda_opt, t, Tolerance{0, 0});
}

// A parameter moved to the GPU after some steps (as Module::to moves it, keeping its identity)
// takes its state along at the next step.
TEST(CudaOptim, StateFollowsTheParameter) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  Tensor p = cuda_testing::random({70001}, kFloat32).requires_grad_();
  Tensor twin = p.detach().clone().requires_grad_();
  optim::AdamW opt({p}, {.lr = 1e-2}), ref({twin}, {.lr = 1e-2});
  std::vector<Tensor> grads;
  for (int step = 0; step < 6; ++step) grads.push_back(cuda_testing::random({70001}, kFloat32));
  for (int step = 0; step < 6; ++step) {
    if (step == 3) p.set_data(gpu(p.detach()));
    p.set_grad(step >= 3 ? gpu(grads[step]) : grads[step]);
    twin.set_grad(grads[step]);
    opt.step();
    ref.step();
  }
  EXPECT_TRUE(p.device().is_cuda());
  for (const auto& [name, t] : opt.state(p)->tensors) EXPECT_TRUE(t.device().is_cuda()) << name;
  EXPECT_TRUE(testing::all_close(values(p), values(twin), 1e-4, 2e-5));
}

// A channels-last CUDA parameter (conv weights after Module::to(MemoryFormat::ChannelsLast))
// against its contiguous CPU twin, grads in either layout: the multi-tensor kernels run over
// the parameter's memory with its grad and states laid out alike (Note [Parameter layouts]).
TEST(CudaOptim, ChannelsLastParameters) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const Shape shape{16, 8, 3, 3};
  Tensor twin = cuda_testing::random(shape, kFloat32);
  Tensor p = gpu(twin).to(MemoryFormat::ChannelsLast), q = gpu(twin).to(MemoryFormat::ChannelsLast);
  twin.requires_grad_();
  p.requires_grad_();
  q.requires_grad_();
  Tensor twin2 = twin.detach().clone().requires_grad_();
  optim::SGD sgd({p}, {.lr = 1e-2, .momentum = 0.9}), sgd_ref({twin}, {.lr = 1e-2, .momentum = 0.9});
  optim::AdamW adamw({q}, {.lr = 1e-2}), adamw_ref({twin2}, {.lr = 1e-2});
  for (int step = 0; step < 5; ++step) {
    const Tensor g = cuda_testing::random(shape, kFloat32);
    const Tensor on_gpu = step % 2 ? gpu(g).to(MemoryFormat::ChannelsLast) : gpu(g);
    p.set_grad(on_gpu.clone());
    q.set_grad(on_gpu.clone());
    twin.set_grad(g.clone());
    twin2.set_grad(g.clone());
    sgd.step();
    sgd_ref.step();
    adamw.step();
    adamw_ref.step();
  }
  EXPECT_TRUE(p.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(testing::all_close(values(p), values(twin), 1e-5, 1e-6));
  EXPECT_TRUE(testing::all_close(values(q), values(twin2), 1e-4, 2e-5));
  for (const auto& [name, t] : adamw.state(q)->tensors)
    EXPECT_TRUE(testing::all_close(values(t), values(adamw_ref.state(twin2)->tensors.at(name)), 1e-4, 1e-6)) << name;
}

// clip_grad_norm_ on CUDA grads: the same total and scaled grads as on the CPU.
TEST(CudaOptim, ClipGradNorm) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (double p : {1.0, 2.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE("norm_type " + std::to_string(p));
    const ParamSetup s = make_setup();
    Twins t = make_twins(s, kFloat32);
    set_grads(s, t, 3);  // parameter 1 has no grad at this step
    const double want = optim::total_grad_norm(t.cpu, p);
    EXPECT_NEAR(optim::total_grad_norm(t.cuda, p), want, 1e-5 * want);
    EXPECT_NEAR(optim::clip_grad_norm_(t.cuda, want / 3, p), want, 1e-5 * want);
    optim::clip_grad_norm_(t.cpu, want / 3, p);
    for (size_t i = 0; i < t.cpu.size(); ++i) {
      if (!t.cpu[i].grad().defined()) continue;
      EXPECT_TRUE(testing::all_close(values(t.cuda[i].grad()), values(t.cpu[i].grad()), 1e-5, 1e-7)) << i;
    }
  }
}

}  // namespace strata
