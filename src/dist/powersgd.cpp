// PowerSGD (Vogels, Karimireddy and Jaggi, 2019) as a DDP communication hook, following
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook step for step.
//
// Note [PowerSGD's steps]: for a bucket past the warm-up, the local error of the last step is
// added to the buffer (error feedback) and each gradient, seen as an n x m matrix M, is either
// compressed (when (n + m) r * min_compression_rate < n m) or averaged as it is, with the other
// uncompressed ones in one allreduce. For the compressed ones: Q (m x r, the last step's under
// warm start, else random from the state's generator, the same on every rank) is orthonormalized,
// P = M Q, the Ps are summed (one allreduce for the bucket), orthonormalized, Q = M^T P, the Qs
// averaged (one allreduce), and M' = P Q^T replaces M. The new error is the buffer before minus
// after. The uncompressed allreduce and the P allreduce start in the hook, during the backward;
// the rest runs when DDP waits for the bucket, in bucket order on every rank. Orthonormalization
// is Gram-Schmidt at every rank r (torch takes a QR factorization above r = 2 in float32/64:
// the same columns up to round-off).
#include <algorithm>
#include <charconv>

#include <strata/dist/ddp_comm_hooks.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>

namespace strata::dist::ddp_comm_hooks {

namespace {

constexpr const char* kHook = "powerSGD_hook";

// Gram-Schmidt on the columns of `m` (k x r), in place (torch's _orthogonalize_gram_schmidt).
void orthogonalize(const Tensor& m, double epsilon) {
  const int64_t cols = m.size(1);
  for (int64_t i = 0; i < cols; ++i) {
    Tensor col = m.narrow(1, i, 1);
    Tensor length = norm(col);
    col.div_(epsilon == 0 ? length : length + epsilon);
    if (i + 1 == cols) break;
    Tensor rest = m.narrow(1, i + 1, cols - i - 1);
    rest.sub_((col * rest).sum({0}, true) * col);
  }
}

// Where each gradient of a bucket goes.
struct Plan {
  std::vector<Tensor> matrices, ps, qs;  // compressed: M (a view of the buffer), P and Q
  std::vector<Tensor> uncompressed;      // views of the buffer
  int64_t p_size = 0, q_size = 0;
};

Plan plan_bucket(PowerSGDState& state, const GradBucket& bucket) {
  Plan plan;
  const PowerSGDOptions& o = state.options;
  std::vector<int64_t> ranks;
  for (size_t i = 0; i < bucket.parameters.size(); ++i) {
    Tensor g = bucket.gradient(i);
    const int64_t numel = g.numel();
    state.total_numel_before_compression += numel;
    const int64_t n = g.dim() == 0 ? 1 : g.size(0), m = n == 0 ? 0 : numel / n;
    const int64_t r = std::min({n, m, o.matrix_approximation_rank});
    const bool compress = g.dim() > 0 && numel > 0 &&
                          static_cast<double>((n + m) * r) * o.min_compression_rate < static_cast<double>(numel);
    if (!compress) {
      plan.uncompressed.push_back(g);
      state.total_numel_after_compression += numel;
      continue;
    }
    plan.matrices.push_back(g.view({n, m}));
    ranks.push_back(r);
    plan.p_size += n * r;
    plan.q_size += m * r;
    state.total_numel_after_compression += (n + m) * r;
  }
  const size_t b = bucket.index;
  const bool fresh = !o.warm_start || !state.p_memory_dict.count(b);
  if (fresh) {
    state.p_memory_dict[b] = empty({plan.p_size}, bucket.buffer.options());
    state.q_memory_dict[b] = empty({plan.q_size}, bucket.buffer.options());
  }
  const Tensor& p_memory = state.p_memory_dict[b];
  const Tensor& q_memory = state.q_memory_dict[b];
  STRATA_CHECK(p_memory.numel() == plan.p_size && q_memory.numel() == plan.q_size &&
                   q_memory.dtype() == bucket.buffer.dtype() && q_memory.device() == bucket.buffer.device(),
               "[{}] the state's P and Q memories for bucket {} ({} and {} {} elements on {}) do not fit this bucket "
               "({} and {} {} elements on {}): is the state shared with another model?",
               kHook, b, p_memory.numel(), q_memory.numel(), q_memory.dtype(), q_memory.device(), plan.p_size,
               plan.q_size, bucket.buffer.dtype(), bucket.buffer.device());
  int64_t p_at = 0, q_at = 0;
  for (size_t k = 0; k < plan.matrices.size(); ++k) {
    const int64_t n = plan.matrices[k].size(0), m = plan.matrices[k].size(1), r = ranks[k];
    plan.ps.push_back(p_memory.narrow(0, p_at, n * r).view({n, r}));
    plan.qs.push_back(q_memory.narrow(0, q_at, m * r).view({m, r}));
    p_at += n * r;
    q_at += m * r;
  }
  for (const Tensor& q : plan.qs) {
    // drawn on the CPU in float64, so every rank and device starts from the same Q
    if (fresh) q.copy_(randn(q.shape(), TensorOptions(kFloat64), &state.rng));
    orthogonalize(q, o.orthogonalization_epsilon);
  }
  return plan;
}

void increase_iter(PowerSGDState& state, bool last_bucket) {
  if (last_bucket) ++state.iter;
}

}  // namespace

CommFuture powerSGD_hook(PowerSGDState& state, GradBucket& bucket) {
  std::shared_ptr<ProcessGroup> group = state.process_group ? state.process_group : default_group();
  const Tensor input = bucket.buffer;
  STRATA_CHECK(is_floating(input.dtype()), "[{}] bucket {} holds {} gradients; PowerSGD needs a floating dtype",
               kHook, bucket.index, input.dtype());
  if (state.iter < state.options.start_powerSGD_iter) {
    increase_iter(state, bucket.is_last);
    return allreduce_hook(*group, bucket);
  }
  const size_t b = bucket.index;
  Tensor before;  // the buffer with the fed-back error, for the next error
  if (state.options.use_error_feedback) {
    auto it = state.error_dict.find(b);
    if (it != state.error_dict.end()) {
      STRATA_CHECK(it->second.numel() == input.numel(),
                   "[{}] the state's error for bucket {} has {} elements, the bucket {}: is the state shared with "
                   "another model?",
                   kHook, b, it->second.numel(), input.numel());
      input.add_(it->second);
    }
    before = input.clone();
  }
  Plan plan = plan_bucket(state, bucket);
  for (size_t k = 0; k < plan.matrices.size(); ++k) plan.ps[k].copy_(mm(plan.matrices[k], plan.qs[k]));
  std::vector<Tensor> flat;
  for (const Tensor& t : plan.uncompressed) flat.push_back(t.reshape({t.numel()}));
  Tensor uncompressed = flat.empty() ? Tensor() : cat(flat);
  // both allreduces start now; an empty one is skipped on every rank alike (same shapes)
  auto uncompressed_work = uncompressed.defined() ? group->allreduce(uncompressed, ReduceOp::Sum) : nullptr;
  const Tensor p_memory = state.p_memory_dict[b], q_memory = state.q_memory_dict[b];
  auto p_work = p_memory.numel() > 0 ? group->allreduce(p_memory, ReduceOp::Sum) : nullptr;
  PowerSGDState* s = &state;  // the state outlives the backward (held by the registered hook)
  const bool last = bucket.is_last;
  return CommFuture(uncompressed, uncompressed_work).then([=, plan = std::move(plan)](const Tensor& reduced) {
    const int64_t ranks = group->size();
    if (reduced.defined()) {
      reduced.div_(ranks);
      int64_t at = 0;
      for (const Tensor& t : plan.uncompressed) {
        t.copy_(reduced.narrow(0, at, t.numel()).view(t.shape()));
        at += t.numel();
      }
    }
    if (p_work) {
      p_work->wait();
      for (const Tensor& p : plan.ps) orthogonalize(p, s->options.orthogonalization_epsilon);
      for (size_t k = 0; k < plan.matrices.size(); ++k) plan.qs[k].copy_(mm(plan.matrices[k].t(), plan.ps[k]));
      group->allreduce(q_memory, ReduceOp::Sum)->wait();
      q_memory.div_(ranks);
      for (size_t k = 0; k < plan.matrices.size(); ++k) plan.matrices[k].copy_(mm(plan.ps[k], plan.qs[k].t()));
    }
    if (before.defined()) s->error_dict[b] = before - input;
    if (!s->options.warm_start) {
      s->p_memory_dict.clear();
      s->q_memory_dict.clear();
    }
    increase_iter(*s, last);
    return input;
  });
}

// ---- the state ---------------------------------------------------------------------------

PowerSGDState::PowerSGDState(std::shared_ptr<ProcessGroup> group, PowerSGDOptions opts)
    : process_group(std::move(group)), options(opts), rng(opts.random_seed) {
  STRATA_CHECK(options.matrix_approximation_rank >= 1, "[PowerSGDState] matrix_approximation_rank must be >= 1, got {}",
               options.matrix_approximation_rank);
  STRATA_CHECK(options.start_powerSGD_iter >= 0, "[PowerSGDState] start_powerSGD_iter must be >= 0, got {}",
               options.start_powerSGD_iter);
  STRATA_CHECK(options.min_compression_rate >= 0, "[PowerSGDState] min_compression_rate must be >= 0, got {}",
               options.min_compression_rate);
  STRATA_CHECK(options.orthogonalization_epsilon >= 0, "[PowerSGDState] orthogonalization_epsilon must be >= 0, got {}",
               options.orthogonalization_epsilon);
}

double PowerSGDState::compression_rate() const {
  return total_numel_after_compression == 0
             ? 0.0
             : static_cast<double>(total_numel_before_compression) / static_cast<double>(total_numel_after_compression);
}

namespace {

constexpr const char* kMemoryPrefixes[] = {"error.", "p.", "q."};

template <class State> auto& memory(State& state, size_t which) {
  return which == 0 ? state.error_dict : which == 1 ? state.p_memory_dict : state.q_memory_dict;
}

}  // namespace

std::map<std::string, Tensor> PowerSGDState::state_dict() const {
  const RandomDraw draw = rng.state();
  std::map<std::string, Tensor> dict{
      {"iter", scalar_tensor(iter, TensorOptions(kInt64))},
      {"rng", from_vector(std::vector<int64_t>{static_cast<int64_t>(draw.seed), static_cast<int64_t>(draw.offset)})},
      {"compression_stats", from_vector(std::vector<int64_t>{total_numel_before_compression,
                                                             total_numel_after_compression})}};
  for (size_t which = 0; which < 3; ++which)
    for (const auto& [bucket, t] : memory(*this, which))
      dict.emplace(kMemoryPrefixes[which] + std::to_string(bucket), t.clone());
  return dict;
}

void PowerSGDState::load_state_dict(const std::map<std::string, Tensor>& dict) {
  constexpr const char* kOp = "[PowerSGDState::load_state_dict]";
  auto fixed = [&](const char* key, int64_t numel) {
    auto it = dict.find(key);
    STRATA_CHECK(it != dict.end(), "{} the key '{}' is missing", kOp, key);
    STRATA_CHECK(it->second.defined() && it->second.dtype() == kInt64 && it->second.numel() == numel,
                 "{} '{}' must be an int64 tensor of {} element(s)", kOp, key, numel);
    Tensor host = it->second.cpu().contiguous();
    return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + numel);
  };
  const std::vector<int64_t> it = fixed("iter", 1), draw = fixed("rng", 2), stats = fixed("compression_stats", 2);
  std::map<size_t, Tensor> memories[3];  // built aside, so a bad key changes nothing
  for (const auto& [key, t] : dict) {
    if (key == "iter" || key == "rng" || key == "compression_stats") continue;
    bool known = false;
    for (size_t which = 0; which < 3 && !known; ++which) {
      const std::string prefix = kMemoryPrefixes[which];
      if (key.rfind(prefix, 0) != 0) continue;
      size_t bucket = 0;
      const char* first = key.data() + prefix.size();
      const char* end = key.data() + key.size();
      auto [at, ec] = std::from_chars(first, end, bucket);
      known = ec == std::errc() && at == end && first != end;
      if (known) {
        STRATA_CHECK(t.defined() && t.dim() == 1, "{} '{}' must be a 1-d tensor", kOp, key);
        memories[which][bucket] = t.clone();
      }
    }
    STRATA_CHECK(known, "{} unknown key '{}' (expected iter, rng, compression_stats, error.<bucket>, p.<bucket>, "
                        "q.<bucket>)", kOp, key);
  }
  iter = it[0];
  rng.set_state(static_cast<uint64_t>(draw[0]), static_cast<uint64_t>(draw[1]));
  total_numel_before_compression = stats[0];
  total_numel_after_compression = stats[1];
  for (size_t which = 0; which < 3; ++which) memory(*this, which) = std::move(memories[which]);
}

}  // namespace strata::dist::ddp_comm_hooks
