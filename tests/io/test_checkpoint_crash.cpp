// A checkpoint writer killed with SIGKILL at random moments, over a hundred times: after each
// kill the path loads as a complete checkpoint (the previous one or a new one, never a mix),
// and at most the killed writer's one temporary lies beside it; the next writer removes it.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "io/checkpoint_testing.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// A model of ~1 MiB so that a save takes long enough to be interrupted often.
struct Blob : nn::Module {
  Tensor w = register_parameter("w", zeros({512, 512}));
  Tensor b = register_parameter("b", zeros({512}));
  std::string name() const override { return "Blob"; }
};

// Checkpoint number k: every weight equals k, and so do the step and the loader position, so a
// file mixing two saves cannot pass as either.
void save_numbered(const std::string& path, Blob& blob, int64_t k) {
  {
    NoGradGuard no_grad;
    blob.w.fill_(static_cast<double>(k));
    blob.b.fill_(static_cast<double>(k));
  }
  io::save_checkpoint(path, {.model = &blob, .config = {{"kind", "blob"}}},
                      {.step = k, .loader = {{"k", k}}, .metadata = {{"k", std::to_string(k)}}});
}

// The number of the checkpoint at `path`, after checking it is whole and consistent.
int64_t load_numbered(const std::string& path) {
  Blob blob;
  io::TrainingState state{.model = &blob, .config = {{"kind", "blob"}}};
  io::Checkpoint c = io::load_checkpoint(path, state);
  const int64_t k = c.step;
  EXPECT_EQ(c.loader.at("k"), k);
  EXPECT_EQ(c.metadata.at("k"), std::to_string(k));
  const float* w = blob.w.data_ptr<float>();
  for (int64_t i = 0; i < blob.w.numel(); ++i)
    if (w[i] != static_cast<float>(k)) {
      ADD_FAILURE() << "weight " << i << " is " << w[i] << " in checkpoint " << k;
      break;
    }
  EXPECT_EQ(blob.b.data_ptr<float>()[511], static_cast<float>(k));
  return k;
}

size_t count_temporaries(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind(".ck.safetensors.tmp-", 0) == 0;
  return n;
}

}  // namespace

// Saves checkpoints STRATA_CKPT_WRITER_START, +1, +2, ... to STRATA_CKPT_WRITER forever, after
// writing one byte to file descriptor STRATA_CKPT_WRITER_FD to say it has started.
TEST(CheckpointChild, Writer) {
  const char* path = std::getenv("STRATA_CKPT_WRITER");
  if (!path) GTEST_SKIP() << "runs only as the child of CheckpointCrash.KilledWriterNeverCorrupts";
  int64_t k = std::atoll(std::getenv("STRATA_CKPT_WRITER_START"));
  int fd = std::atoi(std::getenv("STRATA_CKPT_WRITER_FD"));
  Blob blob;
  char ready = 1;
  ASSERT_EQ(::write(fd, &ready, 1), 1);
  ::close(fd);
  for (;;) save_numbered(path, blob, k++);
}

TEST(CheckpointCrash, KilledWriterNeverCorrupts) {
  const strata::testing::TempDir temp("strata_ckpt");
  const std::string dir = temp.str(), path = dir + "/ck.safetensors";
  {
    Blob blob;
    save_numbered(path, blob, 0);
  }
  std::mt19937 rng(1234);
  int kills = 0, interrupted = 0, advanced = 0;
  int64_t last = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int round = 1; kills < 100; ++round) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << "too slow: " << kills << " kills";
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    const int64_t start = int64_t{round} * 100000;
    pid_t pid = strata::testing::spawn_self(
        "CheckpointChild.Writer",
        {"STRATA_CKPT_WRITER=" + path, "STRATA_CKPT_WRITER_START=" + std::to_string(start),
         "STRATA_CKPT_WRITER_FD=" + std::to_string(pipefd[1])},
        /*quiet=*/true);
    ::close(pipefd[1]);
    ASSERT_GT(pid, 0);
    char ready = 0;
    ASSERT_EQ(::read(pipefd[0], &ready, 1), 1) << "the writer did not start";
    ::close(pipefd[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 12000)(rng)));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended on its own, status " << status;
    ++kills;

    const size_t temps = count_temporaries(dir);
    ASSERT_LE(temps, 1u) << "after kill " << kills;
    interrupted += temps == 1;
    int64_t k = load_numbered(path);
    ASSERT_TRUE(k == last || (k >= start && k < start + 100000)) << "checkpoint " << k << " after kill " << kills;
    advanced += k != last;
    last = k;
  }
  // the kills must have hit both inside and between saves for this test to mean anything
  EXPECT_GE(kills, 100);
  EXPECT_GT(interrupted, 0) << "no kill interrupted a save";
  EXPECT_GT(advanced, 0) << "no writer completed a save";
  std::printf("%d kills: %d interrupted a save, %d found a new checkpoint\n", kills, interrupted, advanced);

  // a later save removes the dead writer's temporary
  {
    Blob blob;
    save_numbered(path, blob, 1);
  }
  EXPECT_EQ(count_temporaries(dir), 0u);
  EXPECT_EQ(load_numbered(path), 1);
}
