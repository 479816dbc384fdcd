// A recursive-descent reader for the JSON subset of safetensors headers, and the string
// writer. Every read is bounds-checked against the text; nesting is capped so hostile input
// cannot exhaust the stack.
#include "io/json.h"

#include <set>

#include <strata/core/error.hpp>

namespace strata::io::json {
namespace {

constexpr int kMaxDepth = 16;  // a header needs 3 (file, entry, shape)

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected '{}' after the end of the JSON value", printable(s_[pos_]));
    return v;
  }

 private:
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
    throw Error(fmt::format("[safetensors] header: {} at byte {}", fmt::format(format, std::forward<Args>(args)...),
                            pos_));
  }
  static std::string printable(char c) {
    auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }
  void skip_ws() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }
  void expect(char c) {
    if (at_end()) fail("expected '{}' but the header ended", c);
    if (peek() != c) fail("expected '{}' but found '{}'", c, printable(peek()));
    ++pos_;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than {} levels", kMaxDepth);
    if (at_end()) fail("expected a value but the header ended");
    char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Value v;
      v.kind = Value::Kind::String;
      v.string = string();
      return v;
    }
    if (c >= '0' && c <= '9') return integer();
    if (c == '-') fail("negative numbers are not allowed");
    if (c == 't' || c == 'f' || c == 'n') fail("true, false and null are not allowed");
    fail("unexpected '{}'", printable(c));
  }

  Value object(int depth) {
    Value v;
    v.kind = Value::Kind::Object;
    std::set<std::string, std::less<>> keys;
    expect('{');
    skip_ws();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_ws();
      if (at_end() || peek() != '"') fail("expected a string key");
      size_t key_pos = pos_;
      std::string key = string();
      if (!keys.insert(key).second) {
        pos_ = key_pos;
        fail("duplicate key \"{}\"", key);
      }
      skip_ws();
      expect(':');
      skip_ws();
      Value item = value(depth + 1);
      v.object.push_back(Member{std::move(key), std::move(item)});
      skip_ws();
      if (at_end()) fail("unterminated object");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return v;
    }
  }

  Value array(int depth) {
    Value v;
    v.kind = Value::Kind::Array;
    expect('[');
    skip_ws();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_ws();
      v.array.push_back(value(depth + 1));
      skip_ws();
      if (at_end()) fail("unterminated array");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  Value integer() {
    Value v;
    v.kind = Value::Kind::Integer;
    size_t start = pos_;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      auto digit = static_cast<uint64_t>(peek() - '0');
      if (v.integer > (UINT64_MAX - digit) / 10) fail("integer does not fit in 64 bits");
      v.integer = v.integer * 10 + digit;
      ++pos_;
    }
    if (pos_ - start > 1 && s_[start] == '0') {
      pos_ = start;
      fail("integer with a leading zero");
    }
    if (!at_end() && (peek() == '.' || peek() == 'e' || peek() == 'E'))
      fail("only non-negative integers are allowed, not fractions or exponents");
    return v;
  }

  unsigned hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      char c = peek();
      unsigned d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : 16u;
      if (d == 16) fail("bad hex digit '{}' in a \\u escape", printable(c));
      code = code * 16 + d;
    }
    return code;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // The text was validated as UTF-8 before parsing, so raw bytes are copied as they are.
  std::string string() {
    std::string out;
    expect('"');
    for (;;) {
      if (at_end()) fail("unterminated string");
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character \\x{:02x} in a string", int(c));
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate \\u{:04x}", cp);
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.size() - pos_ < 2 || s_[pos_] != '\\' || s_[pos_ + 1] != 'u')
              fail("high surrogate \\u{:04x} not followed by a low surrogate", cp);
            pos_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate \\u{:04x} followed by \\u{:04x}", cp, lo);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; fail("unknown escape '\\{}'", printable(e));
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::Object: return "an object";
    case Value::Kind::Array: return "an array";
    case Value::Kind::String: return "a string";
    case Value::Kind::Integer: return "an integer";
  }
  return "?";
}

Value parse(std::string_view text) { return Parser(text).document(); }

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

void append_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        else out += c;
    }
  }
  out += '"';
}

}  // namespace strata::io::json
