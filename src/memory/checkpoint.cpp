// Activation checkpointing: see include/strata/memory/checkpoint.hpp.
//
// Note [Checkpoint by saved-tensor hooks]
// The forward runs fn with the graph recorded as usual, under saved-tensor hooks whose pack
// drops each tensor an op saves and keeps only its position in the order of saves. The first
// unpack in the backward runs fn again on detached aliases of the inputs (requiring grad as
// the inputs did, so the same ops record and save the same tensors in the same order), with
// pack hooks that keep every saved tensor, detached; each unpack then hands back the tensor at
// its position. Gradients flow through the forward's own graph, so closed-over parameters get
// theirs and autograd::grad works, as torch's non-reentrant checkpoint. A checkpoint nested in
// fn packs its own saves in both runs, so the counts of the outer one still match. The
// recomputed graph is never run backward: its saved tensors are detached and its nodes dropped.
#include <strata/memory/checkpoint.hpp>

#include <any>
#include <memory>
#include <mutex>

#include <fmt/ranges.h>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/grad_mode.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/core/error.hpp>
#include <strata/nn/containers.hpp>
#include <strata/nn/module.hpp>

namespace strata::memory {

namespace {

struct AutocastState {
  bool enabled;
  DType dtype;
};

// What the backward needs to run fn again: the inputs and the state the forward ran in.
struct Frame {
  CheckpointFn fn;
  std::vector<Tensor> inputs;  // detached aliases: no link to the graph, which owns the frame
  std::vector<bool> input_requires_grad;
  std::vector<int64_t> input_versions;
  std::vector<Generator*> generators;
  std::vector<RandomDraw> rng_states;
  AutocastState autocast_cpu{}, autocast_cuda{};
  std::vector<autograd::TensorMeta> saved_meta;  // per save of the forward, in order
  std::vector<Tensor> recomputed;                // the same saves, from the recomputation
  bool recomputed_done = false;
  std::mutex mutex;  // the engine may unpack from more than one thread

  Tensor unpack(size_t index);
  void recompute();
};

// Puts generators back where they were when it was made.
class RngRestore {
 public:
  explicit RngRestore(const std::vector<Generator*>& gens) : gens_(gens) {
    for (Generator* g : gens_) states_.push_back(g->state());
  }
  ~RngRestore() {
    for (size_t i = 0; i < gens_.size(); ++i) gens_[i]->set_state(states_[i].seed, states_[i].offset);
  }
  RngRestore(const RngRestore&) = delete;
  RngRestore& operator=(const RngRestore&) = delete;

 private:
  std::vector<Generator*> gens_;
  std::vector<RandomDraw> states_;
};

Tensor Frame::unpack(size_t index) {
  STRATA_CHECK(!autograd::is_grad_enabled(),
               "[checkpoint] double backward (create_graph=true) through a checkpointed function is not supported");
  std::lock_guard<std::mutex> lock(mutex);
  if (!recomputed_done) recompute();
  return recomputed[index];
}

void Frame::recompute() {
  for (size_t i = 0; i < inputs.size(); ++i)
    STRATA_CHECK(!inputs[i].defined() || inputs[i].version() == input_versions[i],
                 "[checkpoint] input {} was modified by an in-place operation after the forward (version {}, "
                 "expected {}); the recomputation would see other values",
                 i, inputs[i].version(), input_versions[i]);
  std::vector<Tensor> xs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor x = inputs[i].defined() ? inputs[i].detach() : Tensor();
    if (x.defined() && input_requires_grad[i]) x.requires_grad_();
    xs.push_back(x);
  }
  std::vector<Tensor> saves;
  {
    RngRestore restore(generators);
    for (size_t i = 0; i < generators.size(); ++i) generators[i]->set_state(rng_states[i].seed, rng_states[i].offset);
    amp::AutocastGuard cpu(DeviceType::CPU, autocast_cpu.dtype, autocast_cpu.enabled);
    amp::AutocastGuard cuda(DeviceType::CUDA, autocast_cuda.dtype, autocast_cuda.enabled);
    EnableGradGuard grad(true);
    autograd::SavedTensorHooksGuard hooks(
        [&saves](const Tensor& t) -> std::any {
          saves.push_back(t.detach());
          return std::any();
        },
        [](const std::any&) -> Tensor {
          ::strata::detail::throw_error("[checkpoint] the recomputed graph is not meant to run backward");
        });
    fn(xs);
  }
  STRATA_CHECK(saves.size() == saved_meta.size(),
               "[checkpoint] the recomputation saved {} tensors for backward where the forward saved {}; the "
               "checkpointed function must run the same ops both times",
               saves.size(), saved_meta.size());
  for (size_t i = 0; i < saves.size(); ++i) {
    const autograd::TensorMeta& m = saved_meta[i];
    STRATA_CHECK(saves[i].shape() == m.shape && saves[i].dtype() == m.dtype && saves[i].device() == m.device,
                 "[checkpoint] saved tensor {} was {} ({}, {}) in the forward but {} ({}, {}) in the recomputation; "
                 "the checkpointed function must run the same ops both times",
                 i, m.shape, m.dtype, m.device, saves[i].shape(), saves[i].dtype(), saves[i].device());
  }
  recomputed = std::move(saves);
  recomputed_done = true;
}

}  // namespace

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  STRATA_CHECK(static_cast<bool>(fn), "[checkpoint] the function is empty");
  for (size_t i = 0; i < options.generators.size(); ++i)
    STRATA_CHECK(options.generators[i] != nullptr, "[checkpoint] options.generators[{}] is null", i);
  if (!autograd::is_grad_enabled()) {
    std::vector<Tensor> out = fn(inputs);
    STRATA_CHECK(!out.empty(), "[checkpoint] the function returned no tensors");
    return out;
  }
  auto frame = std::make_shared<Frame>();
  frame->fn = fn;
  for (const Tensor& t : inputs) {
    frame->inputs.push_back(t.defined() ? t.detach() : Tensor());
    frame->input_requires_grad.push_back(t.defined() && t.requires_grad());
    frame->input_versions.push_back(t.defined() ? t.version() : 0);
  }
  if (options.preserve_rng_state) {
    frame->generators.push_back(&default_generator());
    for (Generator* g : options.generators)
      if (g != &default_generator()) frame->generators.push_back(g);
    for (Generator* g : frame->generators) frame->rng_states.push_back(g->state());
  }
  frame->autocast_cpu = {amp::is_autocast_enabled(DeviceType::CPU), amp::autocast_dtype(DeviceType::CPU)};
  frame->autocast_cuda = {amp::is_autocast_enabled(DeviceType::CUDA), amp::autocast_dtype(DeviceType::CUDA)};

  std::vector<Tensor> out;
  {
    Frame* raw = frame.get();  // the pack hook dies with this scope; unpack hooks own the frame
    autograd::SavedTensorHooksGuard hooks(
        [raw](const Tensor& t) -> std::any {
          raw->saved_meta.push_back({t.shape(), t.dtype(), t.device()});
          return raw->saved_meta.size() - 1;
        },
        [frame](const std::any& packed) -> Tensor { return frame->unpack(std::any_cast<size_t>(packed)); });
    out = fn(inputs);
  }
  STRATA_CHECK(!out.empty(), "[checkpoint] the function returned no tensors");
  return out;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input,
                  const CheckpointOptions& options) {
  STRATA_CHECK(static_cast<bool>(fn), "[checkpoint] the function is empty");
  auto wrapped = [fn](const std::vector<Tensor>& xs) { return std::vector<Tensor>{fn(xs[0])}; };
  std::vector<Tensor> out = checkpoint(wrapped, std::vector<Tensor>{input}, options);
  STRATA_CHECK(out[0].defined(), "[checkpoint] the function returned an undefined tensor");
  return out[0];
}

Tensor checkpoint_sequential(const std::vector<nn::Module*>& modules, int64_t segments, const Tensor& input,
                             const CheckpointOptions& options) {
  const auto n = static_cast<int64_t>(modules.size());
  STRATA_CHECK(n > 0, "[checkpoint_sequential] no modules to run");
  STRATA_CHECK(segments >= 1 && segments <= n, "[checkpoint_sequential] segments must be in [1, {}] for {} modules, "
               "got {}", n, n, segments);
  for (int64_t i = 0; i < n; ++i)
    STRATA_CHECK(modules[static_cast<size_t>(i)] != nullptr, "[checkpoint_sequential] module {} is null", i);
  // each segment holds its own module pointers: the backward runs it after this call returns
  auto run = [&modules](int64_t begin, int64_t end) {
    std::vector<nn::Module*> part(modules.begin() + begin, modules.begin() + end);
    return [part](const Tensor& x) {
      Tensor h = x;
      for (nn::Module* m : part) h = (*m)(h);  // hooks run, in the recomputation too (as torch)
      return h;
    };
  };
  const int64_t size = n / segments;
  Tensor h = input;
  int64_t begin = 0;
  for (int64_t s = 0; s + 1 < segments; ++s, begin += size) h = checkpoint(run(begin, begin + size), h, options);
  return run(begin, n)(h);
}

Tensor checkpoint_sequential(nn::Sequential& sequential, int64_t segments, const Tensor& input,
                             const CheckpointOptions& options) {
  std::vector<nn::Module*> modules;
  for (size_t i = 0; i < sequential.size(); ++i) modules.push_back(&sequential[i]);
  return checkpoint_sequential(modules, segments, input, options);
}

}  // namespace strata::memory
