// IDX files: byte-exact files written here by hand (plain, and gzip through zlib's gzwrite)
// read back by read_idx and IdxDataset, write_idx round trips, malformed files rejected with
// the file named, and the real Fashion-MNIST files when installed.
#include <filesystem>
#include <random>

#include <sys/stat.h>
#include <zlib.h>

#include "data/image_encode.h"
#include "testing.h"

namespace st = strata;
namespace sd = strata::data;
using namespace strata::testing;

namespace {

// An IDX file's bytes: magic 00 00 <type> <ndim>, big-endian dims, then the data.
std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

void write_gzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error raised";
  } catch (const st::Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Idx, ReadsPlainAndGzipFiles) {
  TempDir dir;
  const auto pixels = random_bytes(5 * 4 * 3, 1);
  std::vector<uint8_t> labels = {3, 0, 9, 9, 1};
  write_bytes(dir / "img", idx_bytes(0x08, {5, 4, 3}, pixels));
  write_bytes(dir / "lab", idx_bytes(0x08, {5}, labels));
  write_gzip(dir / "img.gz", idx_bytes(0x08, {5, 4, 3}, pixels));
  write_gzip(dir / "lab.gz", idx_bytes(0x08, {5}, labels));
  for (const char* suffix : {"", ".gz"}) {
    st::Tensor t = sd::read_idx(dir / (std::string("img") + suffix));
    ASSERT_EQ(t.shape(), (st::Shape{5, 4, 3}));
    ASSERT_EQ(t.dtype(), st::kUInt8);
    EXPECT_EQ(std::vector<uint8_t>(t.data_ptr<uint8_t>(), t.data_ptr<uint8_t>() + t.numel()), pixels);
    sd::IdxDataset ds(dir / (std::string("img") + suffix), dir / (std::string("lab") + suffix));
    ASSERT_EQ(ds.size(), 5);
    for (int64_t i = 0; i < 5; ++i) {
      sd::Example e = ds.get(i);
      ASSERT_EQ(e.input.shape(), (st::Shape{1, 4, 3}));
      ASSERT_EQ(e.input.dtype(), st::kFloat32);
      std::vector<double> want(12);
      for (int k = 0; k < 12; ++k) want[k] = double(float(pixels[i * 12 + k]) / 255.0f);
      EXPECT_EQ(values(e.input), want);
      EXPECT_EQ(e.target.dtype(), st::kInt64);
      EXPECT_EQ(e.target.item<int64_t>(), labels[i]);
    }
    EXPECT_THROW(ds.get(5), st::Error);
  }
}

TEST(Idx, WriteIdxRoundTripsAndMatchesTheFormat) {
  TempDir dir;
  auto data = random_bytes(2 * 3 * 7, 2);
  st::Tensor t = st::from_vector(data, st::Shape{2, 3, 7});
  sd::write_idx(dir / "a.idx", t);
  sd::write_idx(dir / "a.idx.gz", t, /*gzip=*/true);
  EXPECT_EQ(file_bytes(dir / "a.idx"), idx_bytes(0x08, {2, 3, 7}, data));  // byte-exact layout
  auto gz = file_bytes(dir / "a.idx.gz");
  ASSERT_GE(gz.size(), 2u);
  EXPECT_EQ(gz[0], 0x1F);  // gzip magic
  EXPECT_EQ(gz[1], 0x8B);
  for (const char* name : {"a.idx", "a.idx.gz"}) EXPECT_EQ(values(sd::read_idx(dir / name)), values(t));
  // non-contiguous input is written in logical order
  sd::write_idx(dir / "t.idx", t.transpose(1, 2));
  EXPECT_EQ(values(sd::read_idx(dir / "t.idx")), values(t.transpose(1, 2)));
  EXPECT_THROW(sd::write_idx(dir / "f.idx", st::zeros({2})), st::Error);  // float32
}

TEST(Idx, GzipWritesLargeTensorsWhole) {
  // 150 MiB: zlib takes the input in pieces (its counts are 32-bit), so every piece must be
  // compressed, in order
  TempDir dir;
  const int64_t n = int64_t(150) << 20;
  std::vector<uint8_t> data(static_cast<size_t>(n));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i % 251);
  st::Tensor t = st::from_vector(data, st::Shape{n / 1024, 1024});
  sd::write_idx(dir / "big.idx.gz", t, /*gzip=*/true);
  st::Tensor back = sd::read_idx(dir / "big.idx.gz");
  ASSERT_EQ(back.shape(), t.shape());
  EXPECT_TRUE(st::equal(back, t));
}

TEST(Idx, MalformedFilesRaiseNamingTheFile) {
  TempDir dir;
  auto data = random_bytes(4 * 5 * 5, 3);
  auto good = idx_bytes(0x08, {4, 5, 5}, data);
  auto bad_magic = good;
  bad_magic[0] = 0x1F;
  write_bytes(dir / "magic", bad_magic);
  write_bytes(dir / "float", idx_bytes(0x0D, {4}, random_bytes(16, 4)));
  write_bytes(dir / "nodims", idx_bytes(0x08, {}, {}));
  write_bytes(dir / "short_header", std::vector<uint8_t>(good.begin(), good.begin() + 9));
  write_bytes(dir / "truncated", std::vector<uint8_t>(good.begin(), good.end() - 7));
  write_gzip(dir / "truncated.gz", std::vector<uint8_t>(good.begin(), good.end() - 7));
  auto trailing = good;
  trailing.push_back(0);
  write_bytes(dir / "trailing", trailing);
  // a gzip stream cut in the middle
  write_gzip(dir / "whole.gz", good);
  auto gz = file_bytes(dir / "whole.gz");
  write_bytes(dir / "cut.gz", std::vector<uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
  // declares 4 GiB but holds 100 bytes: fails at the end of the data, allocating little;
  // declaring more than the sanity bound (2^40 bytes) fails at the header
  write_bytes(dir / "huge", idx_bytes(0x08, {0xFFFFu, 0xFFFFu}, random_bytes(100, 5)));
  write_bytes(dir / "absurd", idx_bytes(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu}, random_bytes(100, 5)));
  expect_error([&] { sd::read_idx(dir / "magic"); }, {dir / "magic", "bad magic"});
  expect_error([&] { sd::read_idx(dir / "float"); }, {dir / "float", "0x0d"});
  expect_error([&] { sd::read_idx(dir / "nodims"); }, {dir / "nodims", "0 dims"});
  expect_error([&] { sd::read_idx(dir / "short_header"); }, {dir / "short_header", "truncated"});
  expect_error([&] { sd::read_idx(dir / "truncated"); }, {dir / "truncated", "truncated"});
  expect_error([&] { sd::read_idx(dir / "truncated.gz"); }, {dir / "truncated.gz", "truncated"});
  expect_error([&] { sd::read_idx(dir / "trailing"); }, {dir / "trailing", "trailing"});
  expect_error([&] { sd::read_idx(dir / "cut.gz"); }, {dir / "cut.gz"});
  expect_error([&] { sd::read_idx(dir / "huge"); }, {dir / "huge", "truncated"});
  expect_error([&] { sd::read_idx(dir / "absurd"); }, {dir / "absurd", "exceed"});
  expect_error([&] { sd::read_idx(dir / "missing"); }, {dir / "missing", "cannot open"});
  // a FIFO (nobody writing: reading would wait forever) and a folder are refused at once
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  expect_error([&] { sd::read_idx(dir / "fifo"); }, {dir / "fifo", "not a regular file"});
  expect_error([&] { sd::read_idx(dir.str()); }, {"not a regular file"});
  // images and labels that disagree
  write_bytes(dir / "img", good);
  write_bytes(dir / "lab3", idx_bytes(0x08, {3}, {1, 2, 3}));
  expect_error([&] { sd::IdxDataset(dir / "img", dir / "lab3"); }, {"4 images", "3 labels"});
  expect_error([&] { sd::IdxDataset(dir / "lab3", dir / "lab3"); }, {"3 dims"});
}

TEST(Idx, FashionMnist) {
  const std::string dir = sd::fashion_mnist_dir();
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not found in " << dir << " (Debian package dataset-fashion-mnist)";
  sd::IdxDataset train = sd::IdxDataset::fashion_mnist(true), test = sd::IdxDataset::fashion_mnist(false);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.images().shape(), (st::Shape{60000, 28, 28}));
  EXPECT_EQ(test.images().shape(), (st::Shape{10000, 28, 28}));
  for (const sd::IdxDataset* ds : {&train, &test}) {
    std::vector<int64_t> count(10);
    const int64_t* y = ds->labels().data_ptr<int64_t>();
    for (int64_t i = 0; i < ds->size(); ++i) {
      ASSERT_TRUE(y[i] >= 0 && y[i] <= 9) << i;
      count[y[i]]++;
    }
    for (int k = 0; k < 10; ++k) EXPECT_EQ(count[k], ds->size() / 10) << "class " << k;
  }
  sd::Example e = train.get(59999);
  EXPECT_EQ(e.input.shape(), (st::Shape{1, 28, 28}));
  auto v = values(e.input);
  EXPECT_GE(*std::min_element(v.begin(), v.end()), 0.0);
  EXPECT_LE(*std::max_element(v.begin(), v.end()), 1.0);
  EXPECT_GT(*std::max_element(v.begin(), v.end()), 0.5);  // a real image, not a blank one
}
