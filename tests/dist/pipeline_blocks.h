// The pipeline tests' model: a chain of small float64 blocks, block k drawn from seed 40 + k, so
// every rank can build any block (its stage and the whole chain it is compared with).
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "testing.h"

namespace strata::pipeline_testing {

// Block k of the chain: Linear then tanh, except the last block, which is Linear alone.
// Each forward under autograd counts one more micro-batch alive until the gradient of its
// output arrives in the backward.
struct Block : nn::Module {
  nn::Linear fc;
  bool last;
  std::shared_ptr<int64_t> live = std::make_shared<int64_t>(0), peak = std::make_shared<int64_t>(0);
  Block(int k, int blocks, Generator* gen) : fc(k == 0 ? 5 : 7, k == blocks - 1 ? 3 : 7, {.generator = gen}),
                                             last(k == blocks - 1) {
    register_module("fc", fc);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override {
    Tensor out = last ? fc(x) : tanh(fc(x));
    if (out.requires_grad()) {
      *peak = std::max(*peak, ++*live);
      out.register_hook([live = live](const Tensor&) {
        --*live;
        return Tensor();
      });
    }
    return out;
  }
};

inline std::unique_ptr<Block> make_block(int k, int blocks) {
  Generator gen(40 + static_cast<uint64_t>(k));
  return std::make_unique<Block>(k, blocks, &gen);
}

inline std::vector<Tensor> grads(nn::Module& m) {
  std::vector<Tensor> g;
  for (const Tensor& p : m.parameters()) g.push_back(p.grad());
  return g;
}

}  // namespace strata::pipeline_testing
