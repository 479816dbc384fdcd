// Module hooks on multi-input calls (Note [Hook forms]): attention inside a TransformerEncoderLayer
// in the order and with the shapes of PyTorch's layer, a pre-hook replacing the key against a
// call made with that key, backward hooks on a loss and on attention against autograd::grad (and
// the loss's against its formula in float64), recurrent (input, state) calls, global hooks,
// removal, and the errors of hooks returning the wrong number of tensors.
#include <map>
#include <string>
#include <vector>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::randn64;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

std::string shape_or_undefined(const Tensor& t) { return t.defined() ? fmt::format("{}", t.shape()) : "undefined"; }

std::vector<std::string> shapes(const std::vector<Tensor>& ts) {
  std::vector<std::string> out;
  for (const Tensor& t : ts) out.push_back(shape_or_undefined(t));
  return out;
}

nn::TransformerEncoderLayer small_layer() {
  nn::TransformerEncoderLayer layer(8, 2, {.dim_feedforward = 16, .dropout = 0});
  layer.to(kFloat64);
  return layer;
}

// A module of one's own with a two-input call, written as nn/module.hpp's call_hooked shows; its
// forward keeps a * b aside, so a gradient can reach the inputs without passing the output.
struct ProductKeeper : nn::Module {
  Tensor kept;
  using Module::forward;
  Tensor forward(const Tensor& a, const Tensor& b) {
    kept = a * b;
    return a + b;
  }
  using Module::operator();
  Tensor operator()(const Tensor& a, const Tensor& b) {
    if (!hooks_active()) return forward(a, b);
    return call_hooked({a, b}, [&](const std::vector<Tensor>& in) { return forward(in[0], in[1]); });
  }
};

}  // namespace

TEST(MultiInputHooks, FireForAttentionInsideAnEncoderLayerInOrderWithShapes) {
  Generator g(1);
  nn::TransformerEncoderLayer layer = small_layer();
  std::map<const nn::Module*, std::string> names;
  for (auto& [name, m] : layer.named_modules()) names[m] = name.empty() ? "layer" : name;
  std::vector<std::string> calls;
  nn::RemovableHandle global = nn::register_module_forward_pre_hook(
      [&](nn::Module& m, const std::vector<Tensor>&) { calls.push_back(names.count(&m) ? names[&m] : "?"); });
  std::vector<std::string> attn_inputs, attn_outputs;
  layer.self_attn.register_forward_hook([&](nn::Module&, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
    attn_inputs = shapes(in);
    attn_outputs = shapes(out);
  });
  Tensor x = randn64({5, 3, 8}, g), mask = randn64({5, 5}, g);
  Tensor y = layer(x, mask);
  global.remove();
  // torch.nn.TransformerEncoderLayer's post-norm order: x = norm1(x + dropout1(self_attn(x, x, x)));
  // x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))
  EXPECT_EQ(calls, (std::vector<std::string>{"layer", "self_attn", "self_attn.out_proj", "dropout1", "norm1",
                                             "linear1", "dropout", "linear2", "dropout2", "norm2"}));
  EXPECT_EQ(attn_inputs, (std::vector<std::string>{"[5, 3, 8]", "[5, 3, 8]", "[5, 3, 8]", "undefined", "[5, 5]"}));
  EXPECT_EQ(attn_outputs, std::vector<std::string>{"[5, 3, 8]"});
  // the hooks leave the result as it was
  EXPECT_TRUE(all_close(y, values(layer.forward(x, mask)), 0, 0));
}

TEST(MultiInputHooks, PreHookReplacingTheKeyEqualsACallWithThatKey) {
  Generator g(2);
  nn::MultiheadAttention attn(8, 2);
  attn.to(kFloat64);
  Tensor q = randn64({4, 2, 8}, g), k = randn64({6, 2, 8}, g), v = randn64({6, 2, 8}, g), k2 = randn64({6, 2, 8}, g);
  nn::RemovableHandle h = attn.register_forward_pre_hook([&](nn::Module&, std::vector<Tensor>& in) {
    EXPECT_EQ(in.size(), 5u);
    in[1] = k2;
  });
  const std::vector<double> with_k2 = values(attn.forward(q, k2, v)), with_k = values(attn.forward(q, k, v));
  EXPECT_TRUE(all_close(attn(q, k, v), with_k2, 0, 0));
  EXPECT_FALSE(all_close(attn(q, k, v), with_k, 1e-6, 0));  // the key matters
  h.remove();
  EXPECT_FALSE(attn.has_hooks());
  EXPECT_TRUE(all_close(attn(q, k, v), with_k, 0, 0));

  // a one-input hook on a multi-input call sees and replaces the first input (the query) and the output
  Tensor q2 = randn64({4, 2, 8}, g);
  Tensor seen_output;
  attn.register_forward_pre_hook([&](nn::Module&, const Tensor& query) {
    EXPECT_EQ(query.shape(), q.shape());
    return q2;
  });
  attn.register_forward_hook([&](nn::Module&, const Tensor& query, const Tensor& out) {
    EXPECT_TRUE(query.is_same(q2));
    seen_output = out;
    return out * 2.0;
  });
  Tensor y = attn(q, k, v);
  std::vector<double> want = values(attn.forward(q2, k, v));
  EXPECT_TRUE(all_close(seen_output, want, 0, 0));
  for (double& w : want) w *= 2;
  EXPECT_TRUE(all_close(y, want, 0, 0));
}

TEST(MultiInputHooks, BackwardHookOnALossGetsAutogradsGradients) {
  Generator g(3);
  nn::MSELoss mse;
  Tensor input = randn64({3, 4}, g).requires_grad_(), target = randn64({3, 4}, g);
  std::vector<Tensor> grad_inputs, grad_outputs;
  int calls = 0;
  mse.register_full_backward_hook([&](nn::Module&, std::vector<Tensor>& gi, const std::vector<Tensor>& go) {
    ++calls;
    grad_inputs = gi;
    grad_outputs = go;
  });
  mse(input, target).backward();
  ASSERT_EQ(calls, 1);
  ASSERT_EQ(grad_inputs.size(), 2u);
  EXPECT_FALSE(grad_inputs[1].defined());  // the target needs no gradient
  // d/dx mean((x - t)^2) = 2 (x - t) / n, in float64
  std::vector<double> want;
  const auto xv = values(input), tv = values(target);
  for (size_t i = 0; i < xv.size(); ++i) want.push_back(2 * (xv[i] - tv[i]) / 12.0);
  EXPECT_TRUE(all_close(grad_inputs[0], want, 1e-14, 0));
  EXPECT_TRUE(all_close(grad_outputs.at(0), {1.0}, 0, 0));

  // both inputs requiring grad: each hook gradient is autograd::grad's, and a replacement lands in .grad
  Tensor t = target.detach().requires_grad_();
  Tensor x = input.detach().requires_grad_();
  std::vector<Tensor> ref = autograd::grad({mse.forward(x, t)}, {x, t});
  mse.register_full_backward_hook([&](nn::Module&, const Tensor& grad_input, const Tensor&) {
    return grad_input * 3.0;  // the one-input form: the first input's
  });
  mse(x, t).backward();
  EXPECT_TRUE(all_close(grad_inputs[0], values(ref[0]), 1e-14, 0));
  EXPECT_TRUE(all_close(grad_inputs[1], values(ref[1]), 1e-14, 0));
  std::vector<double> tripled = values(ref[0]);
  for (double& v : tripled) v *= 3;
  EXPECT_TRUE(all_close(x.grad(), tripled, 1e-14, 0));
  EXPECT_TRUE(all_close(t.grad(), values(ref[1]), 1e-14, 0));
}

TEST(MultiInputHooks, BackwardHookOnAttentionGetsAutogradsGradients) {
  Generator g(4);
  nn::MultiheadAttention attn(8, 2);
  attn.to(kFloat64);
  Tensor q = randn64({4, 2, 8}, g).requires_grad_(), k = randn64({5, 2, 8}, g).requires_grad_();
  Tensor v = randn64({5, 2, 8}, g).requires_grad_(), w = randn64({4, 2, 8}, g);
  std::vector<Tensor> ref = autograd::grad({(attn.forward(q, k, v) * w).sum()}, {q, k, v});
  std::vector<Tensor> grad_inputs, grad_outputs;
  attn.register_full_backward_hook([&](nn::Module&, std::vector<Tensor>& gi, const std::vector<Tensor>& go) {
    grad_inputs = gi;
    grad_outputs = go;
    std::vector<Tensor> replaced = gi;
    replaced[1] = gi[1] * 2.0;  // the key's gradient, doubled
    return replaced;
  });
  (attn(q, k, v) * w).sum().backward();
  ASSERT_EQ(grad_inputs.size(), 5u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(all_close(grad_inputs[i], values(ref[i]), 1e-12, 0)) << i;
  EXPECT_FALSE(grad_inputs[3].defined());
  EXPECT_FALSE(grad_inputs[4].defined());
  EXPECT_TRUE(all_close(grad_outputs.at(0), values(w), 0, 0));
  EXPECT_TRUE(all_close(q.grad(), values(ref[0]), 1e-12, 0));
  std::vector<double> doubled = values(ref[1]);
  for (double& d : doubled) d *= 2;
  EXPECT_TRUE(all_close(k.grad(), doubled, 1e-12, 0));

  // self-attention passes x three times: three gradients, whose sum is x's
  Tensor x = randn64({4, 2, 8}, g).requires_grad_();
  std::vector<Tensor> ref_x = autograd::grad({(attn.forward(x, x, x) * w).sum()}, {x});
  grad_inputs.clear();
  attn.register_full_backward_hook([&](nn::Module&, std::vector<Tensor>& gi, const std::vector<Tensor>&) {
    gi[1] = gi[1] * 0.5;  // undoes the doubling above, in place
  });
  (attn(x, x, x) * w).sum().backward();
  EXPECT_TRUE(all_close(grad_inputs[0] + grad_inputs[1] + grad_inputs[2], values(ref_x[0]), 1e-12, 0));
  EXPECT_TRUE(all_close(x.grad(), values(ref_x[0]), 1e-12, 0));
}

TEST(MultiInputHooks, RecurrentStateCallsSeeStatesAndReplaceThem) {
  Generator g(5);
  nn::LSTM lstm(3, 4, {.num_layers = 2});
  lstm.to(kFloat64);
  Tensor x = randn64({6, 2, 3}, g), h0 = randn64({2, 2, 4}, g), c0 = randn64({2, 2, 4}, g);
  Tensor h1 = randn64({2, 2, 4}, g);
  std::vector<std::string> outs;
  lstm.register_forward_pre_hook([&](nn::Module&, const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0], h1, in[2]};  // the args form returning a replacement
  });
  lstm.register_forward_hook([&](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>& out) {
    outs = shapes(out);
  });
  nn::RNNOutput got = lstm(x, h0, c0);
  nn::RNNOutput want = lstm.forward_with_state(x, h1, c0);
  EXPECT_EQ(outs, (std::vector<std::string>{"[6, 2, 4]", "[2, 2, 4]", "[2, 2, 4]"}));
  EXPECT_TRUE(all_close(got.output, values(want.output), 0, 0));
  EXPECT_TRUE(all_close(got.h_n, values(want.h_n), 0, 0));
  EXPECT_TRUE(all_close(got.c_n, values(want.c_n), 0, 0));

  // a packed batch: the hooks see its data, and a forward hook's h_n is what the call returns
  nn::GRU gru_seq(3, 4);
  gru_seq.to(kFloat64);
  const auto packed = nn::utils::rnn::pack_padded_sequence(x, std::vector<int64_t>{6, 4}, false, true);
  std::vector<std::string> packed_inputs;
  gru_seq.register_forward_hook([&](nn::Module&, const std::vector<Tensor>& in, std::vector<Tensor>& out) {
    packed_inputs = shapes(in);
    out[1] = out[1] * 2.0;
  });
  nn::PackedRNNOutput p = gru_seq(packed);
  nn::PackedRNNOutput p_want = gru_seq.forward_with_state(packed);
  EXPECT_EQ(packed_inputs, (std::vector<std::string>{"[10, 3]", "undefined", "undefined"}));
  EXPECT_TRUE(all_close(p.output.data, values(p_want.output.data), 0, 0));
  EXPECT_TRUE(all_close(p.output.batch_sizes, values(p_want.output.batch_sizes), 0, 0));
  EXPECT_TRUE(all_close(p.h_n, values(p_want.h_n * 2.0), 0, 0));

  // the cells
  nn::GRUCell gru(3, 4);
  gru.to(kFloat64);
  Tensor xs = randn64({2, 3}, g), hx = randn64({2, 4}, g);
  int calls = 0;
  gru.register_forward_hook([&](nn::Module&, const std::vector<Tensor>& in, std::vector<Tensor>&) {
    calls += in.size() == 2 && in[1].is_same(hx);
  });
  EXPECT_TRUE(all_close(gru(xs, hx), values(gru.forward(xs, hx)), 0, 0));
  EXPECT_EQ(calls, 1);
  nn::LSTMCell cell(3, 4);
  cell.to(kFloat64);
  cell.register_forward_hook([&](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>& out) {
    out[1] = out[1] * 0.0;  // the cell state, zeroed
  });
  nn::LSTMState s = cell(xs, hx, hx);
  EXPECT_TRUE(all_close(s.h, values(cell.forward_with_state(xs, hx, hx).h), 0, 0));
  EXPECT_TRUE(all_close(s.c, std::vector<double>(8, 0.0), 0, 0));
}

TEST(MultiInputHooks, GlobalHooksSeeEveryCallFormAndAlwaysCallRunsOnErrors) {
  Generator g(6);
  nn::CrossEntropyLoss ce;
  nn::MarginRankingLoss ranking;
  std::vector<std::string> seen;
  nn::RemovableHandle pre = nn::register_module_forward_pre_hook([&](nn::Module& m, const std::vector<Tensor>& in) {
    seen.push_back(fmt::format("{} {}", m.name(), in.size()));
  });
  std::vector<size_t> outputs_after_error;
  nn::RemovableHandle post = nn::register_module_forward_hook(
      [&](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>& out) {
        outputs_after_error.push_back(out.size());
      },
      /*always_call=*/true);
  ce(randn64({3, 5}, g), from_vector<int64_t>({0, 4, 2}));
  ranking(randn64({4}, g), randn64({4}, g), from_vector<double>({1, -1, 1, 1}));
  nn::MultiheadAttention attn(8, 2);
  EXPECT_TRUE(throws_with([&] { attn(randn({4, 2, 7}), randn({5, 2, 7}), randn({5, 2, 7})); }, {"MultiheadAttention"}));
  pre.remove();
  post.remove();
  EXPECT_FALSE(nn::has_global_forward_hooks());
  EXPECT_EQ(seen, (std::vector<std::string>{"CrossEntropyLoss 2", "MarginRankingLoss 3", "MultiheadAttention 5"}));
  EXPECT_EQ(outputs_after_error, (std::vector<size_t>{1, 1, 0}));  // forward raised: no outputs
}

TEST(MultiInputHooks, HooksReturningTheWrongNumberOfTensorsRaise) {
  Generator g(7);
  nn::MSELoss mse;
  Tensor a = randn64({3}, g), b = randn64({3}, g);
  nn::RemovableHandle h = mse.register_forward_pre_hook(
      [](nn::Module&, const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; });
  EXPECT_TRUE(throws_with([&] { mse(a, b); }, {"MSELoss", "forward pre-hook must return 2 tensors", "got 1"}));
  h.remove();
  h = mse.register_forward_hook([](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>& out) {
    return std::vector<Tensor>{out[0], out[0]};
  });
  EXPECT_TRUE(throws_with([&] { mse(a, b); }, {"forward hook must return 1 tensors", "got 2"}));
  h.remove();
  mse.register_full_backward_hook([](nn::Module&, std::vector<Tensor>& gi, const std::vector<Tensor>&) {
    gi[0] = gi[0].sum();
  });
  Tensor x = a.detach().requires_grad_();
  EXPECT_TRUE(throws_with([&] { mse(x, b).backward(); }, {"backward hook must return a gradient of shape [3]"}));
}

TEST(MultiInputHooks, AModulesOwnCallOperatorAndGradientsThatBypassTheOutput) {
  Generator g(8);
  ProductKeeper m;
  Tensor a = randn64({4}, g).requires_grad_(), b = randn64({4}, g).requires_grad_();
  std::vector<Tensor> grad_inputs, grad_outputs;
  m.register_full_backward_hook([&](nn::Module&, std::vector<Tensor>& gi, const std::vector<Tensor>& go) {
    grad_inputs = gi;
    grad_outputs = go;
  });
  Tensor sum = m(a, b);
  EXPECT_TRUE(all_close(sum, values(a.detach() + b.detach()), 0, 0));
  m.kept.sum().backward();  // d/da sum(a * b) = b, d/db = a; the output is not in this backward
  ASSERT_EQ(grad_inputs.size(), 2u);
  EXPECT_TRUE(all_close(grad_inputs[0], values(b), 0, 0));
  EXPECT_TRUE(all_close(grad_inputs[1], values(a), 0, 0));
  ASSERT_EQ(grad_outputs.size(), 1u);
  EXPECT_FALSE(grad_outputs[0].defined());
  // the one-input form there: grad_output undefined too
  Tensor seen = ones({1});
  m.register_full_backward_hook([&](nn::Module&, const Tensor&, const Tensor& grad_output) { seen = grad_output; });
  m(a, b);
  m.kept.sum().backward();
  EXPECT_FALSE(seen.defined());
}

TEST(MultiInputHooks, AttentionWithWeightsShowsBothOutputs) {
  Generator g(9);
  nn::MultiheadAttention attn(8, 2);
  attn.to(kFloat64);
  Tensor q = randn64({4, 2, 8}, g), kv = randn64({6, 2, 8}, g);
  std::vector<std::string> outs;
  attn.register_forward_hook([&](nn::Module&, const std::vector<Tensor>&, std::vector<Tensor>& out) {
    outs = shapes(out);
    out[1] = out[1] * 10.0;
  });
  nn::AttentionOutput got = attn.call_with_weights(q, kv, kv);
  nn::AttentionOutput want = attn.forward_with_weights(q, kv, kv);
  EXPECT_EQ(outs, (std::vector<std::string>{"[4, 2, 8]", "[2, 4, 6]"}));  // weights (N, L, S), head-averaged
  EXPECT_TRUE(all_close(got.output, values(want.output), 0, 0));
  EXPECT_TRUE(all_close(got.weights, values(want.weights * 10.0), 0, 0));
}
