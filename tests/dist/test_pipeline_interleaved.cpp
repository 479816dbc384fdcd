// The interleaved 1F1B schedule under mpirun with 2 and 3 blocks per rank (block s on rank
// s % ranks): the loss, every block's gradients and its parameters after SGD steps equal those
// of the whole chain trained in one process (float64, 1e-12) and those of GPipe running the same
// blocks in contiguous runs, one run per rank; the activations alive at once, counted by the
// schedule and by the blocks themselves, reach exactly the documented bound; every rank's
// messages meet the ones they should; the micro-batch counts it cannot take raise.
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "dist/dist_testing.h"
#include "dist/pipeline_blocks.h"

namespace strata {
namespace {

namespace F = nn::functional;
using pipeline_testing::Block;
using pipeline_testing::make_block;

// GPipe's stage: blocks first .. first + count - 1 of the chain, in a row.
struct Run : nn::Module {
  std::vector<Block*> blocks;  // owned as children
  Run(int first, int count, int total) {
    for (int k = first; k < first + count; ++k)
      blocks.push_back(&register_module("block" + std::to_string(k), make_block(k, total)));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& b : blocks) h = (*b)(h);
    return h;
  }
};

// Every block's parameters (or gradients) on every rank: block k's flattened at its place in the
// chain, from the rank that holds it (the others add zeros, so the sum is exact).
Tensor chain_values(const std::vector<std::pair<int, Block*>>& held, int total, bool gradients) {
  std::vector<Tensor> parts;
  for (int k = 0; k < total; ++k) {
    auto reference = make_block(k, total);  // the shapes
    Block* mine = nullptr;
    for (const auto& [index, block] : held)
      if (index == k) mine = block;
    for (const Tensor& p : (mine ? mine : reference.get())->parameters()) {
      Tensor v = gradients ? p.grad() : p.detach();
      parts.push_back(mine ? v.flatten().clone() : zeros({p.numel()}, TensorOptions(kFloat64)));
    }
  }
  Tensor flat = cat(parts, 0);
  dist_testing::group()->allreduce(flat)->wait();
  return flat;
}

void trains_like_the_chain_and_gpipe(int v, int64_t chunks) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), p = pg->size(), total = p * v;
  std::vector<std::unique_ptr<Block>> whole;
  for (int k = 0; k < total; ++k) whole.push_back(make_block(k, total));
  std::vector<std::unique_ptr<Block>> mine;
  std::vector<nn::Module*> stages;
  std::vector<std::pair<int, Block*>> held, gpipe_held;
  auto live = std::make_shared<int64_t>(0), peak = std::make_shared<int64_t>(0);
  for (int c = 0; c < v; ++c) {
    mine.push_back(make_block(c * p + r, total));
    mine.back()->live = live;  // one count over this rank's blocks
    mine.back()->peak = peak;
    stages.push_back(mine.back().get());
    held.emplace_back(c * p + r, mine.back().get());
  }
  Run run(r * v, v, total);
  for (int i = 0; i < v; ++i) gpipe_held.emplace_back(r * v + i, run.blocks[static_cast<size_t>(i)]);
  dist::ScheduleInterleaved1F1B pipe(stages, {.chunks = chunks});
  dist::GPipe gpipe(run, {.chunks = chunks});
  EXPECT_EQ(pipe.num_stages(), total);
  EXPECT_EQ(pipe.stages_per_rank(), v);
  std::vector<Tensor> params, whole_params;
  for (auto& b : mine)
    for (const Tensor& t : b->parameters()) params.push_back(t);
  for (auto& b : whole)
    for (const Tensor& t : b->parameters()) whole_params.push_back(t);
  optim::SGD opt(params, {.lr = 0.1}), gpipe_opt(run.parameters(), {.lr = 0.1}), ref_opt(whole_params, {.lr = 0.1});
  auto mse = [](const Tensor& out, const Tensor& t) { return F::mse_loss(out, t); };
  for (int step = 0; step < 3; ++step) {
    Generator data(7 + static_cast<uint64_t>(step));
    Tensor x = randn({24, 5}, TensorOptions(kFloat64), &data), y = randn({24, 3}, TensorOptions(kFloat64), &data);
    Tensor loss = pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(), mse);
    Tensor gpipe_loss = gpipe.train_step(x, y, mse);
    Tensor h = x;
    for (auto& b : whole) h = (*b)(h);
    Tensor ref_loss = mse(h, y);
    ref_loss.backward();
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-12);
    EXPECT_NEAR(loss.item<double>(), gpipe_loss.item<double>(), 1e-12);
    std::vector<std::pair<int, Block*>> all;
    for (int k = 0; k < total; ++k) all.emplace_back(k, whole[static_cast<size_t>(k)].get());
    Tensor got = chain_values(held, total, true), gpipe_grads = chain_values(gpipe_held, total, true);
    Tensor want = cat([&] {
      std::vector<Tensor> g;
      for (const Tensor& t : whole_params) g.push_back(t.grad().flatten());
      return g;
    }(), 0);
    EXPECT_TRUE(allclose(got, want, 1e-12, 1e-13)) << "against the whole chain";
    EXPECT_TRUE(allclose(got, gpipe_grads, 1e-12, 1e-13)) << "against GPipe";
    opt.step();
    gpipe_opt.step();
    ref_opt.step();
    opt.zero_grad();
    gpipe_opt.zero_grad();
    ref_opt.zero_grad();
    Tensor trained = chain_values(held, total, false), ref_trained = chain_values(all, total, false);
    // every rank holds the whole chain, so the sum over ranks is p times it
    EXPECT_TRUE(allclose(trained, ref_trained / static_cast<double>(p), 1e-12, 1e-13)) << "parameters";
  }
  const int64_t bound = std::min<int64_t>(v * chunks, (v - 1) * p + 2 * (p - r - 1) + 1);
  EXPECT_EQ(pipe.max_in_flight(), bound);
  EXPECT_EQ(*peak, bound);  // the blocks' own count agrees
  EXPECT_EQ(*live, 0);
  Generator data(3);
  Tensor x = randn({24, 5}, TensorOptions(kFloat64), &data);
  Tensor out = pipe.forward(x);
  if (pipe.is_last()) {
    NoGradGuard no_grad;
    Tensor h = x;
    for (auto& b : whole) h = (*b)(h);
    EXPECT_TRUE(allclose(out, h, 1e-12, 1e-13));
  } else {
    EXPECT_FALSE(out.defined());
  }
}

TEST(ScheduleInterleaved1F1B, TrainsLikeTheWholeChainAndGPipeWithBoundedActivations) {
  const int64_t p = dist_testing::group()->size();
  for (int v : {2, 3})
    for (int64_t chunks : {p, 2 * p, 3 * p}) {
      SCOPED_TRACE(fmt::format("{} stages per rank, {} micro-batches", v, chunks));
      trains_like_the_chain_and_gpipe(v, chunks);
    }
}

struct Exposed : dist::ScheduleInterleaved1F1B {
  using ScheduleInterleaved1F1B::actions;
  using ScheduleInterleaved1F1B::ScheduleInterleaved1F1B;
};

// Every rank's sends and receives in train_step's order, from each rank's own actions, replayed
// as MPI runs them (a send never waits; a receive waits for the first message not yet received
// from its peer with its tag): each receive gets the message it should, every rank finishes.
void messages_meet(int v, int64_t chunks) {
  auto pg = dist_testing::group();
  const int p = pg->size();
  std::vector<nn::Linear> layers;
  for (int c = 0; c < v; ++c) layers.emplace_back(2, 2);
  std::vector<nn::Module*> stages;
  for (auto& l : layers) stages.push_back(&l);
  Exposed pipe(stages, {.chunks = chunks});
  const int64_t n = 2 * v * chunks;
  std::vector<int64_t> mine;  // (forward, micro-batch, local stage) per action
  std::set<std::tuple<bool, int64_t, int64_t>> seen;
  for (const auto& a : pipe.actions()) {
    mine.insert(mine.end(), {int64_t{a.forward}, a.micro_batch, a.local_stage});
    EXPECT_TRUE(seen.insert({a.forward, a.micro_batch, a.local_stage}).second) << "an action twice";
    if (!a.forward) EXPECT_TRUE(seen.count({true, a.micro_batch, a.local_stage})) << "a backward before its forward";
  }
  ASSERT_EQ(static_cast<int64_t>(mine.size()), 3 * n);
  std::vector<Tensor> all;
  for (int k = 0; k < p; ++k) all.push_back(empty({3 * n}, TensorOptions(kInt64)));
  pg->allgather(all, from_vector(mine))->wait();

  // a message names the global stage it leaves, whether it is an activation and its micro-batch
  using Message = std::tuple<int64_t, bool, int64_t>;
  struct Op {
    bool send;
    int peer;
    Message message;
  };
  const int64_t last = int64_t{p} * v - 1;
  std::vector<std::vector<Op>> ops(static_cast<size_t>(p));
  for (int k = 0; k < p; ++k) {
    const int64_t* a = all[static_cast<size_t>(k)].data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t m = a[3 * i + 1], s = a[3 * i + 2] * p + k;  // the global stage
      const int next = (k + 1) % p, previous = (k + p - 1) % p;
      auto& out = ops[static_cast<size_t>(k)];
      if (a[3 * i] != 0) {
        if (s > 0) out.push_back({false, previous, {s - 1, true, m}});
        if (s < last) out.push_back({true, next, {s, true, m}});
      } else {
        if (s < last) out.push_back({false, next, {s + 1, false, m}});
        if (s > 0) out.push_back({true, previous, {s, false, m}});
      }
    }
  }
  std::map<std::tuple<int, int, bool>, std::deque<Message>> in_transit;  // (from, to, activation)
  std::vector<size_t> at(static_cast<size_t>(p), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int k = 0; k < p; ++k) {
      auto& mine_ops = ops[static_cast<size_t>(k)];
      for (size_t& i = at[static_cast<size_t>(k)]; i < mine_ops.size(); ++i, moved = true) {
        const Op& op = mine_ops[i];
        const bool activation = std::get<1>(op.message);
        if (op.send) {
          in_transit[{k, op.peer, activation}].push_back(op.message);
          continue;
        }
        auto& queue = in_transit[{op.peer, k, activation}];
        if (queue.empty()) break;
        EXPECT_EQ(queue.front(), op.message) << "rank " << k << " receives another message than it expects";
        queue.pop_front();
      }
    }
  }
  for (int k = 0; k < p; ++k)
    EXPECT_EQ(at[static_cast<size_t>(k)], ops[static_cast<size_t>(k)].size()) << "rank " << k << " waits forever";
}

TEST(ScheduleInterleaved1F1B, MessagesMeet) {
  const int64_t p = dist_testing::group()->size();
  for (int v : {1, 2, 3, 4})
    for (int64_t chunks : {p, 2 * p, 5 * p}) {
      SCOPED_TRACE(fmt::format("{} stages per rank, {} micro-batches", v, chunks));
      messages_meet(v, chunks);
    }
}

TEST(ScheduleInterleaved1F1B, ChunksTheScheduleCannotTakeRaise) {
  auto pg = dist_testing::group();
  const int64_t p = pg->size();
  nn::Linear a(2, 2), b(2, 2);
  for (int64_t chunks : {int64_t{1}, p + 1, 3 * p - 1}) {
    const std::string count = fmt::format("{} micro-batches", chunks);
    EXPECT_TRUE(testing::throws_with([&] { dist::ScheduleInterleaved1F1B({&a, &b}, {.chunks = chunks}); },
                                     {"[ScheduleInterleaved1F1B]", "multiple of the", count.c_str()}));
  }
  EXPECT_TRUE(testing::throws_with([&] { dist::ScheduleInterleaved1F1B({&a, &b}, {.chunks = 0}); }, {"chunks"}));
  EXPECT_TRUE(testing::throws_with([&] { dist::ScheduleInterleaved1F1B({}, {.chunks = p}); }, {"no stage"}));
  EXPECT_TRUE(testing::throws_with([&] { dist::ScheduleInterleaved1F1B({&a, nullptr}, {.chunks = p}); },
                                   {"stage 1 is null"}));
  // one rank with a stage more: every rank raises (the layouts are compared)
  nn::Linear c(2, 2);
  std::vector<nn::Module*> stages{&a, &b};
  if (pg->rank() == p - 1) stages.push_back(&c);
  const std::string last = fmt::format("rank {} has 3 stages", p - 1);
  EXPECT_TRUE(testing::throws_with([&] { dist::ScheduleInterleaved1F1B(stages, {.chunks = p}); },
                                   {last.c_str(), "rank 0 2 and", "every rank needs the same"}));
  // arguments only one rank gets wrong: that rank raises its error, every other rank names it
  // (instead of waiting for it in the comparison of the layouts)
  const bool odd_one = pg->rank() == p - 1;
  const std::string failed = fmt::format("rank {}", p - 1);
  const std::vector<std::pair<std::vector<nn::Module*>, int64_t>> wrong_on_the_last{
      {{&a, &b}, odd_one ? p + 1 : p}, {odd_one ? std::vector<nn::Module*>{} : std::vector<nn::Module*>{&a}, p},
      {{&a, &b}, odd_one ? 0 : p}};
  const std::vector<const char*> causes{"multiple of the", "no stage", "chunks must be positive"};
  for (size_t k = 0; k < causes.size(); ++k) {
    const auto& [wrong_stages, wrong_chunks] = wrong_on_the_last[k];
    EXPECT_TRUE(testing::throws_with(
        [&] { dist::ScheduleInterleaved1F1B(wrong_stages, {.chunks = wrong_chunks}); },
        {"[ScheduleInterleaved1F1B]", odd_one ? causes[k] : failed.c_str()}));
  }
  auto alone = dist::new_group({0});  // collective: every rank makes it
  if (alone->is_member())
    EXPECT_TRUE(testing::throws_with(
        [&] { dist::ScheduleInterleaved1F1B({&a, &b}, {.chunks = 2, .process_group = alone}); }, {"at least 2 ranks"}));
}

}  // namespace
}  // namespace strata
