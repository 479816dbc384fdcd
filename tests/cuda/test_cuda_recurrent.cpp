// RNN, LSTM and GRU, and their cells, on CUDA against the CPU on fresh random inputs: outputs,
// final states and the gradients of the input, the initial states and every parameter, in float32
// and float64; several layers, bidirectional, batch_first, without bias, and dropout between
// layers in training (its masks depend on the generator's state only, not on the device); packed
// batches and LSTM's proj_size. Skipped without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "cuda/cuda_testing.h"

namespace st = strata;
namespace nn = strata::nn;
using st::DType;
using st::Tensor;
using st::cuda_testing::gpu;
using st::cuda_testing::random;

namespace {

enum class Kind { RnnTanh, RnnRelu, Lstm, Gru };
const Kind kKinds[] = {Kind::RnnTanh, Kind::RnnRelu, Kind::Lstm, Kind::Gru};
const char* kind_name(Kind k) {
  return k == Kind::RnnTanh ? "RNN tanh" : k == Kind::RnnRelu ? "RNN relu" : k == Kind::Lstm ? "LSTM" : "GRU";
}

constexpr int64_t kIn = 5, kHidden = 6;

// Relative to max(1, |CPU value|): the GPU sums the matmuls in another order.
double tol(DType t) { return t == st::kFloat64 ? 1e-10 : 1e-4; }

// A leaf that requires grad, sharing t's memory.
Tensor leaf(const Tensor& t) {
  Tensor l = t.detach();
  l.requires_grad_();
  return l;
}

std::unique_ptr<nn::RNNBase> make_layer(Kind kind, const nn::RecurrentOptions& o) {
  if (kind == Kind::Lstm) return std::make_unique<nn::LSTM>(kIn, kHidden, o);
  if (kind == Kind::Gru) return std::make_unique<nn::GRU>(kIn, kHidden, o);
  const nn::RNNOptions rnn{o.num_layers, kind == Kind::RnnRelu ? "relu" : "tanh", o.bias, o.batch_first, o.dropout,
                           o.bidirectional, o.generator};
  return std::make_unique<nn::RNN>(kIn, kHidden, rnn);
}

std::unique_ptr<nn::RNNCellBase> make_cell(Kind kind, st::Generator* gen) {
  if (kind == Kind::Lstm) return std::make_unique<nn::LSTMCell>(kIn, kHidden, nn::LSTMCellOptions{true, gen});
  if (kind == Kind::Gru) return std::make_unique<nn::GRUCell>(kIn, kHidden, nn::GRUCellOptions{true, gen});
  return std::make_unique<nn::RNNCell>(kIn, kHidden,
                                       nn::RNNCellOptions{true, kind == Kind::RnnRelu ? "relu" : "tanh", gen});
}

// One forward and backward: the results, then the gradients of the inputs and of every parameter.
struct Pass {
  std::vector<Tensor> results;
  std::vector<Tensor> grads;
};

// sum(result * cotangent) over all results, so that each result gets its own random cotangent.
Tensor weighted_total(const std::vector<Tensor>& results, const std::vector<Tensor>& cotangents) {
  Tensor total = (results[0] * cotangents[0]).sum();
  for (size_t i = 1; i < results.size(); ++i) total = total + (results[i] * cotangents[i]).sum();
  return total;
}

// The pass of a layer's results: backward from a weighted total with random cotangents (drawn on
// the first call, the same on both devices), then the gradients of the inputs and parameters.
Pass backward_pass(const std::vector<Tensor>& results, const std::vector<Tensor>& inputs, nn::Module& m,
                   std::vector<Tensor>& cotangents, DType dt, bool on_gpu) {
  if (cotangents.empty())
    for (const Tensor& r : results) cotangents.push_back(random(r.shape(), dt));
  std::vector<Tensor> placed;
  for (const Tensor& t : cotangents) placed.push_back(on_gpu ? gpu(t) : t);
  weighted_total(results, placed).backward();
  Pass pass{results, {}};
  for (const Tensor& t : inputs) pass.grads.push_back(t.grad());
  for (const Tensor& p : m.parameters()) pass.grads.push_back(p.grad());
  return pass;
}

void compare(const Pass& cpu, const Pass& cuda, DType dt) {
  ASSERT_EQ(cpu.results.size(), cuda.results.size());
  ASSERT_EQ(cpu.grads.size(), cuda.grads.size());
  for (size_t i = 0; i < cpu.results.size(); ++i)
    st::cuda_testing::expect_close(cpu.results[i], cuda.results[i], "result " + std::to_string(i), tol(dt));
  for (size_t i = 0; i < cpu.grads.size(); ++i)
    st::cuda_testing::expect_close(cpu.grads[i], cuda.grads[i], "gradient " + std::to_string(i), tol(dt));
}

struct LayerCase {
  nn::RecurrentOptions options;
  bool initial_state;
  bool training;
};

void check_layer(Kind kind, DType dt, const LayerCase& c) {
  const bool lstm = kind == Kind::Lstm;
  const nn::RecurrentOptions& o = c.options;
  const int64_t L = 7, N = 3, S = o.num_layers * (o.bidirectional ? 2 : 1);
  const Tensor x = random(o.batch_first ? st::Shape{N, L, kIn} : st::Shape{L, N, kIn}, dt);
  const Tensor h0 = random({S, N, kHidden}, dt), c0 = random({S, N, kHidden}, dt);
  std::vector<Tensor> cotangents;
  auto run = [&](bool on_gpu) {
    st::Generator gen(1234);  // the same initial values and dropout masks on both devices
    nn::RecurrentOptions with_gen = o;
    with_gen.generator = &gen;
    std::unique_ptr<nn::RNNBase> m = make_layer(kind, with_gen);
    m->to(on_gpu ? st::Device::cuda() : st::Device::cpu(), dt);
    m->train(c.training);
    auto place = [&](const Tensor& t) { return on_gpu ? gpu(t) : t; };
    std::vector<Tensor> inputs = {leaf(place(x))};
    if (c.initial_state) inputs.push_back(leaf(place(h0)));
    if (c.initial_state && lstm) inputs.push_back(leaf(place(c0)));
    const nn::RNNOutput out = m->forward_with_state(inputs[0], c.initial_state ? inputs[1] : Tensor(),
                                                    c.initial_state && lstm ? inputs[2] : Tensor());
    std::vector<Tensor> results = {out.output, out.h_n};
    if (lstm) results.push_back(out.c_n);
    return backward_pass(results, inputs, *m, cotangents, dt, on_gpu);
  };
  const Pass cpu = run(false);
  const Pass cuda = run(true);
  compare(cpu, cuda, dt);
}

void check_cell(Kind kind, DType dt) {
  const bool lstm = kind == Kind::Lstm;
  const int64_t N = 4;
  const Tensor x = random({N, kIn}, dt), h = random({N, kHidden}, dt), c = random({N, kHidden}, dt);
  const Tensor gh = random({N, kHidden}, dt), gc = random({N, kHidden}, dt);
  auto run = [&](bool on_gpu) {
    st::Generator gen(4321);
    std::unique_ptr<nn::RNNCellBase> cell = make_cell(kind, &gen);
    cell->to(on_gpu ? st::Device::cuda() : st::Device::cpu(), dt);
    auto place = [&](const Tensor& t) { return on_gpu ? gpu(t) : t; };
    std::vector<Tensor> inputs = {leaf(place(x)), leaf(place(h))};
    if (lstm) inputs.push_back(leaf(place(c)));
    Pass pass;
    if (lstm) {
      auto& lstm_cell = dynamic_cast<nn::LSTMCell&>(*cell);
      const nn::LSTMState next = lstm_cell.forward_with_state(inputs[0], inputs[1], inputs[2]);
      pass.results = {next.h, next.c};
    } else if (kind == Kind::Gru) {
      pass.results = {dynamic_cast<nn::GRUCell&>(*cell).forward(inputs[0], inputs[1])};
    } else {
      pass.results = {dynamic_cast<nn::RNNCell&>(*cell).forward(inputs[0], inputs[1])};
    }
    std::vector<Tensor> cotangents = {place(gh), place(gc)};
    cotangents.resize(pass.results.size());
    weighted_total(pass.results, cotangents).backward();
    for (const Tensor& t : inputs) pass.grads.push_back(t.grad());
    for (const Tensor& p : cell->parameters()) pass.grads.push_back(p.grad());
    return pass;
  };
  const Pass cpu = run(false);
  const Pass cuda = run(true);
  compare(cpu, cuda, dt);
}

}  // namespace

TEST(CudaRecurrent, LstmGruRnnMatchCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  const std::vector<LayerCase> cases = {
      {{.num_layers = 2, .bidirectional = true}, true, false},
      {{.num_layers = 3, .bias = false, .batch_first = true, .dropout = 0.3}, true, true},
      {{.batch_first = true, .bidirectional = true}, false, true},
  };
  for (DType dt : {st::kFloat32, st::kFloat64})
    for (Kind kind : kKinds) {
      for (size_t i = 0; i < cases.size(); ++i) {
        SCOPED_TRACE(std::string(kind_name(kind)) + " " + std::string(st::dtype_name(dt)) + " case " +
                     std::to_string(i));
        check_layer(kind, dt, cases[i]);
      }
      SCOPED_TRACE(std::string(kind_name(kind)) + " cell " + std::string(st::dtype_name(dt)));
      check_cell(kind, dt);
    }
}

TEST(CudaRecurrent, PackedBatchAndProjectionMatchCpu) {
  // an unsorted packed batch through a bidirectional LSTM with proj_size and a GRU: the packed
  // output, the final states and every gradient
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  st::cuda::set_allow_tf32(false);
  namespace R = nn::utils::rnn;
  const std::vector<int64_t> lengths = {3, 7, 1, 5};
  for (DType dt : {st::kFloat32, st::kFloat64})
    for (bool lstm : {true, false}) {
      SCOPED_TRACE(std::string(lstm ? "LSTM proj_size 2 " : "GRU ") + std::string(st::dtype_name(dt)));
      const nn::RecurrentOptions o{.num_layers = 2, .bidirectional = true, .proj_size = lstm ? 2 : 0};
      const int64_t h_size = lstm ? 2 : kHidden;
      const Tensor x = random({7, 4, kIn}, dt), h0 = random({4, 4, h_size}, dt), c0 = random({4, 4, kHidden}, dt);
      std::vector<Tensor> cotangents;
      auto run = [&](bool on_gpu) {
        st::Generator gen(99);
        nn::RecurrentOptions with_gen = o;
        with_gen.generator = &gen;
        std::unique_ptr<nn::RNNBase> m = lstm ? make_layer(Kind::Lstm, with_gen) : make_layer(Kind::Gru, with_gen);
        m->to(on_gpu ? st::Device::cuda() : st::Device::cpu(), dt);
        auto place = [&](const Tensor& t) { return on_gpu ? gpu(t) : t; };
        std::vector<Tensor> inputs = {leaf(place(x)), leaf(place(h0))};
        if (lstm) inputs.push_back(leaf(place(c0)));
        const nn::PackedRNNOutput out = m->forward_with_state(R::pack_padded_sequence(inputs[0], lengths, false, false),
                                                              inputs[1], lstm ? inputs[2] : Tensor());
        std::vector<Tensor> results = {out.output.data, out.h_n};
        if (lstm) results.push_back(out.c_n);
        return backward_pass(results, inputs, *m, cotangents, dt, on_gpu);
      };
      const Pass cpu = run(false);
      const Pass cuda = run(true);
      compare(cpu, cuda, dt);
    }
}
