// einsum against the definition, evaluated here in float64 by a loop over every assignment of
// the labels (a product of the operands' elements added into the output element they name):
// products, batched and attention-shaped contractions, diagonals, traces, transposes, sums,
// outer products, three-operand chains, implicit outputs, ellipses and broadcast sizes; in
// float32 and through transposed operands; finite differences to second order; bad equations.
#include <map>
#include <string>

#include "gradcheck.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;
using V = const std::vector<Tensor>&;

namespace {

// out[labels of the output] = sum over all other labels of prod_k operand_k[its labels]; a label
// of size 1 in an operand reads index 0 whatever the label's value (broadcast).
std::vector<double> einsum_reference(const std::string& equation, const std::vector<Tensor>& xs) {
  const size_t arrow = equation.find("->");
  const std::string out = equation.substr(arrow + 2);
  std::vector<std::string> terms;
  std::string cur;
  for (char c : equation.substr(0, arrow)) {
    if (c == ',') {
      terms.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  terms.push_back(cur);
  std::map<char, int64_t> size;
  for (size_t k = 0; k < terms.size(); ++k)
    for (size_t d = 0; d < terms[k].size(); ++d)
      size[terms[k][d]] = std::max(size[terms[k][d]], xs[k].size(static_cast<int64_t>(d)));
  std::vector<char> labels;
  for (auto& [c, s] : size) labels.push_back(c);
  std::vector<std::vector<double>> vals;
  for (const Tensor& x : xs) vals.push_back(values(x));
  int64_t out_numel = 1;
  for (char c : out) out_numel *= size[c];
  std::vector<double> result(static_cast<size_t>(out_numel), 0.0);
  std::map<char, int64_t> at;
  for (char c : labels) at[c] = 0;
  while (true) {
    double p = 1;
    for (size_t k = 0; k < terms.size(); ++k) {
      int64_t flat = 0;
      for (size_t d = 0; d < terms[k].size(); ++d) {
        const int64_t n = xs[k].size(static_cast<int64_t>(d));
        flat = flat * n + (n == 1 ? 0 : at[terms[k][d]]);
      }
      p *= vals[k][static_cast<size_t>(flat)];
    }
    int64_t o = 0;
    for (char c : out) o = o * size[c] + at[c];
    result[static_cast<size_t>(o)] += p;
    size_t i = labels.size();  // next assignment, the last label fastest
    while (i > 0 && ++at[labels[i - 1]] == size[labels[i - 1]]) at[labels[--i]] = 0;
    if (i == 0) break;
  }
  return result;
}

struct Case {
  std::string equation;   // as einsum takes it
  std::string reference;  // the same with explicit labels and output
  std::vector<Shape> shapes;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"ij,jk->ik", "ij,jk->ik", {{3, 4}, {4, 5}}},
      {"bij,bjk->bik", "bij,bjk->bik", {{2, 3, 4}, {2, 4, 2}}},
      {"bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}},
      {"ii->i", "ii->i", {{4, 4}}},
      {"ii", "ii->", {{4, 4}}},
      {"bii->b", "bii->b", {{3, 4, 4}}},
      {"ij->ji", "ij->ji", {{3, 5}}},
      {"ba", "ba->ab", {{3, 5}}},
      {"ij->", "ij->", {{3, 5}}},
      {"i,j->ij", "i,j->ij", {{3}, {4}}},
      {"i,i->", "i,i->", {{6}, {6}}},
      {"ij,jk", "ij,jk->ik", {{3, 4}, {4, 2}}},
      {"ij,jk,kl->il", "ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}},
      {"bn,anm,bm->ba", "bn,anm,bm->ba", {{2, 3}, {4, 3, 5}, {2, 5}}},
      {"iJ,Jk->ki", "iJ,Jk->ki", {{3, 4}, {4, 2}}},
      {"...ij,...jk->...ik", "abij,abjk->abik", {{2, 3, 2, 4}, {2, 3, 4, 3}}},
      {"...ij,jk", "aij,jk->aik", {{3, 2, 4}, {4, 3}}},
      {"b...,b...->b", "bxy,bxy->b", {{2, 3, 4}, {2, 3, 4}}},
      {"...ii->...i", "aii->ai", {{3, 4, 4}}},
      {"ij,kj->ikj", "ij,kj->ikj", {{3, 4}, {2, 4}}},
      {"bij,bjk->ik", "bij,bjk->ik", {{1, 3, 4}, {2, 4, 2}}},  // b broadcasts, then is summed
      {"ij,ij->ij", "ij,ij->ij", {{3, 1}, {3, 4}}},
      {"ijk,ikj->", "ijk,ikj->", {{2, 3, 4}, {2, 4, 3}}},
  };
  return all;
}

}  // namespace

TEST(Einsum, MatchesTheDefinition) {
  Generator g(41);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.equation);
    std::vector<Tensor> xs;
    for (const Shape& s : c.shapes) xs.push_back(randn(s, kFloat64, &g));
    const std::vector<double> want = einsum_reference(c.reference, xs);
    EXPECT_TRUE(all_close(einsum(c.equation, xs), want, 1e-12, 1e-12));
    std::vector<Tensor> f32, transposed;
    for (const Tensor& x : xs) {
      f32.push_back(x.to(kFloat32));
      // the same values read through a transposed layout
      transposed.push_back(x.dim() >= 2 ? x.transpose(0, -1).contiguous().transpose(0, -1) : x);
    }
    EXPECT_TRUE(all_close(einsum(c.equation, f32), want, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(einsum(c.equation, transposed), want, 1e-12, 1e-12));
  }
}

TEST(Einsum, ResultShapesFollowTheOutput) {
  EXPECT_EQ(einsum("ii", {randn({4, 4})}).dim(), 0);
  EXPECT_EQ(einsum("ba", {randn({3, 5})}).shape(), (Shape{5, 3}));
  EXPECT_EQ(einsum("...ij->...ji", {randn({2, 3, 4, 5})}).shape(), (Shape{2, 3, 5, 4}));
  EXPECT_EQ(einsum("i j , j k -> i k", {randn({2, 3}), randn({3, 4})}).shape(), (Shape{2, 4}));
  // ellipses of different ranks broadcast from the right
  EXPECT_EQ(einsum("...i,...i->...", {randn({2, 3, 4}), randn({3, 4})}).shape(), (Shape{2, 3}));
}

TEST(Einsum, GradientsToSecondOrder) {
  std::vector<strata::testing::GradCase> grad_cases;
  for (const char* eq : {"ij,jk->ik", "bhqd,bhkd->bhqk", "ii->i", "ij,jk,kl->il", "...ij,jk"}) {
    const Case* found = nullptr;
    for (const Case& c : cases())
      if (c.equation == eq) found = &c;
    ASSERT_NE(found, nullptr) << eq;
    const std::string e = eq;
    grad_cases.push_back({eq, [e](V in) { return einsum(e, in); }, found->shapes});
  }
  strata::testing::check_cases_to_second_order(grad_cases, 42);
}

TEST(Einsum, BadEquationsRaise) {
  const Tensor a = randn({3, 4}), b = randn({4, 5});
  EXPECT_TRUE(throws_with([&] { einsum("ij,jk->ik", {a}); }, {"[einsum]", "2 operand terms, got 1"}));
  EXPECT_TRUE(throws_with([&] { einsum("ij,jk->i1", {a, b}); }, {"letters", "'1'"}));
  EXPECT_TRUE(throws_with([&] { einsum("ij,ik->jk", {a, b}); }, {"label i has sizes 3 and 4"}));
  EXPECT_TRUE(throws_with([&] { einsum("ijk,jk->ik", {a, b}); }, {"operand 0 has 2 dims", "name 3"}));
  EXPECT_TRUE(throws_with([&] { einsum("ij,jk->iz", {a, b}); }, {"output label z is in no operand"}));
  EXPECT_TRUE(throws_with([&] { einsum("ij,jk->ii", {a, b}); }, {"output label i appears twice"}));
  EXPECT_TRUE(throws_with([&] { einsum("ii->i", {a}); }, {"label i repeated", "3 and 4"}));
  EXPECT_TRUE(throws_with([&] { einsum("...i...->i", {a}); }, {"one ellipsis"}));
  EXPECT_TRUE(throws_with([&] { einsum("..i->i", {a}); }, {"three dots"}));
  EXPECT_TRUE(throws_with([&] { einsum("ij->ji->ij", {a}); }, {"at most one \"->\""}));
  EXPECT_TRUE(throws_with([&] { einsum("ij->...ij", {a}); }, {"ellipsis needs one in an operand"}));
  EXPECT_TRUE(throws_with([&] { einsum("ij", {Tensor()}); }, {"operand 0 is undefined"}));
}
