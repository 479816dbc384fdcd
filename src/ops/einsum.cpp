// einsum, composed of views, sums and bmm, so it runs on both devices and its gradient comes
// from those ops. The equation is parsed into one label id per operand dim (letters, and the
// dims an ellipsis stands for, aligned at the right so they broadcast); a label repeated in one
// operand takes its diagonal (an as_strided view), a label no other term needs is summed
// away, and the operands are contracted left to right, each pair as one batched GEMM:
// (batch, kept left, contracted) x (batch, contracted, kept right).
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include <strata/amp/autocast.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>

namespace strata {

namespace {

constexpr int kLetters = 52;  // ids 0-51 letters in ASCII order (A-Z, a-z); ellipsis dims after

int letter_id(char c) { return c >= 'A' && c <= 'Z' ? c - 'A' : 26 + (c - 'a'); }
char letter_of(int id) { return static_cast<char>(id < 26 ? 'A' + id : 'a' + (id - 26)); }

struct Term {
  std::vector<int> letters;  // in order, with kEllipsis where "..." stands
  bool has_ellipsis = false;
};
constexpr int kEllipsis = -1;

Term parse_term(std::string_view s, std::string_view equation) {
  Term t;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.') {
      STRATA_CHECK(s.substr(i, 3) == "..." && !t.has_ellipsis,
                   "[einsum] \"{}\": a term may hold one ellipsis \"...\", with three dots", equation);
      t.letters.push_back(kEllipsis);
      t.has_ellipsis = true;
      i += 2;
      continue;
    }
    STRATA_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'),
                 "[einsum] \"{}\": subscripts are letters, got '{}'", equation, c);
    t.letters.push_back(letter_id(c));
  }
  return t;
}

// One operand during the contraction: a tensor with one distinct label id per dim.
struct Labeled {
  Tensor t;
  std::vector<int> ids;
};

// The ids of a term's dims for an operand of `rank`, with `ell_rank` ellipsis dims in all.
std::vector<int> dim_ids(const Term& term, int64_t rank, int64_t ell_rank, size_t k, std::string_view equation) {
  const int64_t named = static_cast<int64_t>(term.letters.size()) - (term.has_ellipsis ? 1 : 0);
  STRATA_CHECK(term.has_ellipsis ? rank >= named : rank == named,
               "[einsum] \"{}\": operand {} has {} dims, its subscripts name {}{}", equation, k, rank, named,
               term.has_ellipsis ? " and an ellipsis" : "");
  std::vector<int> ids;
  for (int l : term.letters) {
    if (l != kEllipsis) {
      ids.push_back(l);
      continue;
    }
    const int64_t covered = rank - named;
    for (int64_t e = ell_rank - covered; e < ell_rank; ++e) ids.push_back(kLetters + static_cast<int>(e));
  }
  return ids;
}

std::string id_name(int id) { return id < kLetters ? std::string(1, letter_of(id)) : "..."; }

// Repeated ids in one operand become their diagonal: one dim whose stride is the sum of theirs.
Labeled take_diagonals(Labeled x, std::string_view equation) {
  for (size_t i = 0; i < x.ids.size(); ++i)
    for (size_t j = x.ids.size(); j-- > i + 1;) {
      if (x.ids[j] != x.ids[i]) continue;
      STRATA_CHECK(x.t.size(static_cast<int64_t>(i)) == x.t.size(static_cast<int64_t>(j)),
                   "[einsum] \"{}\": label {} repeated in one operand needs equal sizes, got {} and {}", equation,
                   id_name(x.ids[i]), x.t.size(static_cast<int64_t>(i)), x.t.size(static_cast<int64_t>(j)));
      const Tensor c = x.t.contiguous();  // as_strided's gradient needs a contiguous base
      Shape shape = c.shape();
      Strides strides = c.strides();
      strides[i] += strides[j];
      shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(j));
      strides.erase(strides.begin() + static_cast<std::ptrdiff_t>(j));
      x.t = c.as_strided(shape, strides);
      x.ids.erase(x.ids.begin() + static_cast<std::ptrdiff_t>(j));
    }
  return x;
}

bool contains(const std::vector<int>& v, int id) { return std::find(v.begin(), v.end(), id) != v.end(); }

// Sums away the dims whose ids `keep` lacks.
Labeled sum_unneeded(Labeled x, const std::vector<int>& keep) {
  std::vector<int64_t> dims;
  std::vector<int> ids;
  for (size_t d = 0; d < x.ids.size(); ++d) {
    if (contains(keep, x.ids[d])) ids.push_back(x.ids[d]);
    else dims.push_back(static_cast<int64_t>(d));
  }
  if (!dims.empty()) x.t = sum(x.t, dims);
  x.ids = ids;
  return x;
}

int64_t size_of(const Labeled& x, int id) {
  const auto it = std::find(x.ids.begin(), x.ids.end(), id);
  return it == x.ids.end() ? 1 : x.t.size(it - x.ids.begin());
}

// x's dims in the order of `ids` (all of which x has), expanded to `sizes`, as (groups...)
// folded into the given number of leading-group sizes.
Tensor arrange(const Labeled& x, const std::vector<int>& ids, const Shape& sizes, const Shape& folded) {
  std::vector<int64_t> perm;
  for (int id : ids) perm.push_back(std::find(x.ids.begin(), x.ids.end(), id) - x.ids.begin());
  return x.t.permute(perm).expand(sizes).reshape(folded);
}

// a and b contracted over the ids neither `keep` holds; batch ids (in both, kept) lead the result.
Labeled contract(const Labeled& a, const Labeled& b, const std::vector<int>& keep, std::string_view equation) {
  std::vector<int> batch, left, right, summed;
  for (int id : a.ids) {
    if (!contains(b.ids, id)) left.push_back(id);
    else if (contains(keep, id)) batch.push_back(id);
    else summed.push_back(id);
  }
  for (int id : b.ids)
    if (!contains(a.ids, id)) right.push_back(id);
  auto sizes = [&](const std::vector<int>& ids) {
    Shape s;
    for (int id : ids) {
      const int64_t sa = size_of(a, id), sb = size_of(b, id);
      STRATA_CHECK(sa == sb || sa == 1 || sb == 1, "[einsum] \"{}\": label {} has sizes {} and {}", equation,
                   id_name(id), sa, sb);
      s.push_back(std::max(sa, sb));
    }
    return s;
  };
  const Shape bs = sizes(batch), ls = sizes(left), rs = sizes(right), ks = sizes(summed);
  const int64_t B = checked_numel(bs, "einsum"), L = checked_numel(ls, "einsum"), R = checked_numel(rs, "einsum"),
                K = checked_numel(ks, "einsum");
  auto join = [](auto x, const auto& y, const auto& z) {  // label ids or sizes, in order
    x.insert(x.end(), y.begin(), y.end());
    x.insert(x.end(), z.begin(), z.end());
    return x;
  };
  const Tensor lhs = arrange(a, join(batch, left, summed), join(bs, ls, ks), {B, L, K});
  const Tensor rhs = arrange(b, join(batch, summed, right), join(bs, ks, rs), {B, K, R});
  return {bmm(lhs, rhs).reshape(join(bs, ls, rs)), join(batch, left, right)};
}

}  // namespace

Tensor einsum(std::string_view equation, const std::vector<Tensor>& operands) {
  amp::detail::AutocastScope amp_scope("einsum", operands);
  if (amp_scope.cast()) return einsum(equation, amp_scope.inputs());
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq.push_back(c);
  const size_t arrow = eq.find("->");
  STRATA_CHECK(arrow == std::string::npos || eq.find("->", arrow + 2) == std::string::npos,
               "[einsum] \"{}\": at most one \"->\"", equation);
  const std::string_view lhs = std::string_view(eq).substr(0, arrow);
  std::vector<Term> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(parse_term(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start),
                               equation));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  STRATA_CHECK(terms.size() == operands.size(), "[einsum] \"{}\" has {} operand terms, got {} operands", equation,
               terms.size(), operands.size());
  int64_t ell_rank = 0;
  for (size_t k = 0; k < operands.size(); ++k) {
    STRATA_CHECK(operands[k].defined(), "[einsum] \"{}\": operand {} is undefined", equation, k);
    const int64_t named = static_cast<int64_t>(terms[k].letters.size()) - (terms[k].has_ellipsis ? 1 : 0);
    if (terms[k].has_ellipsis) ell_rank = std::max(ell_rank, operands[k].dim() - named);
  }

  std::vector<Labeled> xs;
  std::vector<int> counts(static_cast<size_t>(kLetters + ell_rank), 0);
  for (size_t k = 0; k < operands.size(); ++k) {
    const std::vector<int> ids = dim_ids(terms[k], operands[k].dim(), ell_rank, k, equation);
    for (int id : ids) ++counts[static_cast<size_t>(id)];  // "ii" uses i twice: a trace
    xs.push_back(take_diagonals({operands[k], ids}, equation));
  }

  // the output's ids: as written, or else the ellipsis dims then the letters used once, in order
  std::vector<int> out;
  if (arrow != std::string::npos) {
    const Term t = parse_term(std::string_view(eq).substr(arrow + 2), equation);
    bool any_ellipsis = false;
    for (const Term& in : terms) any_ellipsis = any_ellipsis || in.has_ellipsis;
    STRATA_CHECK(!t.has_ellipsis || any_ellipsis,
                 "[einsum] \"{}\": the output's ellipsis needs one in an operand", equation);
    for (int l : t.letters) {
      if (l == kEllipsis) {
        for (int64_t e = 0; e < ell_rank; ++e) out.push_back(kLetters + static_cast<int>(e));
        continue;
      }
      STRATA_CHECK(counts[static_cast<size_t>(l)] > 0, "[einsum] \"{}\": output label {} is in no operand", equation,
                   letter_of(l));
      STRATA_CHECK(!contains(out, l), "[einsum] \"{}\": output label {} appears twice", equation, letter_of(l));
      out.push_back(l);
    }
  } else {
    for (int64_t e = 0; e < ell_rank; ++e) out.push_back(kLetters + static_cast<int>(e));
    for (int l = 0; l < kLetters; ++l)
      if (counts[static_cast<size_t>(l)] == 1) out.push_back(l);
  }

  // left to right: sum what no later term needs, then contract with the next operand
  auto needed_after = [&](size_t k) {
    std::vector<int> keep = out;
    for (size_t j = k + 1; j < xs.size(); ++j) keep.insert(keep.end(), xs[j].ids.begin(), xs[j].ids.end());
    return keep;
  };
  Labeled acc = sum_unneeded(xs[0], needed_after(0));
  for (size_t k = 1; k < xs.size(); ++k) {
    std::vector<int> keep = needed_after(k);
    std::vector<int> keep_or_acc = keep;
    keep_or_acc.insert(keep_or_acc.end(), acc.ids.begin(), acc.ids.end());
    const Labeled b = sum_unneeded(xs[k], keep_or_acc);
    acc = contract(acc, b, keep, equation);
  }
  // ids the output broadcasts (size 1 in every operand) stay; order as the output asks
  std::vector<int64_t> perm;
  for (int id : out) perm.push_back(std::find(acc.ids.begin(), acc.ids.end(), id) - acc.ids.begin());
  return acc.t.permute(perm);
}

}  // namespace strata
