// Training checkpoints: a run resumed in a new process repeats the uninterrupted run's losses
// bit for bit; mismatched configurations, models and optimizers are refused with everything
// listed and nothing changed; corrupted and truncated files are refused naming what is wrong.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "io/checkpoint_testing.h"

using namespace strata;
using strata::testing::TinyRun;
using strata::testing::values;

namespace {

constexpr int kSteps = 20, kSplit = 10;

std::vector<uint32_t> uninterrupted_losses() {
  manual_seed(11);
  TinyRun run(3, 7);
  std::vector<uint32_t> losses;
  for (int s = 0; s < kSteps; ++s) losses.push_back(run.step());
  return losses;
}

// Trains the first kSplit steps and checkpoints them to `path`.
std::vector<uint32_t> train_and_save(const std::string& path, std::map<std::string, std::string> config = {
                                                                 {"hidden", "32"}, {"layers", "2"}}) {
  manual_seed(11);
  TinyRun run(3, 7);
  std::vector<uint32_t> losses;
  for (int s = 0; s < kSplit; ++s) losses.push_back(run.step());
  io::save_checkpoint(path, run.state(std::move(config)),
                      {.step = kSplit, .loader = {{"epoch", 0}, {"index", kSplit * 16}}, .metadata = {{"note", "hello"}}});
  return losses;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Fixture : ::testing::Test {
  strata::testing::TempDir temp{"strata_ckpt"};
  std::string dir = temp.str(), path = dir + "/ck.safetensors";
};
using Checkpoint = Fixture;

}  // namespace

// Loads the checkpoint named by STRATA_CKPT_RESUME from a fresh process whose generators and
// weights all start elsewhere, and writes the losses of the remaining steps to STRATA_CKPT_OUT.
TEST(CheckpointChild, Resume) {
  const char* ck = std::getenv("STRATA_CKPT_RESUME");
  const char* out = std::getenv("STRATA_CKPT_OUT");
  if (!ck || !out) GTEST_SKIP() << "runs only as the child of Checkpoint.ResumeInNewProcessIsBitIdentical";
  manual_seed(999);
  TinyRun run(12345, 54321);
  auto state = run.state();
  io::Checkpoint c = io::load_checkpoint(ck, state);
  ASSERT_EQ(c.step, kSplit);
  ASSERT_EQ(c.loader.at("index"), kSplit * 16);
  ASSERT_EQ(c.metadata.at("note"), "hello");
  std::FILE* f = std::fopen(out, "w");
  ASSERT_NE(f, nullptr);
  for (int64_t s = c.step; s < kSteps; ++s) std::fprintf(f, "%08x\n", run.step());
  std::fclose(f);
}

TEST_F(Checkpoint, ResumeInNewProcessIsBitIdentical) {
  std::vector<uint32_t> want = uninterrupted_losses();
  std::vector<uint32_t> got = train_and_save(path);
  const std::string out = dir + "/losses.txt";
  pid_t pid = strata::testing::spawn_self("CheckpointChild.Resume",
                                          {"STRATA_CKPT_RESUME=" + path, "STRATA_CKPT_OUT=" + out});
  ASSERT_GT(pid, 0);
  ASSERT_EQ(strata::testing::wait_exit_status(pid), 0);
  std::ifstream in(out);
  std::string line;
  while (std::getline(in, line)) got.push_back(static_cast<uint32_t>(std::stoul(line, nullptr, 16)));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
}

TEST_F(Checkpoint, EveryRandomStateMatters) {
  // the same resume within this process, once faithfully and once with a generator disturbed
  // after loading: the disturbed run must diverge, or the test above could not fail
  std::vector<uint32_t> want = uninterrupted_losses();
  train_and_save(path);
  for (int disturb = 0; disturb < 3; ++disturb) {
    TinyRun run(12345, 54321);
    auto state = run.state();
    io::load_checkpoint(path, state);
    if (disturb == 1) manual_seed(5);           // Dropout's masks
    if (disturb == 2) run.data.manual_seed(5);  // the batches
    bool same = true;
    for (int s = kSplit; s < kSteps; ++s) same = same && run.step() == want[s];
    EXPECT_EQ(same, disturb == 0) << "disturb " << disturb;
  }
}

TEST_F(Checkpoint, ScalarsRoundTripExactly) {
  TinyRun run(1, 2);
  for (int s = 0; s < 3; ++s) run.step();
  optim::StateDict scaler{"GradScaler", {{"scale", full({}, 65536.0, kFloat32)}},
                          {{"growth", 2.0}, {"third", 1.0 / 3}, {"tiny", 4.9e-324}, {"inf", INFINITY}, {"neg0", -0.0}}};
  optim::StateDict loaded_scaler;
  auto state = run.state();
  state.scaler = {[&] { return scaler; }, [&](const optim::StateDict& d) { loaded_scaler = d; }};
  io::save_checkpoint(path, state);
  io::CheckpointFile f = io::read_checkpoint(path);
  optim::StateDict want = run.opt.state_dict();
  ASSERT_EQ(f.optimizer.type, "AdamW");
  ASSERT_EQ(f.optimizer.scalars.size(), want.scalars.size());
  for (const auto& [k, v] : want.scalars) EXPECT_EQ(std::memcmp(&f.optimizer.scalars.at(k), &v, 8), 0) << k;
  for (const auto& [k, v] : want.tensors) EXPECT_EQ(values(f.optimizer.tensors.at(k)), values(v)) << k;
  EXPECT_EQ(f.scheduler.scalars, run.sched.state_dict().scalars);

  io::load_checkpoint(path, state);
  ASSERT_EQ(loaded_scaler.type, "GradScaler");
  for (const auto& [k, v] : scaler.scalars) EXPECT_EQ(std::memcmp(&loaded_scaler.scalars.at(k), &v, 8), 0) << k;
  EXPECT_EQ(values(loaded_scaler.tensors.at("scale")), std::vector<double>{65536.0});
}

TEST_F(Checkpoint, ConfigMismatchIsRefusedListingEveryDifference) {
  train_and_save(path, {{"hidden", "32"}, {"layers", "2"}, {"act", "relu"}});
  manual_seed(77);
  TinyRun run(5, 6);
  std::vector<double> before = values(run.model.state_dict().at("0.weight"));
  auto state = run.state({{"hidden", "64"}, {"layers", "2"}, {"vocab", "100"}});
  std::string msg = error_of([&] { io::load_checkpoint(path, state); });
  EXPECT_NE(msg.find("configuration differs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hidden: '32' -> '64'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("act: 'relu' -> (absent)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("vocab: (absent) -> '100'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("layers"), std::string::npos) << msg;
  // nothing changed
  EXPECT_EQ(values(run.model.state_dict().at("0.weight")), before);
  EXPECT_EQ(run.sched.last_epoch(), 0);
  EXPECT_EQ(run.opt.state(run.model.parameters()[0]), nullptr);
  EXPECT_EQ(default_generator().seed(), 77u);
  EXPECT_EQ(default_generator().offset(), 0u);
}

TEST_F(Checkpoint, OtherModelOrOptimizerIsRefused) {
  train_and_save(path);
  {  // other layer sizes: every shape mismatch listed
    TinyRun run(5, 6, /*hidden=*/16);
    auto state = run.state();
    std::string msg = error_of([&] { io::load_checkpoint(path, state); });
    for (const char* want : {"0.weight is float32 [32, 8] in the state dict, float32 [16, 8] in the module",
                             "0.bias is float32 [32] in the state dict, float32 [16] in the module",
                             "3.weight is float32 [4, 32] in the state dict, float32 [4, 16] in the module"})
      EXPECT_NE(msg.find(want), std::string::npos) << want << ": " << msg;
    EXPECT_EQ(msg.find("3.bias"), std::string::npos) << msg;  // same shape: not listed
  }
  {  // another optimizer type
    TinyRun run(5, 6);
    optim::SGD sgd(run.model.parameters(), {.lr = 0.1});
    auto state = run.state();
    state.optimizer = &sgd;
    std::string msg = error_of([&] { io::load_checkpoint(path, state); });
    EXPECT_NE(msg.find("the optimizer is SGD but the checkpoint's was AdamW"), std::string::npos) << msg;
  }
  {  // parts and generators that the checkpoint lacks, or has and the program does not
    TinyRun run(5, 6);
    Generator extra(1);
    io::TrainingState state{.model = &run.model, .optimizer = &run.opt, .generators = {{"extra", &extra}}};
    std::string msg = error_of([&] { io::load_checkpoint(path, state); });
    EXPECT_NE(msg.find("scheduler state (WarmupCosine) but none was given"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no generator 'extra'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("generator 'data' but none"), std::string::npos) << msg;
  }
}

TEST_F(Checkpoint, RefusalAfterPartialApplyRollsBack) {
  // the optimizer covers one parameter fewer: only its own load_state_dict can tell, after the
  // scheduler has been loaded; the scheduler must be restored
  train_and_save(path);
  TinyRun run(5, 6);
  std::vector<Tensor> ps = run.model.parameters();
  ps.pop_back();
  optim::AdamW fewer(ps, {.lr = 1e-2});
  optim::WarmupCosine sched(fewer, 4, 20, 1e-4);
  std::vector<double> before = values(run.model.state_dict().at("0.weight"));
  io::TrainingState state{.model = &run.model, .optimizer = &fewer, .scheduler = io::stateful(sched),
                          .generators = {{"data", &run.data}}, .config = {{"hidden", "32"}, {"layers", "2"}}};
  std::string msg = error_of([&] { io::load_checkpoint(path, state); });
  EXPECT_NE(msg.find("nothing was changed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("param group 0"), std::string::npos) << msg;
  EXPECT_EQ(sched.last_epoch(), 0);
  EXPECT_EQ(values(run.model.state_dict().at("0.weight")), before);
  EXPECT_EQ(fewer.state(ps[0]), nullptr);
}

// When a part's restore fails too, the other parts are still restored, and the error gives
// the original refusal and names the part left changed.
TEST_F(Checkpoint, EveryPartIsRestoredWhenAnothersRestoreFails) {
  double scale = 1024;
  bool refuse_restore = false;
  auto scaler = [&] {
    return io::Stateful{[&] {
                          optim::StateDict d;
                          d.type = "TestScaler";
                          d.scalars["scale"] = scale;
                          return d;
                        },
                        [&](const optim::StateDict& d) {
                          if (refuse_restore && d.scalars.at("scale") == 8) throw Error("restore refused");
                          scale = d.scalars.at("scale");
                        }};
  };
  {
    manual_seed(11);
    TinyRun run(3, 7);
    run.step();
    io::TrainingState saved = run.state();
    saved.scaler = scaler();
    io::save_checkpoint(path, saved, {.step = 1});
  }
  scale = 8;
  refuse_restore = true;
  TinyRun run(5, 6);
  std::vector<Tensor> ps = run.model.parameters();
  ps.pop_back();
  optim::AdamW fewer(ps, {.lr = 1e-2});  // refuses the checkpoint's optimizer state
  optim::WarmupCosine sched(fewer, 4, 20, 1e-4);
  io::TrainingState state{.model = &run.model, .optimizer = &fewer, .scheduler = io::stateful(sched),
                          .scaler = scaler(), .generators = {{"data", &run.data}},
                          .config = {{"hidden", "32"}, {"layers", "2"}}};
  std::string msg = error_of([&] { io::load_checkpoint(path, state); });
  EXPECT_NE(msg.find("param group 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the grad scaler could not be restored (restore refused)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("nothing was changed"), std::string::npos) << msg;
  EXPECT_EQ(sched.last_epoch(), 0) << "the scheduler is restored all the same";
  EXPECT_EQ(scale, 1024) << "the scaler kept the checkpoint's state, as the error says";
  EXPECT_EQ(fewer.state(ps[0]), nullptr);
}

TEST_F(Checkpoint, FlippedByteNamesTheTensor) {
  train_and_save(path);
  const std::string good = read_bytes(path);
  io::CheckpointFile f = io::read_checkpoint(path);
  for (std::string key : {"0.weight", "3.bias"}) {
    Tensor t = f.model.at(key).contiguous();
    std::string needle(static_cast<const char*>(t.data()), t.nbytes());
    size_t at = good.find(needle);
    ASSERT_NE(at, std::string::npos) << key;
    std::string bad = good;
    bad[at + needle.size() / 2] ^= 0x10;
    write_bytes(path, bad);
    std::string msg = error_of([&] { io::read_checkpoint(path); });
    EXPECT_NE(msg.find("tensor 'model." + key + "' does not match its checksum"), std::string::npos) << msg;
  }
  // a changed metadata value
  std::string bad = good;
  size_t at = bad.find("hello");
  ASSERT_NE(at, std::string::npos);
  bad[at + 4] = 'p';
  write_bytes(path, bad);
  std::string msg = error_of([&] { io::read_checkpoint(path); });
  EXPECT_NE(msg.find("metadata does not match its checksum"), std::string::npos) << msg;
}

// A tool that re-saves a subset of the tensors and keeps the metadata (checksums included)
// makes a file whose checksums name a tensor it lacks: refused, naming it.
TEST_F(Checkpoint, ChecksumOfAMissingTensorIsRefused) {
  train_and_save(path);
  io::SafetensorsFile f = io::load_safetensors(path);
  std::string dropped;
  for (const auto& [name, t] : f.tensors)
    if (name.rfind("optim.", 0) == 0) dropped = name;
  ASSERT_FALSE(dropped.empty());
  io::TensorMap kept;
  for (const auto& [name, t] : f.tensors)
    if (name != dropped) kept[name] = t.clone();
  const std::string subset = dir + "/subset.safetensors";
  io::save_safetensors(subset, kept, f.metadata);
  std::string msg = error_of([&] { io::read_checkpoint(subset); });
  EXPECT_NE(msg.find("names tensor '" + dropped + "', which the file lacks"), std::string::npos) << msg;
}

TEST_F(Checkpoint, TruncatedFileIsRefused) {
  train_and_save(path);
  const std::string good = read_bytes(path);
  for (size_t keep : {size_t{0}, size_t{5}, size_t{100}, good.size() / 2, good.size() - 1}) {
    write_bytes(path, good.substr(0, keep));
    TinyRun run(5, 6);
    auto state = run.state();
    std::string msg = error_of([&] { io::load_checkpoint(path, state); });
    EXPECT_NE(msg.find("is not a readable checkpoint"), std::string::npos) << keep << ": " << msg;
    EXPECT_EQ(run.sched.last_epoch(), 0);
  }
  std::string msg = error_of([&] { io::read_checkpoint(dir + "/missing.safetensors"); });
  EXPECT_NE(msg.find("missing.safetensors"), std::string::npos) << msg;
}

namespace {
// A module whose step counter came later: checkpoints saved before it lack the key.
struct Counted : nn::Module {
  Tensor weight, steps;
  explicit Counted(bool with_counter, Shape counter_shape = {}, DType counter_dtype = kInt64) {
    weight = register_parameter("weight", full({2, 3}, 1.5));
    if (with_counter) steps = register_buffer("steps", full(counter_shape, 4, TensorOptions(counter_dtype)));
  }
  std::vector<std::string> optional_state_keys() const override { return {"steps"}; }
};
}  // namespace

TEST_F(Checkpoint, ModelChecksAreTheModulesOwn) {
  {  // an optional key may be absent: its value is kept, the rest loads
    Counted saved(false);
    saved.weight.detach().fill_(2.5);
    io::save_checkpoint(path, {.model = &saved});
    Counted model(true);
    io::TrainingState state{.model = &model};
    io::load_checkpoint(path, state);
    EXPECT_EQ(values(model.weight), std::vector<double>(6, 2.5));
    EXPECT_EQ(model.steps.item<int64_t>(), 4);
  }
  {  // a [1] tensor loads into a 0-d one, as Module::load_state_dict allows
    Counted saved(true, {1});
    saved.steps.detach().fill_(9);
    io::save_checkpoint(path, {.model = &saved});
    Counted model(true);
    io::TrainingState state{.model = &model};
    io::load_checkpoint(path, state);
    EXPECT_EQ(model.steps.item<int64_t>(), 9);
  }
  for (const Shape& saved_shape : {Shape{}, Shape{1}}) {  // another dtype is refused (exact resume), nothing written
    Counted saved(true, saved_shape, kFloat64);
    saved.weight.detach().fill_(7.0);
    io::save_checkpoint(path, {.model = &saved});
    Counted model(true);
    io::TrainingState state{.model = &model};
    std::string msg = error_of([&] { io::load_checkpoint(path, state); });
    EXPECT_NE(msg.find("steps is float64 in the checkpoint, int64 in the model"), std::string::npos) << msg;
    EXPECT_EQ(values(model.weight), std::vector<double>(6, 1.5));
  }
  {  // a key the module requires is still required
    Counted saved(true);
    io::save_checkpoint(path, {.model = &saved});
    struct Wider : Counted {
      Tensor bias;
      Wider() : Counted(true) { bias = register_parameter("bias", zeros({3})); }
    } model;
    io::TrainingState state{.model = &model};
    std::string msg = error_of([&] { io::load_checkpoint(path, state); });
    EXPECT_NE(msg.find("model missing keys: bias"), std::string::npos) << msg;
  }
}
