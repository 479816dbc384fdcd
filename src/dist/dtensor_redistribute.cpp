// Redistributing a DTensor's local piece from one list of placements to another, one mesh dim
// at a time, and its autograd Function. Note [Redistribution order] explains the plan.
#include <algorithm>

#include <strata/autograd/function.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>

#include "dtensor_layout.h"

namespace strata::dist::dtensor_detail {

namespace {

using Group = std::shared_ptr<ProcessGroup>;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// `t` grown to `length` along `dim` with zeros after its data (collectives need equal pieces).
Tensor pad_to(const Tensor& t, int64_t dim, int64_t length) {
  if (t.size(dim) == length) return t.contiguous();
  Shape shape = t.shape();
  shape[static_cast<size_t>(dim)] = length;
  Tensor padded = zeros(shape, t.options());
  padded.narrow(dim, 0, t.size(dim)).copy_(t);
  return padded;
}

// Shard(d) -> Replicate: every rank's piece of the `block`-long dim d, padded to one size.
Tensor gather_dim(const Tensor& local, const Group& g, int64_t d, int64_t block) {
  const int n = g->size();
  const int64_t step = ceil_div(block, n);
  if (step == 0 || n == 1) return local;
  Tensor send = pad_to(local, d, step);
  std::vector<Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(empty(send.shape(), send.options()));
  g->allgather(parts, send)->wait();
  for (int r = 0; r < n; ++r) {
    Tensor& part = parts[static_cast<size_t>(r)];
    part = part.narrow(d, 0, chunk_piece(block, n, r).length);
  }
  return cat(parts, d);
}

// Replicate -> Shard(d): this rank's piece, no communication.
Tensor chunk_dim(const Tensor& local, const Group& g, int64_t d) {
  const Piece p = chunk_piece(local.size(d), g->size(), g->rank());
  return local.narrow(d, p.offset, p.length).contiguous();
}

Tensor reduce_all(const Tensor& local, const Group& g, ReduceOp op) {
  Tensor t = local.contiguous().clone();
  g->allreduce(t, op)->wait();
  return t;
}

// Partial -> Shard(d): reduce-scatter of the dim cut into equal padded pieces.
Tensor reduce_scatter_dim(const Tensor& local, const Group& g, int64_t d, ReduceOp op) {
  const int n = g->size();
  const int64_t block = local.size(d), step = ceil_div(block, n);
  if (step == 0) return local;
  Tensor padded = pad_to(local, d, step * n);
  std::vector<Tensor> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(padded.narrow(d, r * step, step).contiguous());
  Tensor out = empty(inputs.front().shape(), local.options());
  g->reduce_scatter(out, inputs, op)->wait();
  return out.narrow(d, 0, chunk_piece(block, n, g->rank()).length).contiguous();
}

// Shard(d) -> Shard(e): this rank's piece of d is cut along e; piece r goes to rank r, which
// joins what it receives along d. `block_d`: the whole dim d at this mesh dim.
Tensor all_to_all_dims(const Tensor& local, const Group& g, int64_t d, int64_t e, int64_t block_d) {
  const int n = g->size(), me = g->rank();
  const int64_t block_e = local.size(e);
  std::vector<Tensor> inputs, outputs;
  for (int r = 0; r < n; ++r) {
    const Piece pe = chunk_piece(block_e, n, r);
    inputs.push_back(local.narrow(e, pe.offset, pe.length).contiguous());
    Shape shape = local.shape();
    shape[static_cast<size_t>(d)] = chunk_piece(block_d, n, r).length;
    shape[static_cast<size_t>(e)] = chunk_piece(block_e, n, me).length;
    outputs.push_back(empty(shape, local.options()));
  }
  g->alltoall(outputs, inputs)->wait();
  return cat(outputs, d);
}

// Replicate -> Partial: parts whose reduction is the value (torch divides by the group size
// for Sum; an integer Sum keeps the value on group rank 0 and zeros elsewhere).
Tensor partition(const Tensor& local, const Group& g, ReduceOp op) {
  if (op != ReduceOp::Sum) return local;
  if (is_floating(local.dtype())) return local.div(static_cast<double>(g->size()));
  return g->rank() == 0 ? local : zeros_like(local);
}

// Whether reducing over one mesh dim with `a`, then another with `b`, is the same as the other
// way round: sums and averages (both linear) do, and an op with itself.
bool reductions_commute(ReduceOp a, ReduceOp b) {
  auto linear = [](ReduceOp op) { return op == ReduceOp::Sum || op == ReduceOp::Avg; };
  return a == b || (linear(a) && linear(b));
}

class Redistributor {
 public:
  Redistributor(const DLayout& from, Tensor local) : from_(from), cur_(from.placements), local_(std::move(local)) {}

  Tensor run(const std::vector<Placement>& to) {
    const int nd = mesh().ndim();
    std::vector<bool> changed(static_cast<size_t>(nd)), marked(static_cast<size_t>(nd));
    for (int i = 0; i < nd; ++i) changed[at(i)] = cur_[at(i)] != to[at(i)];
    for (int i = 0; i < nd; ++i) {
      marked[at(i)] = changed[at(i)];
      const Placement& p = cur_[at(i)];
      for (int k = 0; k < i; ++k) {
        if (!changed[at(k)]) continue;
        const Placement &was = cur_[at(k)], &will = to[at(k)];
        if (p.is_shard() && (was.is_shard(p.dim) || will.is_shard(p.dim))) marked[at(i)] = true;
        if (p.is_partial() && was.is_partial() && !reductions_commute(was.reduce_op, p.reduce_op)) marked[at(i)] = true;
      }
    }
    const auto first = std::find(marked.begin(), marked.end(), true) - marked.begin();
    for (int i = nd - 1; i >= 0; --i) {
      if (!marked[at(i)]) continue;
      if (i == first) {
        direct(i, to[at(i)]);
      } else if (!cur_[at(i)].is_replicate()) {
        direct(i, Replicate());
      }
    }
    for (int i = 0; i < nd; ++i)
      if (cur_[at(i)] != to[at(i)]) direct(i, to[at(i)]);
    return local_;
  }

 private:
  static size_t at(int i) { return static_cast<size_t>(i); }
  const DeviceMesh& mesh() const { return *from_.mesh; }

  // mesh dim i from its current placement to `to`, in one collective where one does it
  void direct(int i, const Placement& to) {
    const Placement cur = cur_[at(i)];
    const Group g = mesh().get_group(i);
    if (cur.is_shard() && to.is_shard()) {
      const int64_t block = block_shape(from_.shape, cur_, mesh(), i)[static_cast<size_t>(cur.dim)];
      local_ = all_to_all_dims(local_, g, cur.dim, to.dim, block);
    } else if (cur.is_partial() && to.is_shard()) {
      local_ = reduce_scatter_dim(local_, g, to.dim, cur.reduce_op);
    } else {
      if (cur.is_shard()) {
        const int64_t block = block_shape(from_.shape, cur_, mesh(), i)[static_cast<size_t>(cur.dim)];
        local_ = gather_dim(local_, g, cur.dim, block);
      } else if (cur.is_partial()) {
        local_ = reduce_all(local_, g, cur.reduce_op);
      }
      if (to.is_shard()) local_ = chunk_dim(local_, g, to.dim);
      if (to.is_partial()) local_ = partition(local_, g, to.reduce_op);
    }
    cur_[at(i)] = to;
  }

  const DLayout& from_;
  std::vector<Placement> cur_;
  Tensor local_;
};

struct Redistribute : autograd::Function<Redistribute> {
  static Tensor forward(AutogradContext& ctx, const Tensor& local, const DLayout& from,
                        const std::vector<Placement>& to) {
    ctx.saved_data["from"] = from;
    ctx.saved_data["to"] = to;
    return Redistributor(from, local.detach()).run(to);
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grad) {
    DLayout layout = std::any_cast<DLayout>(ctx.saved_data.at("from"));
    const auto& to = std::any_cast<const std::vector<Placement>&>(ctx.saved_data.at("to"));
    const std::vector<Placement> grad_to = grad_placements(layout.placements);
    layout.placements = grad_placements(to);
    return {redistribute_local(grad[0], layout, grad_to)};
  }
};

struct GradLayout : autograd::Function<GradLayout> {
  static Tensor forward(AutogradContext& ctx, const Tensor& local, const DLayout& grad_from,
                        const std::vector<Placement>& grad_to) {
    ctx.saved_data["from"] = grad_from;
    ctx.saved_data["to"] = grad_to;
    return local;
  }
  static std::vector<Tensor> backward(AutogradContext& ctx, const std::vector<Tensor>& grad) {
    const auto& from = std::any_cast<const DLayout&>(ctx.saved_data.at("from"));
    return {redistribute_local(grad[0], from, std::any_cast<const std::vector<Placement>&>(ctx.saved_data.at("to")))};
  }
};

}  // namespace

// Note [Redistribution order]: with several mesh dims, the local piece is the global tensor cut
// by mesh dim 0, that block cut by mesh dim 1, and so on; Partial parts are reduced over the last
// mesh dim first (op_0 over i of op_1 over j of the parts). A collective along mesh dim i over
// tensor dim d is only right while no later mesh dim cuts d, and a reduction along i only while
// no later mesh dim is Partial with an op that does not commute with i's (sum and max). So the
// plan first undoes, from the last mesh dim to the first, every mesh dim that changes (and every
// later one that cuts a tensor dim such a change touches, or is Partial with such an op), taking
// each to Replicate, except the first of them, which
// goes straight to its target in one collective (all-to-all, reduce-scatter...); then, from the
// first mesh dim to the last, it cuts (or partitions) the Replicate dims still to change. One
// mesh dim changing costs one collective; two changing on one tensor dim take them in turn.
Tensor redistribute_local(const Tensor& local, const DLayout& from, const std::vector<Placement>& to) {
  if (from.placements == to) return local;
  return Redistribute::apply(local, from, to);
}

Tensor with_grad_layout(const Tensor& local, const DLayout& layout, const std::vector<Placement>& grad_from,
                        const std::vector<Placement>& grad_to) {
  if (grad_from == grad_to) return local;
  DLayout from = layout;
  from.placements = grad_from;
  return GradLayout::apply(local, from, grad_to);
}

}  // namespace strata::dist::dtensor_detail
