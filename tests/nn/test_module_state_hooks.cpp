// State dict hooks: pre-hooks before a module's children and post-hooks after them, with dotted
// prefixes; post-hooks renaming keys and replacing values, load pre-hooks renaming them back
// (the caller's dict untouched), load post-hooks seeing and clearing missing and unexpected keys
// under strict, removal (while running too), and errors in hooks leaving the values as they were.
#include <cstdio>
#include <string>
#include <vector>

#include <strata/io/checkpoint.hpp>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

struct Pair : nn::Module {
  nn::Linear a{2, 3}, b{3, 1};
  Pair() {
    register_module("a", a);
    register_module("b", b);
    to(kFloat64);
  }
  Tensor forward(const Tensor& x) override { return b(a(x)); }
  std::string name() const override { return "Pair"; }
};

// A dict of the model's keys with values 1, 2, 3, ... in key order (float64).
nn::StateDict counting_dict(const nn::Module& m) {
  nn::StateDict out;
  double next = 1;
  for (const auto& [k, t] : m.state_dict()) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (double& x : v) x = next++;
    out[k] = from_vector<double>(v, t.shape());
  }
  return out;
}

std::map<std::string, std::vector<double>> values_of(const nn::StateDict& dict) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& [k, t] : dict) out[k] = values(t);
  return out;
}

}  // namespace

TEST(StateDictHooks, PreHooksBeforeChildrenPostHooksAfterWithPrefixes) {
  Pair m;
  std::vector<std::string> order;
  auto pre = [&](const char* tag) {
    return [&order, tag](const nn::Module&, const std::string& prefix) { order.push_back(tag + (":" + prefix)); };
  };
  auto post = [&](const char* tag) {
    return [&order, tag](const nn::Module&, nn::StateDict&, const std::string& prefix) {
      order.push_back(tag + (":" + prefix));
    };
  };
  std::vector<nn::RemovableHandle> handles{
      m.register_state_dict_post_hook(post("post")), m.b.register_state_dict_post_hook(post("post")),
      m.a.register_state_dict_post_hook(post("post")), m.b.register_state_dict_pre_hook(pre("pre")),
      m.register_state_dict_pre_hook(pre("pre"))};
  m.state_dict();
  EXPECT_EQ(order, (std::vector<std::string>{"pre:", "pre:b.", "post:a.", "post:b.", "post:"}));
  for (auto& h : handles) h.remove();
  order.clear();
  m.state_dict();
  EXPECT_TRUE(order.empty());
}

TEST(StateDictHooks, PostHookRenamesAndReplacesAndLoadPreHookRenamesBack) {
  Pair m;
  const std::vector<double> weight = values(m.b.weight), bias = values(m.a.bias);
  m.b.register_state_dict_post_hook([](const nn::Module&, nn::StateDict& dict, const std::string& prefix) {
    dict[prefix + "kernel"] = dict.at(prefix + "weight");
    dict.erase(prefix + "weight");
  });
  m.register_state_dict_post_hook([](const nn::Module&, nn::StateDict& dict, const std::string&) {
    dict["a.bias"] = dict.at("a.bias") * 2.0;  // a new tensor: the module keeps its bias
  });
  nn::StateDict saved = m.state_dict();
  EXPECT_EQ(saved.count("b.weight"), 0u);
  EXPECT_TRUE(all_close(saved.at("b.kernel"), weight, 0, 0));
  std::vector<double> doubled;
  for (double v : bias) doubled.push_back(2 * v);
  EXPECT_TRUE(all_close(saved.at("a.bias"), doubled, 0, 0));
  EXPECT_TRUE(all_close(m.a.bias, bias, 0, 0));

  // the load pre-hooks undo both; the caller's dict is left as it was
  Pair fresh;
  fresh.b.register_load_state_dict_pre_hook([](nn::Module&, nn::StateDict& dict, const std::string& prefix) {
    dict[prefix + "weight"] = dict.at(prefix + "kernel");
    dict.erase(prefix + "kernel");
  });
  fresh.register_load_state_dict_pre_hook([](nn::Module&, nn::StateDict& dict, const std::string&) {
    dict["a.bias"] = dict.at("a.bias") * 0.5;
  });
  const auto before = values_of(saved);
  nn::LoadResult r = fresh.load_state_dict(saved);
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  EXPECT_EQ(values_of(saved), before);
  EXPECT_TRUE(all_close(fresh.b.weight, weight, 0, 0));
  EXPECT_TRUE(all_close(fresh.a.bias, bias, 1e-15, 0));
  EXPECT_TRUE(all_close(fresh.a.weight, values(m.a.weight), 0, 0));
}

TEST(StateDictHooks, LoadPostHooksSeeAndClearIncompatibleKeys) {
  Pair m;
  nn::StateDict dict = counting_dict(m);
  dict.erase("a.bias");
  dict["extra"] = from_vector<double>({7});
  std::vector<std::string> order;
  nn::LoadResult seen;
  m.a.register_load_state_dict_post_hook([&](nn::Module& mod, nn::LoadResult&) { order.push_back(mod.name()); });
  nn::RemovableHandle clearing = m.register_load_state_dict_post_hook([&](nn::Module& mod, nn::LoadResult& keys) {
    order.push_back(mod.name());
    seen = keys;
    keys.missing_keys.clear();  // a strict load then passes, as torch's
    keys.unexpected_keys.clear();
  });
  nn::LoadResult r = m.load_state_dict(dict, /*strict=*/true);
  EXPECT_EQ(order, (std::vector<std::string>{"Linear", "Pair"}));  // children first
  EXPECT_EQ(seen.missing_keys, std::vector<std::string>{"a.bias"});
  EXPECT_EQ(seen.unexpected_keys, std::vector<std::string>{"extra"});
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  EXPECT_TRUE(all_close(m.b.weight, values(dict.at("b.weight")), 0, 0));

  // a post-hook reporting a key makes a strict load raise, and the values written are put back
  clearing.remove();
  const auto held = values_of(m.state_dict());
  nn::StateDict full = counting_dict(m);
  for (auto& [k, t] : full) t = t + 100.0;
  m.register_load_state_dict_post_hook([](nn::Module&, nn::LoadResult& keys) {
    keys.missing_keys.push_back("reported.by.hook");
  });
  EXPECT_TRUE(
      throws_with([&] { m.load_state_dict(full); }, {"[load_state_dict] Pair", "missing keys: reported.by.hook"}));
  EXPECT_EQ(values_of(m.state_dict()), held);
  nn::LoadResult lax = m.load_state_dict(full, /*strict=*/false);  // non-strict: loaded, key reported
  EXPECT_EQ(lax.missing_keys, std::vector<std::string>{"reported.by.hook"});
  EXPECT_EQ(values_of(m.state_dict()), values_of(full));
}

TEST(StateDictHooks, AHookMayRemoveItselfWhileRunning) {
  Pair m;
  int calls = 0;
  nn::RemovableHandle self;
  self = m.a.register_state_dict_pre_hook([&](const nn::Module&, const std::string&) {
    ++calls;
    self.remove();
  });
  m.state_dict();
  m.state_dict();
  EXPECT_EQ(calls, 1);
}

TEST(StateDictHooks, ErrorsInHooksPropagateAndLeaveTheValues) {
  Pair m;
  const auto held = values_of(m.state_dict());
  nn::StateDict dict = counting_dict(m);
  nn::RemovableHandle h = m.b.register_state_dict_pre_hook([](const nn::Module&, const std::string& prefix) {
    throw Error("[state_dict] refused at " + prefix);
  });
  EXPECT_TRUE(throws_with([&] { m.state_dict(); }, {"refused at b."}));
  h.remove();
  h = m.a.register_load_state_dict_pre_hook([](nn::Module&, nn::StateDict&, const std::string&) {
    throw Error("load pre-hook refused");
  });
  EXPECT_TRUE(throws_with([&] { m.load_state_dict(dict); }, {"load pre-hook refused"}));
  EXPECT_EQ(values_of(m.state_dict()), held);
  h.remove();
  h = m.register_load_state_dict_post_hook([](nn::Module&, nn::LoadResult&) { throw Error("load post-hook refused"); });
  EXPECT_TRUE(throws_with([&] { m.load_state_dict(dict); }, {"load post-hook refused"}));
  EXPECT_EQ(values_of(m.state_dict()), held);  // written, then put back
  h.remove();
  h = m.a.register_state_dict_post_hook([](const nn::Module&, nn::StateDict&, const std::string&) {
    throw Error("state dict post-hook refused");
  });
  EXPECT_TRUE(throws_with([&] { m.state_dict(); }, {"state dict post-hook refused"}));
  h.remove();
  m.load_state_dict(dict);
  EXPECT_EQ(values_of(m.state_dict()), values_of(dict));
  EXPECT_TRUE(throws_with([&] { m.register_state_dict_post_hook(nn::StateDictPostHook()); }, {"hook is empty"}));
}

// check_state_dict (and load_checkpoint's model check through it) judges a dict as the load
// does: a model whose hooks rename its keys checks and restores its own checkpoint.
TEST(StateDictHooks, CheckAndCheckpointsSeeTheLoadPreHooks) {
  auto renaming = [](Pair& m) {
    m.b.register_state_dict_post_hook([](const nn::Module&, nn::StateDict& dict, const std::string& prefix) {
      dict[prefix + "kernel"] = dict.at(prefix + "weight");
      dict.erase(prefix + "weight");
    });
    m.b.register_load_state_dict_pre_hook([](nn::Module&, nn::StateDict& dict, const std::string& prefix) {
      if (!dict.count(prefix + "kernel")) return;
      dict[prefix + "weight"] = dict.at(prefix + "kernel");
      dict.erase(prefix + "kernel");
    });
  };
  Pair m, fresh;
  renaming(m);
  renaming(fresh);
  const nn::StateDict saved = m.state_dict();
  EXPECT_TRUE(fresh.check_state_dict(saved).empty());
  nn::StateDict unrenamed = saved;
  unrenamed["b.weight"] = unrenamed.at("b.kernel");
  unrenamed.erase("b.kernel");
  EXPECT_TRUE(fresh.check_state_dict(unrenamed).empty());  // the pre-hook leaves it alone
  unrenamed.erase("b.weight");
  EXPECT_EQ(fresh.check_state_dict(unrenamed).size(), 1u);  // missing b.weight

  const std::string path = ::testing::TempDir() + "state_hooks_checkpoint.safetensors";
  io::save_checkpoint(path, {.model = &m}, {.step = 3});
  io::TrainingState into{.model = &fresh};
  EXPECT_EQ(io::load_checkpoint(path, into).step, 3);
  EXPECT_TRUE(all_close(fresh.b.weight, values(m.b.weight), 0, 0));
  EXPECT_TRUE(all_close(fresh.a.weight, values(m.a.weight), 0, 0));
  std::remove(path.c_str());

  // with a load post-hook, missing keys are the load's to judge (the hook may clear them)
  Pair cleared;
  cleared.register_load_state_dict_post_hook([](nn::Module&, nn::LoadResult& keys) { keys.missing_keys.clear(); });
  EXPECT_TRUE(cleared.check_state_dict(unrenamed).empty());
  EXPECT_NO_THROW(cleared.load_state_dict(unrenamed));
}

// A child registered under two names (tied weights) is written once per name; when the strict
// check after the post-hooks raises, the value before the load comes back, not the first name's.
TEST(StateDictHooks, FailedLoadPutsBackTiedWeightsAsTheyWere) {
  struct Tied : nn::Module {
    nn::Linear a{2, 2};
    Tied() {
      register_module("a", a);
      register_module("tied", a);
      to(kFloat64);
    }
    Tensor forward(const Tensor& x) override { return a(x); }
  } m;
  const std::vector<double> weight = values(m.a.weight), bias = values(m.a.bias);
  nn::StateDict dict = m.state_dict();
  ASSERT_TRUE(dict.count("a.weight") && dict.count("tied.weight"));
  for (auto& [k, t] : dict) t = t + 5.0;
  m.register_load_state_dict_post_hook([](nn::Module&, nn::LoadResult& keys) { keys.missing_keys.push_back("x"); });
  EXPECT_TRUE(throws_with([&] { m.load_state_dict(dict); }, {"missing keys: x"}));
  EXPECT_EQ(values(m.a.weight), weight);
  EXPECT_EQ(values(m.a.bias), bias);
}
