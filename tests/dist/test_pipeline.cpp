// GPipe and 1F1B under mpirun: one block per rank, micro-batches through send/recv; the loss,
// every stage's gradients and the parameters after SGD steps equal those of the whole chain of
// blocks trained in one process on the whole batch (float64), with fewer and more micro-batches
// than stages; 1F1B's gradients equal GPipe's, and it holds at most stages - rank micro-batches'
// activations at once (counted by the stage itself: forwards whose backward has not arrived).
#include "dist/dist_testing.h"
#include "dist/pipeline_blocks.h"

namespace strata {
namespace {

namespace F = nn::functional;

using pipeline_testing::Block;
using pipeline_testing::grads;
using pipeline_testing::make_block;

template <class Schedule>
void trains_like_the_whole_chain(int64_t chunks) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  std::vector<std::unique_ptr<Block>> whole;
  for (int k = 0; k < n; ++k) whole.push_back(make_block(k, n));
  auto mine = make_block(r, n), twin = make_block(r, n);  // twin: the same stage under GPipe
  Schedule pipe(*mine, {.chunks = chunks});
  dist::GPipe gpipe(*twin, {.chunks = chunks});
  optim::SGD opt(mine->parameters(), {.lr = 0.1}), twin_opt(twin->parameters(), {.lr = 0.1});
  std::vector<Tensor> whole_params;  // the reference trains the whole chain
  for (auto& b : whole)
    for (const Tensor& p : b->parameters()) whole_params.push_back(p);
  optim::SGD ref_opt(whole_params, {.lr = 0.1});
  auto mse = [](const Tensor& out, const Tensor& t) { return F::mse_loss(out, t); };
  for (int step = 0; step < 3; ++step) {
    Generator data(7 + static_cast<uint64_t>(step));
    Tensor x = randn({24, 5}, TensorOptions(kFloat64), &data), y = randn({24, 3}, TensorOptions(kFloat64), &data);
    // ranks other than the first and last pass nothing they do not need
    Tensor loss = pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(), mse);
    Tensor twin_loss = gpipe.train_step(x, y, mse);
    Tensor h = x;
    for (auto& b : whole) h = (*b)(h);
    Tensor ref_loss = mse(h, y);
    ref_loss.backward();  // every rank trains the whole chain; only its own block is compared
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-12);
    EXPECT_NEAR(loss.item<double>(), twin_loss.item<double>(), 1e-12);
    auto got = grads(*mine), want = grads(*whole[static_cast<size_t>(r)]), gpipe_grads = grads(*twin);
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE(allclose(got[k], want[k], 1e-12, 1e-13)) << "gradient " << k;
      EXPECT_TRUE(allclose(got[k], gpipe_grads[k], 1e-12, 1e-13)) << "gradient " << k << " against GPipe's";
    }
    opt.step();
    twin_opt.step();
    ref_opt.step();
    for (auto& b : whole) b->zero_grad();
    opt.zero_grad();
    twin_opt.zero_grad();
    auto params = mine->parameters(), ref_params = whole[static_cast<size_t>(r)]->parameters();
    for (size_t k = 0; k < params.size(); ++k)
      EXPECT_TRUE(allclose(params[k], ref_params[k], 1e-12, 1e-13)) << "param " << k;
  }
  // GPipe holds every micro-batch at its peak; 1F1B at most stages - rank, whatever chunks is
  const int64_t bound = std::is_same_v<Schedule, dist::GPipe> ? chunks : std::min<int64_t>(chunks, n - r);
  EXPECT_EQ(pipe.max_in_flight(), bound);
  EXPECT_EQ(*mine->peak, bound);  // the stage's own count agrees
  EXPECT_EQ(*mine->live, 0);
  EXPECT_EQ(gpipe.max_in_flight(), chunks);
  // the forward alone gives the chain's output on the last rank
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

// chunks below, at and above the number of stages (2 or 4)
TEST(GPipe, TrainsLikeTheWholeChainInOneProcess) {
  for (int64_t chunks : {1, 3, 4, 8}) {
    SCOPED_TRACE(fmt::format("{} micro-batches", chunks));
    trains_like_the_whole_chain<dist::GPipe>(chunks);
  }
}

TEST(Schedule1F1B, TrainsLikeTheWholeChainAndGPipeWithBoundedActivations) {
  for (int64_t chunks : {1, 3, 4, 8, 24}) {
    SCOPED_TRACE(fmt::format("{} micro-batches", chunks));
    trains_like_the_whole_chain<dist::Schedule1F1B>(chunks);
  }
}

// A schedule with its order of actions in reach.
template <class Schedule>
struct Exposed : Schedule {
  using Schedule::Schedule;
  using Schedule::actions;
};

// Every rank's sends and receives in train_step's order (the actions from each rank's own
// schedule), replayed with the strictest backend: a send waits for its receive and a receive for
// its send, one at a time (as NCCL's, all on one stream, may for large messages). Each message
// meets the one it should, and no rank waits forever.
template <class Schedule>
void messages_meet_with_blocking_sends(int64_t chunks) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  nn::Linear stage(2, 2);
  Exposed<Schedule> pipe(stage, {.chunks = chunks});
  std::vector<int64_t> mine;  // (forward, micro-batch, send after the next receive) per action
  for (const auto& a : pipe.actions())
    mine.insert(mine.end(), {int64_t{a.forward}, a.micro_batch, int64_t{a.send_after_next_receive}});
  EXPECT_EQ(static_cast<int64_t>(mine.size()), 6 * chunks);
  mine.resize(static_cast<size_t>(6 * chunks));
  std::vector<Tensor> all;
  for (int k = 0; k < n; ++k) all.push_back(empty({6 * chunks}, TensorOptions(kInt64)));
  pg->allgather(all, from_vector(mine))->wait();

  struct Message {
    bool send;
    int peer;
    bool activation;
    int64_t micro_batch;
  };
  std::vector<std::vector<Message>> messages(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    const int64_t* a = all[static_cast<size_t>(k)].data_ptr<int64_t>();
    std::vector<Message>& out = messages[static_cast<size_t>(k)];
    std::optional<Message> held;
    for (int64_t i = 0; i < 2 * chunks; ++i) {
      const bool forward = a[3 * i] != 0, later = a[3 * i + 2] != 0;
      const int64_t m = a[3 * i + 1];
      if (forward) {
        if (k > 0) out.push_back({false, k - 1, true, m});
        const Message send{true, k + 1, true, m};
        if (k < n - 1 && later) held = send;
        else if (k < n - 1) out.push_back(send);
      } else {
        if (k < n - 1) out.push_back({false, k + 1, false, m});
        if (held) out.push_back(*std::exchange(held, std::nullopt));
        if (k > 0) out.push_back({true, k - 1, false, m});
      }
    }
  }
  std::vector<size_t> at(static_cast<size_t>(n), 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int k = 0; k < n; ++k) {
      const auto& mk = messages[static_cast<size_t>(k)];
      if (at[k] == mk.size() || !mk[at[k]].send) continue;
      const Message& s = mk[at[k]];
      const auto& mp = messages[static_cast<size_t>(s.peer)];
      size_t& ap = at[static_cast<size_t>(s.peer)];
      if (ap == mp.size() || mp[ap].send || mp[ap].peer != k) continue;
      EXPECT_TRUE(mp[ap].activation == s.activation && mp[ap].micro_batch == s.micro_batch)
          << "rank " << s.peer << " receives another message than rank " << k << " sends";
      ++at[k];
      ++ap;
      moved = true;
    }
  }
  for (int k = 0; k < n; ++k)
    EXPECT_EQ(at[k], messages[static_cast<size_t>(k)].size()) << "rank " << k << " waits forever";
}

TEST(Schedule1F1B, MessagesMeetWithSendsThatWaitForTheirReceive) {
  for (int64_t chunks : {1, 2, 3, 4, 8, 9}) {
    SCOPED_TRACE(fmt::format("{} micro-batches", chunks));
    messages_meet_with_blocking_sends<dist::Schedule1F1B>(chunks);
    messages_meet_with_blocking_sends<dist::GPipe>(chunks);
  }
}

TEST(GPipe, BadBatchesRaise) {
  auto pg = dist_testing::group();
  nn::Linear stage(2, 2);
  EXPECT_TRUE(testing::throws_with([&] { dist::GPipe(stage, {.chunks = 0}); }, {"chunks"}));
  EXPECT_TRUE(testing::throws_with([&] { dist::Schedule1F1B(stage, {.chunks = -1}); }, {"[Schedule1F1B]", "chunks"}));
  if (pg->size() > 1) return;  // a split that raises on one rank alone would leave the others waiting
  dist::GPipe pipe(stage, {.chunks = 3});
  EXPECT_TRUE(testing::throws_with([&] { pipe.train_step(zeros({4, 2}), zeros({4, 2}), nullptr); },
                                   {"does not split into 3"}));
}

}  // namespace
}  // namespace strata
