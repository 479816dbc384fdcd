// strata-tokenize: turns text files into token shards (docs/data.md) with a byte-level
// vocabulary, each byte one token (0..255):
//
//   strata-tokenize --out train.bin [--val val.bin --val-fraction 0.05] [--dtype u8|u16] [--eot] FILES...
//
// With --val, the last val-fraction of each file's bytes goes to the validation shard, so
// both shards see every file. --eot (u16 only) appends token 256 after each file's part,
// marking document ends. Errors print "strata-tokenize: ..." and exit with status 1 (2 for a
// bad command line); both outputs are written and synced before either replaces its file,
// so a failed write (a full disk, an I/O error) leaves no partial shard and no new shard
// beside an old one; only a failing rename between the two could.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <strata/data/token_shard.hpp>

#include "same_file.hpp"

namespace {

namespace sd = strata::data;
using strata_tools::same_file;

constexpr uint32_t kEndOfText = 256;

struct Args {
  std::string out, val;
  double val_fraction = 0.05;
  bool fraction_given = false;
  sd::TokenDType dtype = sd::TokenDType::kU8;
  bool eot = false;
  std::vector<std::string> files;
};

constexpr const char* kUsage =
    "usage: strata-tokenize --out TRAIN.bin [--val VAL.bin [--val-fraction F]] [--dtype u8|u16] [--eot] FILES...\n";

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr, "strata-tokenize: %s\n%s", problem.c_str(), kUsage);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--out") {
      a.out = value();
    } else if (arg == "--val") {
      a.val = value();
    } else if (arg == "--val-fraction") {
      std::string v = value();
      char* end = nullptr;
      a.val_fraction = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(a.val_fraction > 0 && a.val_fraction < 1))
        usage("--val-fraction must be a number in (0, 1), got " + v);
      a.fraction_given = true;
    } else if (arg == "--dtype") {
      std::string v = value();
      if (v == "u8") a.dtype = sd::TokenDType::kU8;
      else if (v == "u16") a.dtype = sd::TokenDType::kU16;
      else usage("--dtype must be u8 or u16, got " + v);
    } else if (arg == "--eot") {
      a.eot = true;
    } else if (arg == "-h" || arg == "--help") {
      std::printf("strata-tokenize: byte-level tokenizer, text files to token shards\n%s", kUsage);
      std::exit(0);
    } else if (arg.size() > 1 && arg[0] == '-' && arg != "-") {
      usage("unknown option " + arg);
    } else {
      a.files.push_back(arg);
    }
  }
  if (a.out.empty()) usage("--out is required");
  if (a.files.empty()) usage("no input files");
  if (a.fraction_given && a.val.empty()) usage("--val-fraction needs --val");
  // one file for both would end up holding only the validation tokens
  if (!a.val.empty() && same_file(a.val, a.out))
    usage("--val and --out must name different files, got " + a.val + " for both");
  for (const std::string& file : a.files) {  // the output would replace the text it is read from
    for (const auto& [option, out] : {std::pair{"--out", a.out}, std::pair{"--val", a.val}})
      if (!out.empty() && same_file(out, file)) usage(fmt::format("{} {} is also an input file", option, out));
  }
  if (a.eot && a.dtype != sd::TokenDType::kU16) usage("--eot needs --dtype u16 (token 256 does not fit in u8)");
  return a;
}

// Appends bytes [from, to) of `in` to `shard` as tokens, in chunks.
void copy_bytes(std::ifstream& in, const std::string& path, int64_t count, sd::TokenShardWriter& shard) {
  std::vector<char> bytes(1 << 20);
  std::vector<uint32_t> tokens;
  while (count > 0) {
    auto n = static_cast<std::streamsize>(std::min<int64_t>(count, static_cast<int64_t>(bytes.size())));
    in.read(bytes.data(), n);
    if (in.gcount() != n) throw std::runtime_error(fmt::format("{}: read failed", path));
    tokens.assign(reinterpret_cast<unsigned char*>(bytes.data()), reinterpret_cast<unsigned char*>(bytes.data()) + n);
    shard.append(tokens);
    count -= n;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    sd::TokenShardWriter train(args.out, args.dtype);
    std::optional<sd::TokenShardWriter> val;
    if (!args.val.empty()) val.emplace(args.val, args.dtype);
    for (const std::string& path : args.files) {
      if (std::filesystem::is_directory(path)) throw std::runtime_error(fmt::format("{}: is a folder", path));
      std::ifstream in(path, std::ios::binary | std::ios::ate);
      if (!in) throw std::runtime_error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
      auto size = static_cast<int64_t>(in.tellg());
      in.seekg(0);
      int64_t val_bytes = val ? static_cast<int64_t>(std::llround(static_cast<double>(size) * args.val_fraction)) : 0;
      copy_bytes(in, path, size - val_bytes, train);
      if (args.eot) train.append(kEndOfText);
      if (val) {
        copy_bytes(in, path, val_bytes, *val);
        if (args.eot) val->append(kEndOfText);
      }
    }
    // Both shards are written and synced before either replaces its file, so a full disk or
    // an I/O error leaves both old files as they were; only the two renames come after.
    train.finish();
    if (val) val->finish();
    const int64_t train_count = train.count(), val_count = val ? val->count() : 0;
    train.close();
    if (val) val->close();
    std::printf("%s: %lld tokens\n", args.out.c_str(), static_cast<long long>(train_count));
    if (val) std::printf("%s: %lld tokens\n", args.val.c_str(), static_cast<long long>(val_count));
    // the counts are the tool's report: output that could not be written is an error
    if (std::fflush(stdout) != 0 || std::ferror(stdout))
      throw std::runtime_error(fmt::format("cannot write to standard output: {}", std::strerror(errno)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-tokenize: %s\n", e.what());
    return 1;
  }
  return 0;
}
