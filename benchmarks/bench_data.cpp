// The data pipeline and checkpoint benchmarks: JPEG decoding and augmentation through
// ImageFolder and DataLoader, token-window sampling from a memory-mapped shard, and
// safetensors save / load / serialize beside a plain copy of the same bytes. The inputs
// (64 JPEGs, a 64 MB u16 token shard, 256 MB of f32 tensors) are made once in a temporary
// folder, removed at exit. Ends with a summary of medians over repetitions (run with
// --benchmark_repetitions=N --benchmark_enable_random_interleaving=true, as scripts/bench.sh
// does, so each pair of paths sees the same machine noise), with the cores the process kept
// busy beside each rate, since a shared machine may give it less than it asks for.
//
//   STRATA_BENCH_THREADS   threads for strata's kernels (default 2)
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <turbojpeg.h>

#include <strata/strata.hpp>

#include "machine.h"

namespace {

namespace fs = std::filesystem;
namespace data = strata::data;
namespace io = strata::io;

constexpr int kImages = 64;
constexpr int64_t kBatch = 32;
constexpr int kImagePasses = 4;                     // loader epochs are 4 passes over the 64 files
constexpr int64_t kShardTokens = int64_t(1) << 25;  // 32M u16 tokens, 64 MiB
constexpr int64_t kTensorElems = int64_t(1) << 24;  // 4 f32 tensors of 64 MiB: 256 MiB
constexpr int kTensors = 4;

// ---- inputs, made once ------------------------------------------------------------------

struct Inputs {
  fs::path dir;
  std::vector<std::vector<uint8_t>> jpegs;  // the encoded files, for the decode-only row
  int64_t jpeg_bytes = 0;
  std::string shard, checkpoint, plain;
  io::TensorMap tensors;
  int64_t tensor_bytes = 0;
  ~Inputs() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

Inputs& inputs() {
  static Inputs in;
  return in;
}

// Smooth gradients plus +-12 of noise: the entropy coder and IDCT do real work, unlike flat
// colour, and the file sizes (~60-90 KB) are those of ImageNet photos at quality 90.
std::vector<uint8_t> make_jpeg(int width, int height, uint32_t seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  uint32_t s = seed * 2654435761u + 1;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
      int base[3] = {255 * x / width, 255 * y / height, 128 + (x - y + static_cast<int>(seed) * 37) % 96};
      for (int c = 0; c < 3; ++c) {
        s = s * 1664525u + 1013904223u;
        int noise = static_cast<int>(s >> 27) - 12;
        p[c] = static_cast<uint8_t>(std::clamp(base[c] + noise, 0, 255));
      }
    }
  tjhandle h = tjInitCompress();
  STRATA_CHECK(h != nullptr, "[bench_data] tjInitCompress failed");
  unsigned char* out = nullptr;
  unsigned long size = 0;
  int rc = tjCompress2(h, rgb.data(), width, 0, height, TJPF_RGB, &out, &size, TJSAMP_420, 90, 0);
  std::string err = rc == 0 ? "" : tjGetErrorStr2(h);
  tjDestroy(h);
  STRATA_CHECK(rc == 0, "[bench_data] tjCompress2 failed: {}", err);
  std::vector<uint8_t> bytes(out, out + size);
  tjFree(out);
  return bytes;
}

void write_bytes(const fs::path& path, const void* p, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  STRATA_CHECK(f && std::fwrite(p, 1, n, f) == n && std::fclose(f) == 0, "[bench_data] cannot write {}", path.string());
}

void make_inputs() {
  Inputs& in = inputs();
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = fmt::format("{}/strata-bench-data-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  STRATA_CHECK(::mkdtemp(tmpl.data()) != nullptr, "[bench_data] mkdtemp {} failed", tmpl);
  in.dir = tmpl;
  // images: two classes, landscape 500x375 and portrait 375x500 alternating
  for (int i = 0; i < kImages; ++i) {
    fs::path cls = in.dir / "images" / (i % 2 ? "b" : "a");
    fs::create_directories(cls);
    in.jpegs.push_back(i % 4 < 2 ? make_jpeg(500, 375, i) : make_jpeg(375, 500, i));
    in.jpeg_bytes += static_cast<int64_t>(in.jpegs.back().size());
    write_bytes(cls / fmt::format("{:03d}.jpg", i), in.jpegs.back().data(), in.jpegs.back().size());
  }
  // token shard: ids below GPT-2's vocabulary
  in.shard = (in.dir / "tokens.bin").string();
  data::TokenShardWriter w(in.shard, data::TokenDType::kU16);
  std::vector<uint32_t> chunk(1 << 16);
  uint64_t s = 1;
  for (int64_t done = 0; done < kShardTokens; done += static_cast<int64_t>(chunk.size())) {
    for (uint32_t& t : chunk) t = static_cast<uint32_t>((s = s * 6364136223846793005ull + 1) >> 33) % 50257;
    w.append(chunk);
  }
  w.close();
  // checkpoint tensors, and the file the load rows read (just written: warm page cache)
  for (int k = 0; k < kTensors; ++k)
    in.tensors.emplace(fmt::format("layer{}.weight", k), strata::randn({kTensorElems}));
  in.tensor_bytes = kTensors * kTensorElems * 4;
  in.checkpoint = (in.dir / "model.safetensors").string();
  in.plain = (in.dir / "plain.bin").string();
  io::save_safetensors(in.checkpoint, in.tensors);
}

// ---- the workloads ----------------------------------------------------------------------

data::Transform imagenet_train() {
  return data::Compose({data::RandomResizedCrop(224), data::RandomHorizontalFlip(), data::ToTensor(),
                        data::Normalize(data::kImageNetMean, data::kImageNetStd)});
}

// kImagePasses passes over a dataset, so an epoch holds several batches per worker.
class Repeat : public data::Dataset<data::Example> {
 public:
  Repeat(std::shared_ptr<const data::Dataset<data::Example>> d, int64_t times) : d_(std::move(d)), times_(times) {}
  int64_t size() const override { return d_->size() * times_; }
  data::Example get(int64_t i) const override { return d_->get(i % d_->size()); }

 private:
  std::shared_ptr<const data::Dataset<data::Example>> d_;
  int64_t times_;
};

uint64_t sum_words(const void* p, size_t bytes) {
  const auto* w = static_cast<const uint64_t*>(p);
  uint64_t s = 0;
  for (size_t i = 0; i < bytes / 8; ++i) s += w[i];
  return s;
}

void check_sys(bool ok, const char* what) {
  STRATA_CHECK(ok, "[bench_data] {} failed: {}", what, std::strerror(errno));
}

// The plain baseline of save: the same bytes, write() in one go per tensor, then fsync.
void plain_write(const std::string& path, const std::vector<uint8_t>& header) {
  // a fresh file, as save's rename gives: the old one's blocks are freed here as there
  ::unlink(path.c_str());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  check_sys(fd >= 0, "open");
  auto put = [&](const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t k = ::write(fd, c, n);
      check_sys(k > 0, "write");
      c += k, n -= static_cast<size_t>(k);
    }
  };
  put(header.data(), header.size());
  for (const auto& [_, t] : inputs().tensors) put(t.data(), t.nbytes());
  check_sys(::fsync(fd) == 0, "fsync");
  ::close(fd);
}

// The plain baseline of load: read() the whole file into a fresh buffer.
std::unique_ptr<uint8_t[]> plain_read(const std::string& path, size_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_sys(fd >= 0, "open");
  size = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  std::unique_ptr<uint8_t[]> buf(new uint8_t[size]);  // not zeroed: page faults happen in read()
  for (size_t done = 0; done < size;) {
    ssize_t k = ::pread(fd, buf.get() + done, size - done, static_cast<off_t>(done));
    check_sys(k > 0, "read");
    done += static_cast<size_t>(k);
  }
  ::close(fd);
  return buf;
}

using Body = std::function<void()>;

struct Case {
  std::string id;        // benchmark name (no spaces, for --benchmark_filter)
  std::string label;     // what the summary shows
  std::string unit;      // of the rate: work per second
  double work;           // units per iteration
  std::string baseline;  // id of the plain path it is compared with ("" for none)
  double per_unit = 0;   // tokens per window, shown as a second rate
  std::function<Body()> prepare;
};

std::vector<Case> cases() {
  Inputs& in = inputs();
  const std::string images = (in.dir / "images").string();
  std::vector<Case> c;
  const double per_epoch = double(kImages) * kImagePasses;

  c.push_back({"jpeg_decode", "JPEG decode only (1 thread)", "images/s", kImages, "", 0, [&in] {
                 return Body([&in] {
                   for (const auto& j : in.jpegs) benchmark::DoNotOptimize(data::decode_jpeg(j).pixels.data());
                 });
               }});
  c.push_back({"jpeg_get", "ImageFolder get: read+decode+augment (1 thr)", "images/s", kImages, "", 0, [images] {
                 auto folder = std::make_shared<data::ImageFolder>(images, imagenet_train());
                 return Body([folder] {
                   for (int64_t i = 0; i < folder->size(); ++i) benchmark::DoNotOptimize(folder->get(i).input.data());
                 });
               }});
  // the same work on two plain threads, each taking every other image: what 2 workers could reach
  c.push_back({"jpeg_get_2thr", "ImageFolder get: read+decode+augment (2 thr)", "images/s", kImages, "", 0, [images] {
                 auto folder = std::make_shared<data::ImageFolder>(images, imagenet_train());
                 return Body([folder] {
                   auto half = [&folder](int64_t first) {
                     for (int64_t i = first; i < folder->size(); i += 2)
                       benchmark::DoNotOptimize(folder->get(i).input.data());
                   };
                   std::thread other(half, 1);
                   half(0);
                   other.join();
                 });
               }});
  for (int64_t workers : {1, 2})
    c.push_back({fmt::format("jpeg_loader_w{}", workers),
                 fmt::format("DataLoader JPEG 224, batch 32, {} worker{}", workers, workers > 1 ? "s" : ""), "images/s",
                 per_epoch, "", 0, [images, workers] {
                   auto folder = std::make_shared<data::ImageFolder>(images, imagenet_train());
                   auto loader = std::make_shared<data::DataLoader<data::Example>>(
                       std::make_shared<Repeat>(folder, kImagePasses),
                       data::LoaderOptions{.batch_size = kBatch, .shuffle = true, .num_workers = workers});
                   return Body([loader] {
                     for (auto& b : *loader) benchmark::DoNotOptimize(b.input.data());
                   });
                 }});

  for (int64_t context : {128, 1024}) {
    const int n = context == 128 ? 20000 : 5000;
    c.push_back({fmt::format("window_ctx{}", context), fmt::format("random_window, context {}", context), "windows/s",
                 double(n), "", double(context), [&in, context, n] {
                   auto ds = std::make_shared<data::TokenWindowDataset>(std::vector<std::string>{in.shard}, context);
                   auto gen = std::make_shared<strata::Generator>(1);
                   return Body([ds, gen, n] {
                     for (int i = 0; i < n; ++i) benchmark::DoNotOptimize(ds->random_window(*gen).input.data());
                   });
                 }});
  }
  // a stride that gives 4096 windows spread over the shard: one epoch is 256 batches
  for (int64_t workers : {0, 2})
    c.push_back({fmt::format("window_loader_w{}", workers),
                 fmt::format("DataLoader windows ctx 128, batch 16, {} workers", workers), "batches/s", 256, "",
                 16.0 * 128, [&in, workers] {
                   auto ds = std::make_shared<data::TokenWindowDataset>(std::vector<std::string>{in.shard}, 128,
                                                                        kShardTokens / 4096);
                   auto loader = std::make_shared<data::DataLoader<data::Example>>(
                       ds, data::LoaderOptions{.batch_size = 16, .shuffle = true, .num_workers = workers});
                   return Body([loader] {
                     for (auto& b : *loader) benchmark::DoNotOptimize(b.input.data());
                   });
                 }});

  const double gb = double(in.tensor_bytes) * 1e-9;
  c.push_back({"save", "safetensors save 256 MB (atomic, fsync)", "GB/s", gb, "save_plain", 0,
               [&in] { return Body([&in] { io::save_safetensors(in.checkpoint, in.tensors); }); }});
  c.push_back({"save_plain", "", "GB/s", gb, "", 0, [&in] {
                 std::vector<uint8_t> bytes = io::serialize_safetensors(in.tensors);
                 bytes.resize(bytes.size() - static_cast<size_t>(in.tensor_bytes));  // the header alone
                 return Body([&in, header = std::move(bytes)] { plain_write(in.plain, header); });
               }});
  c.push_back({"load", "safetensors load (mmap) + sum 256 MB", "GB/s", gb, "load_plain", 0, [&in] {
                 return Body([&in] {
                   io::SafetensorsFile f = io::load_safetensors(in.checkpoint);
                   uint64_t s = 0;
                   for (const auto& [_, t] : f.tensors) s += sum_words(t.data(), t.nbytes());
                   benchmark::DoNotOptimize(s);
                 });
               }});
  c.push_back({"load_plain", "", "GB/s", gb, "", 0, [&in] {
                 return Body([&in] {
                   size_t size = 0;
                   auto buf = plain_read(in.checkpoint, size);
                   benchmark::DoNotOptimize(sum_words(buf.get(), size));
                 });
               }});
  c.push_back({"serialize", "serialize_safetensors 256 MB (memory)", "GB/s", gb, "serialize_plain", 0, [&in] {
                 return Body([&in] { benchmark::DoNotOptimize(io::serialize_safetensors(in.tensors).data()); });
               }});
  c.push_back({"serialize_plain", "", "GB/s", gb, "", 0, [&in] {
                 return Body([&in] {
                   std::unique_ptr<uint8_t[]> out(new uint8_t[static_cast<size_t>(in.tensor_bytes)]);  // as reserve()
                   uint8_t* p = out.get();
                   for (const auto& [_, t] : in.tensors)
                     p = static_cast<uint8_t*>(std::memcpy(p, t.data(), t.nbytes())) + t.nbytes();
                   benchmark::DoNotOptimize(out.get());
                 });
               }});
  return c;
}

// ---- the summary ------------------------------------------------------------------------

// Per-iteration seconds of every repetition, by benchmark name.
std::map<std::string, std::vector<double>>& timings() {
  static std::map<std::string, std::vector<double>> t;
  return t;
}

// Cores the whole process kept busy (its CPU time over wall time) in every repetition: on
// a shared machine this tells whether worker threads got the cores they asked for.
std::map<std::string, std::vector<double>>& cores() {
  static std::map<std::string, std::vector<double>> t;
  return t;
}

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration && !r.error_occurred && r.iterations > 0) {
        const std::string& name = r.run_name.function_name;
        timings()[name].push_back(r.real_accumulated_time / static_cast<double>(r.iterations));
        if (auto k = r.counters.find("cores"); k != r.counters.end()) cores()[name].push_back(k->second);
      }
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

void add_benchmark(const Case& c) {
  benchmark::RegisterBenchmark(c.id.c_str(), [c](benchmark::State& state) {
    Body run = c.prepare();
    run();  // warm-up: worker threads, first-touch page faults, the page cache
    const double cpu0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (auto _ : state) run();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.counters["cores"] = (process_cpu_seconds() - cpu0) / wall;
    state.counters[c.unit] = benchmark::Counter(c.work, benchmark::Counter::kIsIterationInvariantRate);
  })->UseRealTime()->Unit(benchmark::kMillisecond);
}

std::string human(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v * 1e-6);
  if (v >= 1e4) return fmt::format("{:.1f}k", v * 1e-3);
  return fmt::format("{:.2f}", v);
}

}  // namespace

int run_benchmarks(int argc, char** argv) {
  const char* env_threads = std::getenv("STRATA_BENCH_THREADS");
  const int threads = env_threads ? std::max(1, std::atoi(env_threads)) : 2;
  strata::set_num_threads(threads);
  benchmark::Initialize(&argc, argv);
  make_inputs();
  const Inputs& in = inputs();

  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&now));
  fmt::print("strata data pipeline and checkpoint benchmarks, {}\nCPU: {} ({} cores), {} kernel threads\n", date,
             bench::cpu_model(), ::sysconf(_SC_NPROCESSORS_ONLN), threads);
  fmt::print("inputs in {}: {} JPEGs ({:.0f} KB mean), a {} MiB u16 token shard, {} MiB of f32 tensors\n",
             in.dir.string(), kImages, in.jpeg_bytes / 1e3 / kImages, kShardTokens * 2 >> 20, in.tensor_bytes >> 20);
  std::ifstream loadavg("/proc/loadavg");
  std::string load1;
  loadavg >> load1;
  fmt::print("load average (1 min) at start: {} (other work on these cores shows here)\n", load1.empty() ? "?" : load1);
  fmt::print("files are read warm: each was just written, so reads come from the page cache\n\n");

  const std::vector<Case> all = cases();
  for (const Case& c : all) add_benchmark(c);
  TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  std::map<std::string, const Case*> by_id;
  for (const Case& c : all) by_id[c.id] = &c;
  auto rate = [&](const Case& c) {
    auto t = timings().find(c.id);
    return t == timings().end() ? 0.0 : c.work / median(t->second);
  };
  fmt::print("\n{:<48} {:>10} {:<10} {:>10} {:>7} {:>6} {}\n", "case", "strata", "unit", "plain", "ratio", "cores",
             "note");
  for (const Case& c : all) {
    if (c.label.empty()) continue;  // a baseline: shown beside its case
    double r = rate(c);
    if (r == 0) continue;  // filtered out
    std::string plain = "-", ratio = "-", note;
    if (!c.baseline.empty()) {
      double p = rate(*by_id.at(c.baseline));
      if (p > 0) plain = fmt::format("{:.2f}", p), ratio = fmt::format("{:.0f}%", 100 * r / p);
      note = "target >= 80%";
    } else if (c.per_unit > 0) {
      note = fmt::format("= {} tokens/s", human(r * c.per_unit));
    }
    auto k = cores().find(c.id);
    fmt::print("{:<48} {:>10} {:<10} {:>10} {:>7} {:>6.2f} {}\n", c.label,
               c.unit == "GB/s" ? fmt::format("{:.2f}", r) : human(r), c.unit, plain, ratio,
               k == cores().end() ? 0.0 : median(k->second), note);
  }
  fmt::print(
      "\nplain = the same bytes without the library: save vs write()+fsync, load vs read() into a fresh buffer "
      "(both then sum every byte as uint64 words), serialize vs memcpy into a fresh buffer. "
      "ratio = strata / plain. cores = CPU time of the process / wall time (strata's path).\n");
  return 0;
}

int main(int argc, char** argv) {
  // returning (rather than terminating) runs the destructor that removes the temporary folder
  try {
    return run_benchmarks(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_data: {}\n", e.what());
    return 1;
  }
}
