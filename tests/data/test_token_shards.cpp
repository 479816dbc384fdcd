// Token shards: write/read round trips for every dtype, atomic writing, every bad-header
// case, windows checked against the original token vector, and the strata-tokenize tool.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <span>

#include "temp_dir.h"
#include "testing.h"

namespace st = strata;
namespace sd = strata::data;
namespace fs = std::filesystem;

namespace {

// A fresh empty folder per test, removed afterwards.
class TokenShards : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_ / name; }
  size_t files_in_dir() const { return static_cast<size_t>(std::distance(fs::directory_iterator(dir_.str()), {})); }
  strata::testing::TempDir dir_{"strata-shards"};
};

std::vector<uint32_t> random_tokens(size_t n, uint32_t max, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> dist(0, max);
  std::vector<uint32_t> v(n);
  for (auto& t : v) t = dist(rng);
  return v;
}

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, sd::TokenDType dtype) {
  sd::TokenShardWriter w(path, dtype);
  // In uneven pieces, to exercise appending.
  size_t at = 0;
  for (size_t piece = 1; at < tokens.size(); piece = piece * 3 + 1) {
    size_t n = std::min(piece, tokens.size() - at);
    w.append(std::span<const uint32_t>(tokens.data() + at, n));
    at += n;
  }
  EXPECT_EQ(w.count(), static_cast<int64_t>(tokens.size()));
  w.close();
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<int64_t> ints(const st::Tensor& t) {
  st::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

std::vector<int64_t> slice(const std::vector<uint32_t>& v, size_t start, size_t n) {
  return std::vector<int64_t>(v.begin() + static_cast<std::ptrdiff_t>(start),
                              v.begin() + static_cast<std::ptrdiff_t>(start + n));
}

}  // namespace

TEST_F(TokenShards, RoundTripEveryDtype) {
  for (auto dtype : {sd::TokenDType::kU8, sd::TokenDType::kU16, sd::TokenDType::kU32}) {
    auto tokens = random_tokens(1001, static_cast<uint32_t>(sd::token_max(dtype)), 3);
    tokens[0] = static_cast<uint32_t>(sd::token_max(dtype));  // the largest id survives
    std::string p = path("t.bin");
    write_shard(p, tokens, dtype);
    EXPECT_EQ(fs::file_size(p), sd::kTokenShardHeaderSize + tokens.size() * sd::token_bytes(dtype));
    sd::TokenShard shard(p);
    EXPECT_EQ(shard.size(), 1001);
    EXPECT_EQ(shard.dtype(), dtype);
    for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(shard.at(static_cast<int64_t>(i)), tokens[i]) << i;
    std::vector<int64_t> part(10);
    shard.read(990, 10, part.data());
    EXPECT_EQ(part, slice(tokens, 990, 10));
    EXPECT_THROW(shard.read(995, 10, part.data()), st::Error);
    EXPECT_THROW(shard.at(1001), st::Error);
  }
  // The header's bytes, little-endian, as docs/data.md describes.
  std::vector<uint32_t> three{1, 2, 0x0304};
  write_shard(path("h.bin"), three, sd::TokenDType::kU16);
  auto b = read_bytes(path("h.bin"));
  ASSERT_EQ(b.size(), 64u + 6u);
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "STRTOKEN");
  EXPECT_EQ(b[8], 1);   // version
  EXPECT_EQ(b[12], 2);  // dtype code: u16
  EXPECT_EQ(b[16], 3);  // token count
  EXPECT_EQ(b[24], 64); // header size
  EXPECT_EQ(std::vector<uint8_t>(b.begin() + 64, b.end()), (std::vector<uint8_t>{1, 0, 2, 0, 4, 3}));
}

TEST_F(TokenShards, WriterIsAtomic) {
  std::string p = path("a.bin");
  {
    sd::TokenShardWriter w(p, sd::TokenDType::kU8);
    w.append(std::vector<uint32_t>{1, 2, 3});
    EXPECT_FALSE(fs::exists(p)) << "nothing at the destination before close()";
    EXPECT_THROW(w.append(std::vector<uint32_t>{4, 256}), st::Error);  // 256 does not fit u8
    EXPECT_EQ(w.count(), 3) << "a rejected append writes nothing";
  }  // destroyed unclosed
  EXPECT_FALSE(fs::exists(p));
  EXPECT_EQ(files_in_dir(), 0u) << "the temporary is removed";
  write_shard(p, {5, 6}, sd::TokenDType::kU8);
  EXPECT_EQ(files_in_dir(), 1u);
  EXPECT_EQ(sd::TokenShard(p).at(1), 6u);
  EXPECT_THROW(sd::TokenShardWriter(path("missing/dir/x.bin"), sd::TokenDType::kU8), st::Error);
  {  // an empty append writes nothing and is no error
    sd::TokenShardWriter w(path("e.bin"), sd::TokenDType::kU16);
    w.append(std::span<const uint32_t>());
    w.close();
  }
  EXPECT_EQ(sd::TokenShard(path("e.bin")).size(), 0);
  // a folder or a device at the destination is refused when the writer opens, not at close
  fs::create_directory(path("folder.bin"));
  EXPECT_THROW(sd::TokenShardWriter(path("folder.bin"), sd::TokenDType::kU8), st::Error);
  EXPECT_THROW(sd::TokenShardWriter("/dev/null", sd::TokenDType::kU8), st::Error);
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  // a symbolic link keeps pointing at the replaced shard
  fs::create_symlink("a.bin", path("link.bin"));
  write_shard(path("link.bin"), {9}, sd::TokenDType::kU8);
  EXPECT_TRUE(fs::is_symlink(path("link.bin")));
  EXPECT_EQ(sd::TokenShard(p).at(0), 9u);
}

// A writer holds its temporary locked, so a second writer's clean-up leaves it; the
// temporary of a writer killed mid-shard is nobody's and goes when the next writer starts.
TEST_F(TokenShards, WritersRemoveTemporariesOfKilledWritersOnly) {
  const std::string p = path("s.bin");
  const std::string dead = path(st::io::temporary_prefix(p) + "1-0-0000dead");
  write_bytes(dead, std::vector<uint8_t>(100, 7));
  sd::TokenShardWriter first(p, sd::TokenDType::kU16);
  EXPECT_FALSE(fs::exists(dead));
  first.append(std::vector<uint32_t>{1, 2});
  std::string writing;
  for (const auto& e : fs::directory_iterator(dir_.str())) writing = e.path().string();
  ASSERT_EQ(files_in_dir(), 1u);
  const int fd = ::open(writing.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_NE(::flock(fd, LOCK_EX | LOCK_NB), 0) << "the temporary is held while it is written";
  ::close(fd);
  {
    sd::TokenShardWriter second(p, sd::TokenDType::kU8);  // cleans up, then is dropped unclosed
    EXPECT_EQ(files_in_dir(), 2u);
  }
  EXPECT_TRUE(fs::exists(writing));
  first.append(3);
  first.close();
  EXPECT_EQ(files_in_dir(), 1u);
  const sd::TokenShard shard(p);
  ASSERT_EQ(shard.size(), 3);
  EXPECT_EQ(shard.at(0) * 100 + shard.at(1) * 10 + shard.at(2), 123u);
  EXPECT_THROW(first.close(), st::Error);
  EXPECT_THROW(first.append(4), st::Error);
}

TEST_F(TokenShards, BadHeadersRaiseClearErrors) {
  std::string good = path("good.bin");
  write_shard(good, random_tokens(100, 60000, 1), sd::TokenDType::kU16);
  const auto bytes = read_bytes(good);
  auto expect_error = [&](const std::string& name, std::vector<uint8_t> b, const std::string& words) {
    std::string p = path(name);
    write_bytes(p, b);
    try {
      sd::TokenShard shard(p);
      ADD_FAILURE() << name << ": opened without error";
    } catch (const st::Error& e) {
      std::string what = e.what();
      EXPECT_NE(what.find(words), std::string::npos) << name << ": " << what;
      EXPECT_NE(what.find(p), std::string::npos) << name << " names the file: " << what;
    }
  };
  auto b = bytes;
  b[0] = 'X';
  expect_error("magic.bin", b, "magic");
  b = bytes;
  b[8] = 2;
  expect_error("version.bin", b, "version 2");
  b = bytes;
  b[12] = 7;
  expect_error("dtype.bin", b, "dtype code 7");
  b = bytes;
  b.pop_back();
  expect_error("truncated.bin", b, "truncated");
  b = bytes;
  b.push_back(0);
  b.push_back(0);
  expect_error("extra.bin", b, "counts 100 tokens");
  b = bytes;
  b[16] = 101;  // count says one more than the file holds
  expect_error("count.bin", b, "counts 101 tokens");
  b = bytes;
  b[31] = 0x80;  // header size beyond the file
  expect_error("header_size.bin", b, "header size");
  expect_error("short.bin", std::vector<uint8_t>(bytes.begin(), bytes.begin() + 20), "truncated header");
  EXPECT_THROW(sd::TokenShard(path("absent.bin")), st::Error);
}

TEST_F(TokenShards, WindowArgumentsThatWouldOverflowRaise) {
  write_shard(path("a.bin"), {1, 2, 3, 4, 5}, sd::TokenDType::kU8);
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_THROW(sd::TokenWindowDataset({path("a.bin")}, big), st::Error);
  sd::TokenWindowDataset ds({path("a.bin")}, 2);
  EXPECT_THROW(ds.window(0, big), st::Error);
  EXPECT_THROW(ds.window(0, 3), st::Error);  // 3 + 2 + 1 > 5
  EXPECT_EQ(ds.window(0, 2).target.size(0), 2);
}

TEST_F(TokenShards, WindowsMatchTheTokens) {
  auto a = random_tokens(103, 50000, 7), b = random_tokens(30, 50000, 8), tiny = random_tokens(5, 50000, 9);
  write_shard(path("a.bin"), a, sd::TokenDType::kU16);
  write_shard(path("b.bin"), b, sd::TokenDType::kU32);
  write_shard(path("tiny.bin"), tiny, sd::TokenDType::kU16);  // shorter than one window
  const int64_t T = 8;
  for (int64_t stride : {0, 1, 5}) {
    sd::TokenWindowDataset ds({path("a.bin"), path("tiny.bin"), path("b.bin")}, T, stride);
    int64_t step = stride == 0 ? T : stride;
    // Reference: every start s = j * step with s + T + 1 <= len, shard after shard.
    std::vector<std::pair<const std::vector<uint32_t>*, size_t>> want;
    for (auto* v : {&a, &tiny, &b})
      for (size_t s = 0; s + T + 1 <= v->size(); s += static_cast<size_t>(step)) want.emplace_back(v, s);
    ASSERT_EQ(ds.size(), static_cast<int64_t>(want.size())) << "stride " << stride;
    for (int64_t i = 0; i < ds.size(); ++i) {
      auto [v, s] = want[static_cast<size_t>(i)];
      sd::Example e = ds.get(i);
      ASSERT_EQ(e.input.dtype(), st::kInt64);
      ASSERT_EQ(e.input.shape(), (st::Shape{T}));
      ASSERT_EQ(ints(e.input), slice(*v, s, T)) << "window " << i;
      ASSERT_EQ(ints(e.target), slice(*v, s + 1, T)) << "window " << i;
    }
    EXPECT_THROW(ds.get(ds.size()), st::Error);
  }
  sd::TokenWindowDataset ds({path("a.bin")}, T);
  EXPECT_EQ(ints(ds.window(0, 94).target), slice(a, 95, T));  // the last start: 94 + 9 = 103
  EXPECT_THROW(ds.window(0, 95), st::Error);
  // Random windows: reproducible from the generator, and each is a real window of `a`.
  st::Generator g1(5), g2(5);
  for (int k = 0; k < 20; ++k) {
    sd::Example x = ds.random_window(g1), y = ds.random_window(g2);
    EXPECT_EQ(ints(x.input), ints(y.input));
    auto in = ints(x.input);
    bool found = false;
    for (size_t s = 0; s + T + 1 <= a.size() && !found; ++s) found = slice(a, s, T) == in && slice(a, s + 1, T) == ints(x.target);
    EXPECT_TRUE(found);
  }
  EXPECT_THROW(sd::TokenWindowDataset({path("tiny.bin")}, T), st::Error);
  // Batched by a DataLoader into (B, T) int64.
  sd::DataLoader<sd::Example> loader(std::make_shared<sd::TokenWindowDataset>(std::vector<std::string>{path("a.bin")}, T),
                                     {.batch_size = 4, .shuffle = true, .num_workers = 2});
  int64_t windows = 0;
  for (auto& batch : loader) {
    EXPECT_EQ(batch.input.shape()[1], T);
    EXPECT_EQ(batch.target.dtype(), st::kInt64);
    windows += batch.input.shape()[0];
  }
  EXPECT_EQ(windows, 12);
}

TEST_F(TokenShards, TokenizeTool) {
  std::string text1 = "hello, strata!\nbytes are tokens.\n", text2 = "\xc3\xa9t\xc3\xa9 \xff";
  write_bytes(path("one.txt"), std::vector<uint8_t>(text1.begin(), text1.end()));
  write_bytes(path("two.txt"), std::vector<uint8_t>(text2.begin(), text2.end()));
  auto run = [&](const std::string& args) {
    return std::system((std::string(STRATA_TOKENIZE_BIN) + " " + args + " > " + path("log.txt") + " 2>&1").c_str());
  };
  auto bytes_of = [](const std::string& s) { return std::vector<uint32_t>(s.begin(), s.end()); };
  auto as_u8 = [](std::vector<uint32_t> v) {
    for (auto& t : v) t &= 0xff;  // chars may be signed
    return v;
  };
  auto contents = [](const std::string& p) {
    sd::TokenShard s(p);
    std::vector<uint32_t> v;
    for (int64_t i = 0; i < s.size(); ++i) v.push_back(s.at(i));
    return v;
  };
  // u8, no validation split: the bytes of both files, in order.
  ASSERT_EQ(run("--out " + path("all.bin") + " " + path("one.txt") + " " + path("two.txt")), 0);
  EXPECT_EQ(sd::TokenShard(path("all.bin")).dtype(), sd::TokenDType::kU8);
  EXPECT_EQ(contents(path("all.bin")), as_u8(bytes_of(text1 + text2)));
  // u16 with a validation split (the last quarter of each file) and end-of-text tokens.
  ASSERT_EQ(run("--out " + path("train.bin") + " --val " + path("val.bin") + " --val-fraction 0.25 --dtype u16 --eot " +
                path("one.txt") + " " + path("two.txt")),
            0);
  std::vector<uint32_t> train, val;
  for (const std::string& t : {text1, text2}) {
    size_t v = static_cast<size_t>(std::llround(t.size() * 0.25));
    auto tok = as_u8(bytes_of(t));
    train.insert(train.end(), tok.begin(), tok.end() - static_cast<std::ptrdiff_t>(v));
    train.push_back(256);
    val.insert(val.end(), tok.end() - static_cast<std::ptrdiff_t>(v), tok.end());
    val.push_back(256);
  }
  EXPECT_EQ(sd::TokenShard(path("train.bin")).dtype(), sd::TokenDType::kU16);
  EXPECT_EQ(contents(path("train.bin")), train);
  EXPECT_EQ(contents(path("val.bin")), val);
  // Bad use fails and writes nothing.
  EXPECT_NE(run("--out " + path("bad.bin") + " " + path("missing.txt")), 0);
  EXPECT_NE(run("--out " + path("bad.bin") + " --eot " + path("one.txt")), 0);  // 256 needs u16
  EXPECT_NE(run("--out " + path("bad.bin") + " --val-fraction 2 --val " + path("v.bin") + " " + path("one.txt")), 0);
  EXPECT_NE(run(path("one.txt")), 0);  // no --out
  EXPECT_NE(run("--out " + path("bad.bin") + " --val " + path("bad.bin") + " " + path("one.txt")), 0);  // one file
  EXPECT_NE(run("--out " + path("bad.bin") + " --val " + path("./bad.bin") + " " + path("one.txt")), 0);
  // a validation path that cannot be written fails before the training shard is replaced
  const std::vector<uint32_t> all_before = contents(path("all.bin"));
  fs::create_directory(path("valdir"));
  EXPECT_NE(run("--out " + path("all.bin") + " --val " + path("valdir") + " " + path("one.txt")), 0);
  EXPECT_EQ(contents(path("all.bin")), all_before);
  EXPECT_FALSE(fs::exists(path("bad.bin")));
  // a shard that cannot be written in full (here a file-size limit of 2 KiB: the validation
  // shard needs 3.2 KB) leaves both old shards as they were, the one that fitted included
  write_bytes(path("big.txt"), std::vector<uint8_t>(4000, 'x'));
  const std::vector<uint32_t> val_before = contents(path("val.bin")), train_before = contents(path("train.bin"));
  const std::string limited = "bash -c \"trap '' XFSZ; ulimit -f 2; exec " + std::string(STRATA_TOKENIZE_BIN) +
                              " --out " + path("train.bin") + " --val " + path("val.bin") + " --val-fraction 0.8 " +
                              path("big.txt") + "\" > " + path("log.txt") + " 2>&1";
  EXPECT_NE(std::system(limited.c_str()), 0);
  EXPECT_EQ(contents(path("train.bin")), train_before);
  EXPECT_EQ(contents(path("val.bin")), val_before);
  for (auto& entry : fs::directory_iterator(dir_.str()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << "leftover " << entry.path();
}
