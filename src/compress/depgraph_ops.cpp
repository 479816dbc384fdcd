// The dependency trace's rules for ops that move, split, merge or contract the channel dim
// (Note [Channel labels] in depgraph_internal.h): reshapes (a flatten into feature blocks, a split
// of the channels into heads and its merge back, squeezes), permute and transpose, split and
// chunk, softmax, matmul and the fused attention, and where a reduction leaves the channels. An
// op's dims come from autograd::Node::dims; a rule whose precondition does not hold marks the
// channels it touches with the reason.
#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "compress/depgraph_internal.h"

namespace strata::compress::detail {

int64_t product(const Shape& s, size_t from, size_t to) {
  from = std::min(from, s.size()), to = std::min(to, s.size());
  if (from >= to) return 1;
  return std::accumulate(s.begin() + static_cast<std::ptrdiff_t>(from), s.begin() + static_cast<std::ptrdiff_t>(to),
                         int64_t{1}, std::multiplies<>());
}

bool same_prefix(const Shape& a, const Shape& b, size_t n) {
  return a.size() >= n && b.size() >= n && std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin());
}

int64_t reduced_channel_dim(const Shape& in, const Shape& out, size_t channel_dim) {
  const size_t rank = in.size();
  if (rank > 16) return -1;
  int64_t lands = -1;
  for (uint32_t dims = 0; dims < (1u << rank); ++dims)
    for (bool keepdim : {false, true}) {
      Shape got;
      int64_t at = -1;
      for (size_t i = 0; i < rank; ++i) {
        const bool reduced = (dims >> i) & 1u;
        if (i == channel_dim && (!reduced || (keepdim && in[i] == 1))) at = static_cast<int64_t>(got.size());
        if (!reduced || keepdim) got.push_back(reduced ? 1 : in[i]);
      }
      if (got != out) continue;
      if (at < 0 || (lands >= 0 && at != lands)) return -1;
      lands = at;
    }
  return lands;
}

namespace {

// a and b from dim `from` (of a) and `to` (of b) to their ends are equal
bool same_suffix(const Shape& a, size_t from, const Shape& b, size_t to) {
  return a.size() - std::min(from, a.size()) == b.size() - std::min(to, b.size()) &&
         std::equal(a.begin() + static_cast<std::ptrdiff_t>(std::min(from, a.size())), a.end(),
                    b.begin() + static_cast<std::ptrdiff_t>(std::min(to, b.size())));
}

// Where channel dim d of `in` lands when `out` only adds or drops dims of size 1 (an unsqueeze
// or squeeze before the channels), or -1.
int64_t moved_by_size_one_dims(const Shape& in, const Shape& out, size_t d) {
  if (in[d] == 1) return -1;  // which of the size-1 dims it is cannot be told
  std::vector<int64_t> a, b;
  int64_t at = -1;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1) a.push_back(in[i]);
  size_t kept = 0;  // the channels are the (number of in's size > 1 dims before d)-th such dim of out
  for (size_t i = 0; i < d; ++i) kept += in[i] != 1;
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i] != 1) {
      if (b.size() == kept) at = static_cast<int64_t>(i);
      b.push_back(out[i]);
    }
  return a == b ? at : -1;
}

class OpRule {
 public:
  OpRule(Labels& labels, const OpCall& call) : labels_(labels), c_(call) {}

  std::vector<Channels> run() {
    const std::string& op = c_.op;
    if (op == "view" || op == "reshape" || op == "flatten" || op == "squeeze" || op == "unsqueeze") return reshape();
    if (op == "permute" || op == "transpose") return permute();
    if (op == "split") return split();
    if (op == "softmax" || op == "log_softmax") return softmax();
    if (op == "matmul") return matmul();
    if (op == "attention") return attention();
    return refuse(fmt::format("op '{}', which the dependency tracer does not know", op));
  }

 private:
  std::vector<Channels> refuse(const std::string& why) {
    for (const Channels& c : c_.inputs)
      if (c.followed()) labels_.mark(c.labels, why);
    return std::vector<Channels>(c_.out_shapes.size(), Channels{-1, {}, "the output of " + why});
  }
  std::vector<Channels> one(Channels c) { return {std::move(c)}; }
  const Channels& x() const { return c_.inputs[0]; }
  std::string shapes() const {
    return fmt::format("from {} to {}", fmt::join(c_.in_shapes[0], "x"), fmt::join(c_.out_shapes[0], "x"));
  }

  // The channel dim d of `in` kept, merged with the dims after it (a flatten: channel c is a
  // block of features), or split into heads and what follows (a unit is a head: its channels
  // are united, and the heads are followed).
  std::vector<Channels> reshape() {
    if (!x().followed()) return one(x());
    const Shape &in = c_.in_shapes[0], &out = c_.out_shapes[0];
    const auto d = static_cast<size_t>(x().dim);
    if (same_prefix(in, out, d + 1) && product(in, d + 1, in.size()) == product(out, d + 1, out.size()))
      return one(x());
    if (const int64_t at = moved_by_size_one_dims(in, out, d); at >= 0) return one(Channels{at, x().labels, {}});
    if (same_prefix(in, out, d))
      for (size_t e = d + 1; e < in.size(); ++e)  // in[d..e] merged into out[d]
        if (product(in, d, e + 1) == out[d] && same_suffix(in, e + 1, out, d + 1)) {
          const int64_t block = product(in, d + 1, e + 1);
          Channels merged{x().dim, {}, {}};
          for (int64_t label : x().labels) merged.labels.insert(merged.labels.end(), static_cast<size_t>(block), label);
          return one(merged);
        }
    if (same_prefix(in, out, d) && out.size() > d + 1 && out[d] * out[d + 1] == in[d] &&
        same_suffix(in, d + 1, out, d + 2) && out[d] > 1) {
      const auto per = static_cast<size_t>(out[d + 1]);
      Channels heads{x().dim, {}, {}};
      for (size_t h = 0; h < static_cast<size_t>(out[d]); ++h) {
        for (size_t i = 1; i < per; ++i) labels_.unite(x().labels[h * per], x().labels[h * per + i]);
        heads.labels.push_back(x().labels[h * per]);
      }
      return one(heads);
    }
    return refuse(fmt::format("op '{}' {}, mixing the channel dim {}", c_.op, shapes(), d));
  }

  std::vector<Channels> permute() {
    if (!x().followed()) return one(x());
    const std::vector<int64_t>& order = c_.dims;  // output dim i is input dim order[i]
    if (c_.op == "transpose" && order.size() == 2) {
      const int64_t d = x().dim == order[0] ? order[1] : x().dim == order[1] ? order[0] : x().dim;
      return one(Channels{d, x().labels, {}});
    }
    const auto at = std::find(order.begin(), order.end(), x().dim);
    if (c_.op != "permute" || at == order.end())
      return refuse(fmt::format("op '{}' whose dims the graph does not record", c_.op));
    return one(Channels{at - order.begin(), x().labels, {}});
  }

  // Note [Splits of the channels]: a split along another dim gives every part the channels;
  // along the channels, part j holds its slice of them. The node does not say whether it was a
  // chunk (equal parts, however many channels) or a split by sizes fixed in the forward; either
  // way the parts must keep sizes the forward splits the same way, so only equal parts are
  // followed, and index i of every part is one unit (the parts lose the same channels). Parts of
  // unequal sizes make their channels unprunable.
  std::vector<Channels> split() {
    if (!x().followed()) return std::vector<Channels>(c_.out_shapes.size(), x());
    if (c_.dims.size() != 1) return refuse("a split whose dim the graph does not record");
    if (c_.dims[0] != x().dim) return std::vector<Channels>(c_.out_shapes.size(), x());
    const auto d = static_cast<size_t>(x().dim);
    const int64_t part = c_.out_shapes[0][d];
    for (const Shape& s : c_.out_shapes)
      if (s[d] != part)
        return refuse(fmt::format("a split of the channels {} into parts of unequal sizes", fmt::join(c_.in_shapes[0],
                                                                                                         "x")));
    std::vector<Channels> parts;
    for (size_t j = 0; j < c_.out_shapes.size(); ++j) {
      const auto from = x().labels.begin() + static_cast<std::ptrdiff_t>(j * static_cast<size_t>(part));
      parts.push_back(Channels{x().dim, std::vector<int64_t>(from, from + part), {}});
      if (j > 0) labels_.unite(parts[0].labels, parts[j].labels);
    }
    return parts;
  }

  std::vector<Channels> softmax() {
    if (!x().followed()) return one(x());
    if (c_.dims.size() != 1 || c_.dims[0] == x().dim)
      return refuse(fmt::format("op '{}' over the channel dim {}", c_.op, x().dim));
    return one(x());
  }

  // a (.., M, K) @ b (.., K, N): channels on a's rows or b's columns stay there, channels on a
  // batch dim are tied to the other operand's on that dim (broadcast from the right), and
  // channels on K are read: a's columns are tied to b's rows, as a Linear's inputs to what it reads.
  std::vector<Channels> matmul() {
    const Shape &sa = c_.in_shapes[0], &sb = c_.in_shapes[1], &out = c_.out_shapes[0];
    const auto ra = static_cast<int64_t>(sa.size()), rb = static_cast<int64_t>(sb.size());
    const auto r = static_cast<int64_t>(out.size());
    const Channels &a = c_.inputs[0], &b = c_.inputs[1];
    if (!a.followed() && !b.followed()) return one(a);
    if (ra < 2 || rb < 2) return refuse("a matmul of a vector");
    std::vector<Channels> found;  // the output's channels from a, from b
    if (a.followed() && a.dim == ra - 1) labels_.unite(a.labels, labels_at(labels_, b, rb - 2, sb[rb - 2], "a matmul"));
    else if (b.followed() && b.dim == rb - 2)
      labels_.unite(b.labels, labels_at(labels_, a, ra - 1, sa[ra - 1], "a matmul"));
    if (a.followed() && a.dim == ra - 2) found.push_back(Channels{r - 2, a.labels, {}});
    if (b.followed() && b.dim == rb - 1) found.push_back(Channels{r - 1, b.labels, {}});
    for (const auto& [c, rank] : {std::pair{&a, ra}, std::pair{&b, rb}})
      if (c->followed() && c->dim < rank - 2) {
        const int64_t at = c->dim + r - rank;
        if (c_.in_shapes[c == &a ? 0 : 1][static_cast<size_t>(c->dim)] != out[static_cast<size_t>(at)])
          return refuse("a matmul broadcasting the channels");
        // the other operand's batch dim there, unless broadcast (absent or of size 1), loses them too
        const Channels& other = c == &a ? b : a;
        const Shape& shape = c == &a ? sb : sa;
        const int64_t od = at - (r - static_cast<int64_t>(shape.size()));
        if (od >= 0 && shape[static_cast<size_t>(od)] != 1)
          labels_.unite(c->labels, labels_at(labels_, other, od, shape[static_cast<size_t>(od)], "a matmul"));
        found.push_back(Channels{at, c->labels, {}});
      }
    if (found.empty()) return one(Channels{-1, {}, "the output of a matmul contracting the channels"});
    if (found.size() == 2 && found[0].dim == found[1].dim) labels_.unite(found[0].labels, found[1].labels);
    else if (found.size() == 2) return refuse("a matmul of two operands' channels along different dims");
    return one(found[0]);
  }

  // The fused attention of q, k, v (.., T, E): channels on a batch dim (the heads) are tied
  // across the three and kept; the features E are mixed by the product.
  std::vector<Channels> attention() {
    int64_t dim = -1;
    for (size_t i = 0; i < c_.inputs.size(); ++i) {
      const Channels& c = c_.inputs[i];
      if (!c.followed()) continue;
      if (c.dim >= static_cast<int64_t>(c_.in_shapes[i].size()) - 2 || (dim >= 0 && c.dim != dim))
        return refuse("an attention over the channels' dim (the heads must be a batch dim of q, k and v)");
      dim = c.dim;
    }
    if (dim < 0) return one(Channels{-1, {}, "the output of an attention on tensors the trace does not follow"});
    std::vector<int64_t> heads;
    for (size_t i = 0; i < c_.inputs.size(); ++i) {
      const auto l = labels_at(labels_, c_.inputs[i], dim, c_.in_shapes[i][static_cast<size_t>(dim)], "an attention");
      if (heads.empty()) heads = l;
      else labels_.unite(heads, l);
    }
    return one(Channels{dim, heads, {}});
  }

  Labels& labels_;
  const OpCall& c_;
};

}  // namespace

bool has_layout_rule(const std::string& op) {
  static const std::set<std::string> ops = {"view",  "reshape", "flatten",     "squeeze", "unsqueeze", "permute",
                                            "transpose", "split", "softmax", "log_softmax", "matmul", "attention"};
  return ops.count(op) > 0;
}

std::vector<Channels> follow_layout_op(Labels& labels, const OpCall& call) { return OpRule(labels, call).run(); }

}  // namespace strata::compress::detail
