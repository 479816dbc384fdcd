// Dropout: one kernel pass (kernels/cpu/dropout.h) writes the output and the scaled keep-mask
// from a Philox draw; the backward multiplies the gradient by that mask.
#include <strata/autograd/graph.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/dropout.h"
#include "ops/dispatch.h"

namespace strata::nn {

namespace {

// inputs (x contiguous); outputs (y, mask) contiguous of x's shape and dtype.
void cpu_dropout(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  const auto& p = call.param<DropoutParams>();
  dispatch<DTypeSet::Floating>(x.dtype(), "dropout", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::dropout(static_cast<const T*>(x.data()), static_cast<T*>(call.outputs[0].data()),
                 static_cast<T*>(call.outputs[1].data()), x.numel(), static_cast<float>(p.p), 1.0 / (1.0 - p.p), p.seed,
                 p.offset);
  });
}

}  // namespace

namespace functional {

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  STRATA_CHECK(x.defined(), "[dropout] input tensor is undefined");
  STRATA_CHECK(p >= 0 && p <= 1, "[dropout] probability must be in [0, 1], got {}", p);
  if (!training || p == 0) return x;
  STRATA_CHECK(is_floating(x.dtype()), "[dropout] needs a floating input, got {}", x.dtype());
  if (p == 1) return x * 0;  // everything dropped; keeps the graph (the gradient is zero)
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = x.numel();
  const RandomDraw draw = g.reserve_draw(static_cast<uint64_t>((n + 3) / 4));
  DropoutParams params{p, draw.seed, draw.offset, &g};
  Tensor y = detail::make_tensor(x.shape(), x.dtype(), x.device());
  Tensor mask = detail::make_tensor(x.shape(), x.dtype(), x.device());
  if (n > 0) {
    const Tensor in = x.contiguous();
    Tensor outs[2] = {y, mask};
    run_kernel(OpId::dropout, x.dtype(), KernelCall{{&in, 1}, outs, &params});
  }
  autograd::record("dropout", {x}, {y}, {mask},
                   [](const autograd::Grads& g, const autograd::Saved& s) { return autograd::Grads{g[0] * s[0]}; });
  return y;
}

}  // namespace functional

}  // namespace strata::nn

namespace strata::detail {
void register_dropout_kernels(KernelTable& table) {
  table.set(OpId::dropout, DeviceType::CPU, kFloatDTypes, nn::cpu_dropout);
}
}  // namespace strata::detail
