// RNN, LSTM and GRU, and their cells, on CUDA against the CPU on fresh random inputs: outputs,
// final states and the gradients of the input, the initial states and every parameter, in float32
// and float64; several layers, bidirectional, batch_first, without bias, and dropout between
// layers in training (its masks depend on the generator's state only, not on the device).
// Skipped without a GPU.
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
    Pass pass{{out.output, out.h_n}, {}};
    if (lstm) pass.results.push_back(out.c_n);
    if (cotangents.empty())
      for (const Tensor& r : pass.results) cotangents.push_back(random(r.shape(), dt));
    std::vector<Tensor> placed;
    for (const Tensor& t : cotangents) placed.push_back(place(t));
    weighted_total(pass.results, placed).backward();
    for (const Tensor& t : inputs) pass.grads.push_back(t.grad());
    for (const Tensor& p : m->parameters()) pass.grads.push_back(p.grad());
    return pass;
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
