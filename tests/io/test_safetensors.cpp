// safetensors round trips of every dtype and layout, golden bytes derived by hand from the
// format's specification, mmap'd loading (tensors alias the mapping, which lives as long as
// they do) and atomic writes (a failed write leaves the old file and no temporary).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "temp_dir.h"
#include "testing.h"

namespace strata {
namespace {

using strata::testing::TempDir;
using strata::testing::throws_with;

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string as_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// The bytes of a tensor in C order, read element by element through its strides.
std::string c_order_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data()), c.nbytes());
}

// A tensor of `dtype` with varied, exactly representable values.
Tensor sample(DType dtype, const Shape& shape, int seed) {
  std::vector<double> v(static_cast<size_t>(checked_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    double k = static_cast<double>((i * 7 + seed) % 41);
    if (dtype == kBool) v[i] = (i + seed) % 3 == 0;
    else if (dtype == kUInt8) v[i] = k * 6;
    else if (is_floating(dtype)) v[i] = (k - 20) * 0.25;
    else if (dtype == kInt64) v[i] = (k - 20) * 1e12;
    else v[i] = k - 20;
  }
  return from_vector(v, shape).to(dtype);
}

const DType kAllDTypes[] = {kBool, kUInt8, kInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64};

TEST(Safetensors, RoundTripEveryDTypeAndLayout) {
  io::TensorMap in;
  int seed = 0;
  for (DType d : kAllDTypes) {
    std::string name(dtype_name(d));
    for (auto layout : {testing::Layout::Contiguous, testing::Layout::Transposed, testing::Layout::Sliced})
      in[name + "." + testing::layout_name(layout)] = testing::with_layout(sample(d, {3, 5}, ++seed), layout);
    in[name + ".scalar"] = sample(d, {}, ++seed);
    in[name + ".empty"] = zeros({0, 4}, d);
    in[name + ".wide"] = sample(d, {2, 1, 3, 2}, ++seed).permute({3, 1, 0, 2});  // any permutation
  }
  ASSERT_FALSE(in.at("float32.transposed").is_contiguous());
  ASSERT_FALSE(in.at("int8.sliced").is_contiguous());
  io::Metadata meta = {{"format", "pt"}, {"step", "1200"}, {"note", "quote \" slash \\ tab \t ünï \x01"}};

  const TempDir temp("strata_io");
  const std::string& dir = temp.str();
  std::string path = dir + "/model.safetensors";
  io::save_safetensors(path, in, meta);
  EXPECT_EQ(read_bytes(path), as_string(io::serialize_safetensors(in, meta)));

  std::vector<uint8_t> bytes = io::serialize_safetensors(in, meta);
  for (const io::SafetensorsFile& out : {io::load_safetensors(path), io::parse_safetensors(bytes.data(), bytes.size())}) {
    EXPECT_EQ(out.metadata, meta);
    ASSERT_EQ(out.tensors.size(), in.size());
    for (const auto& [name, t] : in) {
      SCOPED_TRACE(name);
      const Tensor& got = out.tensors.at(name);
      EXPECT_EQ(got.dtype(), t.dtype());
      EXPECT_EQ(got.shape(), t.shape());
      EXPECT_TRUE(got.is_contiguous());
      EXPECT_EQ(c_order_bytes(got), c_order_bytes(t));
      EXPECT_EQ(testing::values(got), testing::values(t));
    }
  }
}

// The file the reference writes for an empty map: N = 8 ("{}" and 6 spaces of padding).
TEST(Safetensors, GoldenEmpty) {
  const std::string want = std::string("\x08\0\0\0\0\0\0\0", 8) + "{}      ";
  EXPECT_EQ(as_string(io::serialize_safetensors({})), want);
  EXPECT_EQ(as_string(io::serialize_safetensors({}, {})), want);
  io::SafetensorsFile f = io::parse_safetensors(want.data(), want.size());
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
}

// One F32 tensor [1, 2] and one metadata entry. The header is 85 characters, padded with 3
// spaces to N = 88 = 0x58; 1.0f is 0x3f800000 and 2.0f 0x40000000, stored little-endian.
TEST(Safetensors, GoldenOneTensorWithMetadata) {
  const std::string header = R"({"__metadata__":{"format":"np"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(header.size(), 85u);
  const std::string want = std::string("\x58\0\0\0\0\0\0\0", 8) + header + "   " +
                           std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  Tensor x = from_vector<float>({1.0f, 2.0f});
  EXPECT_EQ(as_string(io::serialize_safetensors({{"x", x}}, {{"format", "np"}})), want);
}

// Tensors are ordered by dtype alignment as the reference orders them (its Dtype enum,
// descending), then by name; escapes follow serde_json.
TEST(Safetensors, GoldenOrderAndEscapes) {
  io::TensorMap m;
  m["b"] = zeros({1}, kBool);
  m["u"] = zeros({1}, kUInt8);
  m["i8"] = zeros({1}, kInt8);
  m["h"] = zeros({1}, kFloat16);
  m["bf"] = zeros({1}, kBFloat16);
  m["i32"] = zeros({1}, kInt32);
  m["f2"] = zeros({0}, kFloat32);
  m["f1"] = zeros({}, kFloat32);
  m["d"] = zeros({1}, kFloat64);
  m["l"] = zeros({1}, kInt64);
  m["q\"\\\n\x01\x7f\xc3\xa9"] = zeros({1}, kInt64);
  const std::string want =
      "{\"l\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"q\\\"\\\\\\n\\u0001\x7f\xc3\xa9\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]},"
      "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[16,24]},"
      "\"f1\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[24,28]},"
      "\"f2\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[28,28]},"
      "\"i32\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[28,32]},"
      "\"bf\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[32,34]},"
      "\"h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[34,36]},"
      "\"i8\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[36,37]},"
      "\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[37,38]},"
      "\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[38,39]}}";
  std::string bytes = as_string(io::serialize_safetensors(m));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(n, (want.size() + 7) / 8 * 8);
  EXPECT_EQ(bytes.substr(8, want.size()), want);
  EXPECT_EQ(bytes.substr(8 + want.size(), n - want.size()), std::string(n - want.size(), ' '));
  EXPECT_EQ(bytes.size(), 8 + n + 39);
}

TEST(Safetensors, SerializeRejectsBadNames) {
  EXPECT_THROW(io::serialize_safetensors({{"__metadata__", zeros({1})}}), Error);
  EXPECT_THROW(io::serialize_safetensors({{"x", Tensor()}}), Error);
  EXPECT_THROW(io::serialize_safetensors({{"bad\xff", zeros({1})}}), Error);
  EXPECT_THROW(io::serialize_safetensors({}, {{"k", "bad\xc0\xaf"}}), Error);
}

// The address ranges of the mappings of `path` in this process.
std::vector<std::pair<uintptr_t, uintptr_t>> mappings_of(const std::string& path) {
  char real[4096];
  EXPECT_NE(::realpath(path.c_str(), real), nullptr);
  std::ifstream maps("/proc/self/maps");
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  std::string line;
  while (std::getline(maps, line)) {
    size_t slash = line.find('/');
    if (slash == std::string::npos || line.substr(slash) != real) continue;
    uintptr_t lo = 0, hi = 0;
    std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi);
    out.emplace_back(lo, hi);
  }
  return out;
}

bool inside(const void* p, const std::vector<std::pair<uintptr_t, uintptr_t>>& ranges) {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (auto [lo, hi] : ranges)
    if (a >= lo && a < hi) return true;
  return false;
}

TEST(Safetensors, LoadAliasesTheMappingAndKeepsItAlive) {
  const TempDir temp("strata_io");
  const std::string& dir = temp.str();
  std::string path = dir + "/w.safetensors";
  io::save_safetensors(path, {{"w", sample(kFloat32, {64, 64}, 1)}, {"b", sample(kInt64, {7}, 2)}});
  const std::string on_disk = read_bytes(path);
  Tensor w;
  {
    io::SafetensorsFile f = io::load_safetensors(path);
    auto ranges = mappings_of(path);
    ASSERT_FALSE(ranges.empty()) << "the file is not mapped";
    EXPECT_TRUE(inside(f.tensors.at("w").data(), ranges));
    EXPECT_TRUE(inside(f.tensors.at("b").data(), ranges));
    w = f.tensors.at("w");
  }
  // The last tensor keeps the mapping; writes to it stay private to this process.
  EXPECT_TRUE(inside(w.data(), mappings_of(path)));
  EXPECT_EQ(testing::values(w), testing::values(sample(kFloat32, {64, 64}, 1)));
  w.fill_(7.0);
  EXPECT_EQ(read_bytes(path), on_disk);
  // Saving over the file replaces it (a new inode); the mapped tensor keeps its values.
  io::save_safetensors(path, {{"w", zeros({2})}});
  EXPECT_EQ(testing::values(w)[0], 7.0);
  w = Tensor();
  EXPECT_TRUE(mappings_of(path).empty());
  EXPECT_EQ(io::load_safetensors(path).tensors.at("w").numel(), 2);
}

TEST(Safetensors, ViewListsDTypesStrataCannotHold) {
  // U16 [2] = {1, 513} then F8_E4M3 [1], hand-written.
  const std::string header =
      R"({"a":{"dtype":"U16","shape":[2],"data_offsets":[0,4]},"z":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[4,5]}})";
  std::string file = std::string(1, char(header.size())) + std::string(7, '\0') + header +
                     std::string("\x01\x00\x01\x02\x38", 5);
  io::SafetensorsView v = io::view_safetensors(file.data(), file.size());
  ASSERT_EQ(v.entries.size(), 2u);
  EXPECT_EQ(v.entries[0].name, "a");
  EXPECT_EQ(v.entries[0].dtype, "U16");
  EXPECT_EQ(v.entries[0].shape, Shape{2});
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(v.entries[0].data), 4), std::string("\x01\x00\x01\x02", 4));
  EXPECT_EQ(v.entries[1].dtype, "F8_E4M3");
  EXPECT_EQ(v.entries[1].data[0], 0x38);
  try {
    io::parse_safetensors(file.data(), file.size());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"a\" has dtype U16"), std::string::npos) << e.what();
  }
}

TEST(AtomicFile, ThrowingWriterLeavesOldFileAndNoTemporary) {
  const TempDir temp("strata_io");
  const std::string& dir = temp.str();
  std::string path = dir + "/ckpt.safetensors";
  write_bytes(path, "old contents");
  EXPECT_THROW(io::write_file_atomically(path,
                                         [](std::FILE* f) {
                                           std::fputs("half of the new", f);
                                           std::fflush(f);
                                           throw std::runtime_error("disk on fire");
                                         }),
               std::runtime_error);
  EXPECT_EQ(read_bytes(path), "old contents");
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"ckpt.safetensors"});

  io::write_file_atomically(path, [](std::FILE* f) { std::fputs("new", f); });
  EXPECT_EQ(read_bytes(path), "new");
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"ckpt.safetensors"});
}

TEST(AtomicFile, SystemErrorsNameThePath) {
  const TempDir temp("strata_io");
  const std::string& dir = temp.str();
  try {
    io::write_file_atomically(dir + "/missing/x.bin", [](std::FILE*) {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/missing/x.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOENT)), std::string::npos) << e.what();
  }
  // rename over a folder fails after the data was written: the temporary must go.
  std::string sub = dir + "/sub";
  ASSERT_EQ(::mkdir(sub.c_str(), 0755), 0);
  write_bytes(sub + "/keep", "x");
  EXPECT_THROW(io::write_file_atomically(sub, [](std::FILE* f) { std::fputs("data", f); }), Error);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"sub"});
  // save_safetensors checks its input before touching the file.
  std::string path = dir + "/m.safetensors";
  write_bytes(path, "old");
  EXPECT_THROW(io::save_safetensors(path, {{"a", zeros({2})}, {"b", Tensor()}}), Error);
  EXPECT_EQ(read_bytes(path), "old");
}

TEST(AtomicFile, LinksModesLongNamesAndOtherKindsOfFile) {
  const TempDir temp("strata_io");
  const std::string& dir = temp.str();
  auto write = [](const char* text) { return [text](std::FILE* f) { std::fputs(text, f); }; };
  // a symbolic link: the file it points to is replaced, and the link stays a link
  write_bytes(dir + "/target.bin", "old");
  ASSERT_EQ(::symlink("target.bin", (dir + "/link.bin").c_str()), 0);
  io::write_file_atomically(dir + "/link.bin", write("new"));
  EXPECT_EQ(read_bytes(dir + "/target.bin"), "new");
  struct stat st {};
  ASSERT_EQ(::lstat((dir + "/link.bin").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  // a replaced file keeps its permission bits
  ASSERT_EQ(::chmod((dir + "/target.bin").c_str(), 0640), 0);
  io::write_file_atomically(dir + "/target.bin", write("newer"));
  ASSERT_EQ(::stat((dir + "/target.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  // the longest legal names (255 bytes) leave room for the temporary's
  const std::string long_name = dir + "/" + std::string(255, 'n');
  io::write_file_atomically(long_name, write("long"));
  EXPECT_EQ(read_bytes(long_name), "long");
  // folders, pipes and devices are refused before anything is written
  bool called = false;
  auto spy = [&](std::FILE*) { called = true; };
  ASSERT_EQ(::mkdir((dir + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo((dir + "/pipe").c_str(), 0644), 0);
  for (const std::string& p : {dir + "/sub", dir + "/pipe", std::string("/dev/null")})
    EXPECT_TRUE(throws_with([&] { io::write_file_atomically(p, spy); }, {p.c_str(), "not a regular file"})) << p;
  EXPECT_FALSE(called);
  // and readers refuse them without waiting for a writer that never comes
  for (const std::string& p : {dir + "/sub", dir + "/pipe"}) {
    EXPECT_TRUE(throws_with([&] { io::load_safetensors(p); }, {p.c_str()})) << p;
    EXPECT_TRUE(throws_with([&] { data::TokenShard shard(p); }, {p.c_str(), "not a regular file"})) << p;
  }
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_THROW(io::write_file_atomically(dir + "/x.bin", {}), Error);  // no write function
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{"link.bin", std::string(255, 'n'), "pipe", "sub", "target.bin"}));
}

// A temporary is abandoned when no writer holds its lock, whatever process id its name
// carries: a killed writer in a container was often pid 1, and so is the next run.
TEST(AtomicFile, AbandonedTemporariesAreThoseNobodyHolds) {
  const TempDir temp("strata_io");
  const std::string& dir = temp.str();
  const std::string path = dir + "/f.bin", prefix = dir + "/" + io::temporary_prefix(path);
  write_bytes(path, "old");
  const std::string ours = prefix + std::to_string(::getpid()) + "-0-0000beef";  // this pid, unlocked
  const std::string dead = prefix + "999999999-0-0000dead";  // no such process, unlocked
  const std::string held = prefix + "1-0-00000001";          // a live writer holds it
  const std::string other = dir + "/.g.bin.tmp-1-0-00000002";  // another file's temporary
  for (const std::string& f : {ours, dead, held, other}) write_bytes(f, "partial");
  const int held_fd = ::open(held.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held_fd, 0);
  ASSERT_EQ(::flock(held_fd, LOCK_EX | LOCK_NB), 0);

  io::remove_abandoned_temporaries(path);
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{".f.bin.tmp-1-0-00000001", ".g.bin.tmp-1-0-00000002", "f.bin"}));

  // A write in progress holds its temporary: a cleaner running meanwhile (another thread of
  // this process, say) leaves it, and the write completes.
  io::write_file_atomically(path, [&](std::FILE* f) {
    std::fputs("new", f);
    std::vector<std::string> names = list_dir(dir);
    ASSERT_EQ(names.size(), 4u);
    std::string writing;
    for (const std::string& n : names)
      if (dir + "/" + n != held && n.rfind(".f.bin.tmp-", 0) == 0) writing = dir + "/" + n;
    ASSERT_FALSE(writing.empty());
    int fd = ::open(writing.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    EXPECT_NE(::flock(fd, LOCK_EX | LOCK_NB), 0);
    EXPECT_EQ(errno, EWOULDBLOCK);
    ::close(fd);
    io::remove_abandoned_temporaries(path);
    EXPECT_EQ(list_dir(dir).size(), 4u);
  });
  EXPECT_EQ(read_bytes(path), "new");
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{".f.bin.tmp-1-0-00000001", ".g.bin.tmp-1-0-00000002", "f.bin"}));

  // its writer gone (the lock with it), the temporary is removed
  ::close(held_fd);
  io::remove_abandoned_temporaries(path);
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{".g.bin.tmp-1-0-00000002", "f.bin"}));

  // a user's own files that merely start with the prefix are not temporaries: only names of
  // the form "<pid>-<counter>-<8 hex digits>" are
  const std::vector<std::string> users = {prefix + "notes.txt", prefix + "1-0-0000beef.bak", prefix + "12-3-abc",
                                          prefix + "1-0-0000BEEF", prefix + "-1-00000000", prefix};
  for (const std::string& f : users) write_bytes(f, "mine");
  io::remove_abandoned_temporaries(path);
  for (const std::string& f : users) EXPECT_EQ(read_bytes(f), "mine") << f;
}

// The streaming form: bytes written and rewritten through the stream land only on commit;
// an abandoned file leaves the destination as it was and no temporary.
TEST(AtomicFile, StreamsLandOnCommitOnly) {
  const TempDir temp("strata_io");
  const std::string& dir = temp.str();
  const std::string path = dir + "/f.bin";
  write_bytes(path, "old");
  {
    io::AtomicFile file(path, "test");
    std::fputs("....body", file.stream());
    EXPECT_EQ(read_bytes(path), "old");
    EXPECT_EQ(list_dir(dir).size(), 2u);
  }
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"f.bin"});
  EXPECT_EQ(read_bytes(path), "old");
  io::AtomicFile file(path, "test");
  std::fputs("....body", file.stream());
  ASSERT_EQ(std::fseek(file.stream(), 0, SEEK_SET), 0);
  std::fputs("head", file.stream());
  file.commit();
  EXPECT_EQ(file.stream(), nullptr);
  EXPECT_EQ(read_bytes(path), "headbody");
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"f.bin"});
  EXPECT_TRUE(throws_with([&] { file.commit(); }, {"[test]", "already committed"}));
  file.abandon();  // after a commit: nothing to undo
  EXPECT_EQ(read_bytes(path), "headbody");
  // a rename that fails (a folder appeared at the destination) removes the temporary
  const std::string later = dir + "/later";
  io::AtomicFile doomed(later, "test");
  ASSERT_EQ(::mkdir(later.c_str(), 0755), 0);
  write_bytes(later + "/keep", "x");
  EXPECT_TRUE(throws_with([&] { doomed.commit(); }, {"[test]", later.c_str(), "rename"}));
  EXPECT_EQ(list_dir(dir), (std::vector<std::string>{"f.bin", "later"}));
  EXPECT_TRUE(throws_with([&] { io::AtomicFile(later, "test"); }, {"[test]", "not a regular file"}));
}

TEST(Safetensors, HeaderPastTheFormatsLimitsIsRefusedBeforeWriting) {
  // a reader refuses headers over kMaxSafetensorsHeaderBytes, so a writer must not make one
  const TempDir temp("strata_io");
  const std::string& dir = temp.str();
  std::string path = dir + "/m.safetensors";
  io::save_safetensors(path, {{"a", ones({2})}});
  const std::string before = read_bytes(path);
  io::Metadata big{{"vocab", std::string(io::kMaxSafetensorsHeaderBytes, 'a')}};
  EXPECT_TRUE(throws_with([&] { io::save_safetensors(path, {{"a", zeros({2})}}, big); }, {"header", "limit"}));
  const std::string long_name(io::kMaxSafetensorsHeaderBytes, 'n');
  EXPECT_TRUE(throws_with([&] { io::save_safetensors(path, {{long_name, zeros({1})}}); }, {"limit"}));
  // nor shapes of more dimensions than readers take
  Tensor many_dims = zeros({1}).reshape(Shape(io::kMaxSafetensorsDims + 1, 1));
  EXPECT_TRUE(throws_with([&] { io::save_safetensors(path, {{"a", many_dims}}); }, {"65 dimensions", "at most 64"}));
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"m.safetensors"});
}

TEST(Safetensors, SavesGpuTensors) {
  if (!cuda::is_available()) GTEST_SKIP() << "no GPU";
  Tensor a = sample(kFloat32, {4, 6}, 3);
  Tensor g = a.cuda().t();
  std::vector<uint8_t> bytes = io::serialize_safetensors({{"g", g}});
  io::SafetensorsFile f = io::parse_safetensors(bytes.data(), bytes.size());
  EXPECT_EQ(c_order_bytes(f.tensors.at("g")), c_order_bytes(a.t()));
}

}  // namespace
}  // namespace strata
