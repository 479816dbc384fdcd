// Every way a safetensors file can be malformed gives a strata::Error naming the problem:
// header length, UTF-8, JSON outside the subset, duplicate keys, byte ranges (holes,
// overlaps, end before begin, trailing bytes, truncation), shapes and dtypes, metadata.
#include <cstring>
#include <limits>

#include "temp_dir.h"
#include "testing.h"

namespace strata {
namespace {

std::string le64(uint64_t n) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(n >> (8 * i));
  return b;
}

// A file from a header (padded with spaces to a multiple of 8 unless `pad` is false) and
// `data` bytes.
std::string file(std::string header, size_t data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + std::string(data, '\x01');
}

std::string f32(const std::string& name, const std::string& shape, uint64_t b, uint64_t e) {
  return fmt::format(R"("{}":{{"dtype":"F32","shape":[{}],"data_offsets":[{},{}]}})", name, shape, b, e);
}

// Parsing `bytes` raises Error whose message contains `part`.
::testing::AssertionResult rejects(const std::string& bytes, const std::string& part) {
  try {
    io::parse_safetensors(bytes.data(), bytes.size());
  } catch (const Error& e) {
    if (std::string(e.what()).find(part) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message \"" << e.what() << "\" lacks \"" << part << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not a strata::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted";
}

TEST(SafetensorsBad, TooShort) {
  EXPECT_TRUE(rejects("", "too short"));
  EXPECT_TRUE(rejects("\x02\0\0\0", "too short"));
  EXPECT_TRUE(rejects(std::string(7, '\0'), "too short"));
}

TEST(SafetensorsBad, HeaderLength) {
  EXPECT_TRUE(rejects(le64(1000) + "{}", "larger than the 2 bytes"));
  EXPECT_TRUE(rejects(le64(100'000'001) + "{}", "exceeds the limit"));
  EXPECT_TRUE(rejects(le64(std::numeric_limits<uint64_t>::max() - 3) + "{}", "overflows"));
  EXPECT_TRUE(rejects(le64(std::numeric_limits<uint64_t>::max()) + "{}", "overflows"));
  EXPECT_TRUE(rejects(le64(0), "does not start with '{'"));
}

TEST(SafetensorsBad, HeaderStart) {
  EXPECT_TRUE(rejects(file(" {}", 0), "does not start with '{'"));
  EXPECT_TRUE(rejects(file("[]", 0), "does not start with '{'"));
  EXPECT_TRUE(rejects(file("{}x", 0), "after the end of the JSON value"));
}

TEST(SafetensorsBad, InvalidUtf8) {
  for (const char* bad : {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(rejects(file("{\"__metadata__\":{\"k\":\"" + std::string(bad) + "\"}}", 0), "invalid UTF-8"));
  }
  // Valid multi-byte text passes.
  io::SafetensorsFile f = [] {
    std::string b = file("{\"__metadata__\":{\"k\":\"\xc3\xa9\xe2\x98\x83\xf0\x9f\x98\x80\"}}", 0);
    return io::parse_safetensors(b.data(), b.size());
  }();
  EXPECT_EQ(f.metadata.at("k"), "\xc3\xa9\xe2\x98\x83\xf0\x9f\x98\x80");
}

TEST(SafetensorsBad, JsonOutsideTheSubset) {
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0), "negative"));
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}})", 0), "fractions"));
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[1e3],"data_offsets":[0,0]}})", 0), "exponents"));
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}})", 4), "leading zero"));
  EXPECT_TRUE(rejects(file(R"({"x":null})", 0), "expected an object, found null"));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{"a":null}})", 0), "must be a string, found null"));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":nul})", 0), "expected null"));
  // null metadata is none, as the reference reader (serde's Option) takes it
  std::string none = file(R"({"__metadata__":null,"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  io::SafetensorsFile parsed = io::parse_safetensors(none.data(), none.size());
  EXPECT_TRUE(parsed.metadata.empty());
  EXPECT_EQ(parsed.tensors.size(), 1u);
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{"a":true}})", 0), "true"));
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,0]}})", 0),
                      "64 bits"));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{"a":"1",}})", 0), "expected a string key"));
  EXPECT_TRUE(rejects(file(R"({"a" 1})", 0), "expected ':'"));
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[1,2)", 0, false), "unterminated array"));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{"a":"1")", 0, false), "unterminated object"));
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[1 2]}})", 0), "expected ']'"));
  EXPECT_TRUE(rejects(file(R"({"a)", 0, false), "unterminated string"));
  EXPECT_TRUE(rejects(file("{\"a\tb\":1}", 0), "control character"));
  EXPECT_TRUE(rejects(file(R"({"\q":1})", 0), "unknown escape"));
  EXPECT_TRUE(rejects(file(R"({"\u12g4":1})", 0), "hex digit"));
  EXPECT_TRUE(rejects(file(R"({"\ud83d":1})", 0), "not followed by a low surrogate"));
  EXPECT_TRUE(rejects(file(R"({"\ud83d\u0041":1})", 0), "followed by"));
  EXPECT_TRUE(rejects(file(R"({"\ude00":1})", 0), "lone low surrogate"));
  // The reader follows the header's schema, so nesting anywhere else is refused where it starts.
  std::string deep = "{\"a\":" + std::string(5000, '[') + std::string(5000, ']') + "}";
  EXPECT_TRUE(rejects(file(deep, 0), "expected an object, found an array"));
  EXPECT_TRUE(rejects(file(R"({"x":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", 4), "must be integers"));
}

TEST(SafetensorsBad, EscapesDecode) {
  // \" \\ \/ \b \f \n \r \t, \u00e9 and the pair \ud83d\ude00 (U+1F600) in a tensor name.
  std::string name = R"(q\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00)";
  std::string b = file("{" + f32(name, "1", 0, 4) + "}", 4);
  io::SafetensorsFile f = io::parse_safetensors(b.data(), b.size());
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors.begin()->first, "q\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
}

TEST(SafetensorsBad, DuplicateKeys) {
  EXPECT_TRUE(rejects(file("{" + f32("a", "1", 0, 4) + "," + f32("a", "1", 4, 8) + "}", 8), "duplicate key \"a\""));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{"k":"1","k":"2"}})", 0), "duplicate key \"k\""));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4), "duplicate"));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{},"__metadata__":{}})", 0), "duplicate key \"__metadata__\""));
  // apart in the header and in byte order, still found
  const std::string b_twice = "{" + f32("b", "1", 0, 4) + "," + f32("c", "1", 4, 8) + "," + f32("b", "1", 8, 12) + "}";
  EXPECT_TRUE(rejects(file(b_twice, 12), "duplicate key \"b\""));
}

TEST(SafetensorsBad, ByteRanges) {
  EXPECT_TRUE(rejects(file("{" + f32("a", "1", 0, 4) + "," + f32("b", "1", 8, 12) + "}", 12), "hole of 4 bytes"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "1", 4, 8) + "}", 8), "hole of 4 bytes"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "2", 0, 8) + "," + f32("b", "2", 4, 12) + "}", 12), "overlap"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "1", 0, 4) + "," + f32("b", "1", 0, 4) + "}", 4), "overlap"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "1", 8, 4) + "}", 8), "end before begin"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "1", 0, 4) + "}", 7), "3 trailing bytes"));
  EXPECT_TRUE(rejects(file("{}", 1), "1 trailing bytes"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "2", 0, 8) + "}", 5), "reach past"));
  // The header's key order is free: the reference reads entries in offset order.
  std::string swapped = file("{" + f32("b", "1", 4, 8) + "," + f32("a", "2", 8, 16) + "," + f32("c", "1", 0, 4) + "}", 16);
  io::SafetensorsView v = io::view_safetensors(swapped.data(), swapped.size());
  ASSERT_EQ(v.entries.size(), 3u);
  EXPECT_EQ(v.entries[0].name, "c");
  EXPECT_EQ(v.entries[2].name, "a");
}

TEST(SafetensorsBad, ShapesAndDTypes) {
  EXPECT_TRUE(rejects(file("{" + f32("a", "4294967296,4294967296", 0, 0) + "}", 0), "overflows int64"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "4611686018427387904,2", 0, 0) + "}", 0), "overflows int64"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "9223372036854775808", 0, 0) + "}", 0), "does not fit in int64"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "2305843009213693952", 0, 0) + "}", 0), "needs"));
  EXPECT_TRUE(rejects(file("{" + f32("a", "3", 0, 8) + "}", 8), "span 8 bytes but F32 [3] needs 3 x 4 = 12"));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})", 4), "unknown dtype \"F12\""));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4), "unknown dtype"));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4), "dtype must be a string"));
  EXPECT_TRUE(rejects(file(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "missing \"dtype\""));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F32","shape":[1]}})", 0), "missing \"data_offsets\""));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", 4), "shape must be an array"));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), "two integers"));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4), "unknown field"));
  EXPECT_TRUE(rejects(file(R"({"a":[]})", 0), "expected an object"));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}})", 4), "two integers"));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", 4), "two integers"));
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":{}}})", 4), "two integers"));
  // At most kMaxSafetensorsDims dimensions, refused at the first one past it (a hostile
  // header of 100 MB of zeros in one shape is not read into memory).
  std::string dims64 = fmt::format("{}", fmt::join(std::vector<int>(64, 1), ","));
  std::string ok = file("{" + f32("a", dims64, 0, 4) + "}", 4);
  EXPECT_EQ(io::parse_safetensors(ok.data(), ok.size()).tensors.at("a").dim(), 64);
  EXPECT_TRUE(rejects(file("{" + f32("a", dims64 + ",1", 0, 4) + "}", 4), "more than 64 dimensions"));
  // A zero anywhere makes the element count 0, however large the other sizes.
  std::string zero = file("{" + f32("a", "0,9223372036854775807,9223372036854775807", 0, 0) + "}", 0);
  EXPECT_EQ(io::parse_safetensors(zero.data(), zero.size()).tensors.at("a").numel(), 0);
  // A BOOL byte other than 0 or 1.
  EXPECT_TRUE(rejects(file(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", 0) + std::string("\x01\x02", 2),
                      "not 0 or 1"));
}

TEST(SafetensorsBad, Metadata) {
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{"a":1}})", 0), "__metadata__ \"a\" must be a string"));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":{"a":["x"]}})", 0), "must be a string"));
  EXPECT_TRUE(rejects(file(R"({"__metadata__":"x"})", 0), "__metadata__ must be an object"));
}

// Every strict prefix of a valid file, and every single-byte change of its header length,
// is rejected without reading out of bounds (the sanitizer build checks the reads).
TEST(SafetensorsBad, TruncatedAndCorrupted) {
  io::TensorMap m = {{"w", arange(12, kFloat32).reshape({3, 4})}, {"b", arange(3, kInt64)}, {"z", zeros({0}, kInt8)}};
  std::vector<uint8_t> good = io::serialize_safetensors(m, {{"k", "v"}});
  for (size_t n = 0; n < good.size(); ++n) {
    SCOPED_TRACE(n);
    EXPECT_THROW(io::parse_safetensors(good.data(), n), Error);
  }
  EXPECT_NO_THROW(io::parse_safetensors(good.data(), good.size()));
  for (size_t i = 0; i < 8; ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0x10;
    EXPECT_THROW(io::parse_safetensors(bad.data(), bad.size()), Error);
  }
}

TEST(SafetensorsBad, LoadNamesTheFile) {
  const strata::testing::TempDir temp("strata_io");
  const std::string path = temp / "bad.safetensors";
  std::string bytes = file("{" + f32("a", "1", 0, 4) + "}", 3);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  try {
    io::load_safetensors(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reach past"), std::string::npos) << e.what();
  }
  EXPECT_THROW(io::load_safetensors(path + ".missing"), Error);
}

}  // namespace
}  // namespace strata
