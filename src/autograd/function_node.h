// The node record() creates: a name, the saved tensors and the backward closure.
#pragma once

#include <strata/autograd/graph.hpp>
#include <strata/ops/creation.hpp>

namespace strata::autograd {

class FunctionNode final : public Node {
 public:
  FunctionNode(const char* name, BackwardFn fn) : name_(name), fn_(std::move(fn)) {}

  Grads apply(Grads&& grads) override {
    STRATA_CHECK(!released_, "[autograd] trying to backward through the graph of {} a second time, after its saved "
                 "tensors were freed; pass retain_graph=true to the first backward", name_);
    for (size_t i = 0; i < grads.size(); ++i)
      if (!grads[i].defined())
        grads[i] = zeros(output_meta[i].shape, TensorOptions(output_meta[i].dtype, output_meta[i].device));
    Saved unpacked;
    unpacked.reserve(saved.size());
    auto self = shared_from_this();
    for (const SavedTensor& s : saved) unpacked.push_back(s.unpack(self));
    return fn_(grads, unpacked);
  }
  std::string name() const override { return name_; }
  void release_saved() override {
    if (saved.empty()) return;
    saved.clear();
    released_ = true;
  }

  std::vector<SavedTensor> saved;

 private:
  std::string name_;
  BackwardFn fn_;
  bool released_ = false;
};

}  // namespace strata::autograd
