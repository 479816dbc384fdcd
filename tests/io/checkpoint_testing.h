// Helpers for the checkpoint tests: a small training run whose every step depends on random
// state (data drawn from a generator, Dropout on the default generator), and starting this
// test binary again as a child process running one test.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits.h>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "testing.h"

#include <strata/io/checkpoint.hpp>

extern char** environ;

namespace strata::testing {

/// MLP + Dropout trained with AdamW under warmup + cosine, on batches drawn from `data`.
struct TinyRun {
  Generator init, data;
  nn::Sequential model;
  optim::AdamW opt;
  optim::WarmupCosine sched;

  TinyRun(uint64_t init_seed, uint64_t data_seed, int64_t hidden = 32)
      : init(init_seed),
        data(data_seed),
        model(nn::Linear(8, hidden, {.generator = &init}), nn::ReLU(), nn::Dropout(0.3),
              nn::Linear(hidden, 4, {.generator = &init})),
        opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.05}),
        sched(opt, 4, 20, 1e-4) {}

  io::TrainingState state(std::map<std::string, std::string> config = {{"hidden", "32"}, {"layers", "2"}}) {
    return {.model = &model, .optimizer = &opt, .scheduler = io::stateful(sched),
            .generators = {{"data", &data}}, .config = std::move(config)};
  }

  /// One training step; returns the loss's bits.
  uint32_t step() {
    Tensor x = randn({16, 8}, kFloat32, &data);
    Tensor y = randint(0, 4, {16}, std::nullopt, &data);
    Tensor loss = nn::functional::cross_entropy(model(x), y);
    float l = loss.item<float>();
    opt.zero_grad();
    loss.backward();
    opt.step();
    sched.step();
    uint32_t bits;
    std::memcpy(&bits, &l, sizeof bits);
    return bits;
  }
};

/// Starts this test binary again running only `test` (a gtest filter), with `env` ("NAME=value")
/// added to the environment; `quiet` sends its output to /dev/null. Returns the pid, or -1.
inline pid_t spawn_self(const std::string& test, const std::vector<std::string>& env, bool quiet = false) {
  char exe[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return -1;
  exe[n] = '\0';
  std::vector<std::string> args = {exe, "--gtest_filter=" + test}, envs = env;
  for (char** e = environ; *e; ++e) envs.emplace_back(*e);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  for (std::string& e : envs) envp.push_back(e.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (quiet) {
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

/// The exit status of a child that exited normally, else -1.
inline int wait_exit_status(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

}  // namespace strata::testing
