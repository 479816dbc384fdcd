// What the dependency-graph tests share: finding a layer's group, zeroing the channels a prune
// removes in a twin network, and checking a pruned network still trains.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradcheck.h"

namespace strata::testing {

/// The group whose members include `module` along `role`.
inline size_t group_of(const compress::DependencyGraph& graph, nn::Module* module, compress::ChannelRole role) {
  for (size_t g = 0; g < graph.groups().size(); ++g)
    for (const auto& m : graph.groups()[g].members)
      if (m.module == module && m.role == role) return g;
  ADD_FAILURE() << "no group holds the module";
  return 0;
}

/// The group holding `module` along `role` is not prunable, for a reason that says `why`.
inline void expect_unprunable(const compress::DependencyGraph& graph, nn::Module* module, compress::ChannelRole role,
                              const std::string& why) {
  const compress::DependencyGroup& group = graph.groups()[group_of(graph, module, role)];
  EXPECT_FALSE(group.prunable()) << graph.report();
  EXPECT_NE(group.unprunable_reason.find(why), std::string::npos) << graph.report();
}

/// Zeroes the slices `index` along `dim` of each defined tensor, as a removed channel's weights would be.
inline void zero_slices(std::initializer_list<Tensor> tensors, int64_t dim, const std::vector<int64_t>& index) {
  NoGradGuard no_grad;
  for (const Tensor& t : tensors)
    if (t.defined())
      for (int64_t i : index) t.select(dim, i).zero_();
}

/// Zeroes rows (dim 0 slices) of each tensor, as a removed channel's producer and norm would be.
inline void zero_rows(std::initializer_list<Tensor> tensors, const std::vector<int64_t>& rows) {
  zero_slices(tensors, 0, rows);
}

/// 0..n-1 but `kept`.
inline std::vector<int64_t> complement(int64_t n, const std::vector<int64_t>& kept) {
  std::vector<int64_t> gone;
  for (int64_t i = 0; i < n; ++i)
    if (!std::count(kept.begin(), kept.end(), i)) gone.push_back(i);
  return gone;
}

/// Every unit in `units`, expanded to its `width` channels.
inline std::vector<int64_t> channels_of(const std::vector<int64_t>& units, int64_t width) {
  std::vector<int64_t> out;
  for (int64_t u : units)
    for (int64_t i = 0; i < width; ++i) out.push_back(u * width + i);
  return out;
}

/// Two identical float64 networks (built from generators of one seed) whose norms saw the same
/// training batch, in eval mode.
template <class Net> std::pair<std::unique_ptr<Net>, std::unique_ptr<Net>> twins(const Tensor& x) {
  Generator ga(21), gb(21);
  auto p = std::make_unique<Net>(ga), q = std::make_unique<Net>(gb);
  p->to(kFloat64), q->to(kFloat64);
  NoGradGuard no_grad;
  (*p)(x), (*q)(x);
  p->eval(), q->eval();
  return {std::move(p), std::move(q)};
}

/// A few steps of SGD on a fixed batch lower the loss.
inline void expect_trains(nn::Module& net, const Tensor& x, int64_t classes) {
  namespace F = nn::functional;
  net.train();
  optim::SGD opt(net.parameters(), {.lr = 0.05});
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < x.size(0); ++i) labels.push_back(i % classes);
  const Tensor y = from_vector(labels);
  const double first = F::cross_entropy(net(x), y).item<double>();
  for (int i = 0; i < 5; ++i) {
    opt.zero_grad();
    F::cross_entropy(net(x), y).backward();
    opt.step();
  }
  EXPECT_LT(F::cross_entropy(net(x), y).item<double>(), first);
}

/// Random values for a norm's affine parameters (ones and zeros would hide a wrong channel).
inline void randomize(Generator& g, std::initializer_list<Tensor> tensors) {
  NoGradGuard no_grad;
  for (const Tensor& t : tensors) t.copy_(randn(t.shape(), t.dtype(), &g));
}

/// Pruned and zeroed twins compute the same, in eval and train mode.
template <class Net> void expect_same(Net& pruned, Net& zeroed, const Tensor& x) {
  for (bool train : {false, true}) {
    pruned.train(train), zeroed.train(train);
    NoGradGuard no_grad;
    EXPECT_TRUE(all_close(pruned(x), values(zeroed(x)), 1e-12, 1e-12)) << "train " << train;
  }
  pruned.eval(), zeroed.eval();
}

}  // namespace strata::testing
