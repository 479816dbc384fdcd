// A pull reader for the JSON subset of safetensors headers, and the string writer. Every
// read is bounds-checked against the text; nothing recurses, so no input can exhaust the stack.
#include "io/json.h"

namespace strata::io::json {
namespace {

std::string printable(char c) {
  auto u = static_cast<unsigned char>(c);
  return u >= 0x20 && u < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", u);
}

void append_utf8(std::string& out, uint32_t cp) {
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

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Object: return "an object";
    case Kind::Array: return "an array";
    case Kind::String: return "a string";
    case Kind::Integer: return "an integer";
    case Kind::Null: return "null";
  }
  return "?";
}

void Reader::skip_ws() {
  while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
}

void Reader::expect(char c) {
  if (at_end()) fail("expected '{}' but the header ended", c);
  if (peek() != c) fail("expected '{}' but found '{}'", c, printable(peek()));
  ++pos_;
}

Kind Reader::next_kind() {
  skip_ws();
  if (at_end()) fail("expected a value but the header ended");
  char c = peek();
  if (c == '{') return Kind::Object;
  if (c == '[') return Kind::Array;
  if (c == '"') return Kind::String;
  if (c >= '0' && c <= '9') return Kind::Integer;
  if (c == '-') fail("negative numbers are not allowed");
  if (c == 'n') return Kind::Null;
  if (c == 't' || c == 'f') fail("true and false are not allowed");
  fail("unexpected '{}'", printable(c));
}

void Reader::null() {
  skip_ws();
  if (s_.substr(pos_, 4) != "null") fail("expected null");
  pos_ += 4;
}

bool Reader::next_item(char close, const char* unterminated, bool first) {
  skip_ws();
  if (first) {
    if (!at_end() && peek() == close) {
      ++pos_;
      return false;
    }
    return true;
  }
  if (at_end()) fail("{}", unterminated);
  if (peek() == ',') {
    ++pos_;
    return true;
  }
  expect(close);
  return false;
}

bool Reader::next_member(std::string& key, bool first) {
  if (!next_item('}', "unterminated object", first)) return false;
  skip_ws();
  if (at_end() || peek() != '"') fail("expected a string key");
  key_pos_ = pos_;
  key = string();
  skip_ws();
  expect(':');
  return true;
}

bool Reader::next_element(bool first) { return next_item(']', "unterminated array", first); }

void Reader::end() {
  skip_ws();
  if (!at_end()) fail("unexpected '{}' after the end of the JSON value", printable(peek()));
}

uint64_t Reader::integer() {
  skip_ws();
  size_t start = pos_;
  uint64_t v = 0;
  while (!at_end() && peek() >= '0' && peek() <= '9') {
    auto digit = static_cast<uint64_t>(peek() - '0');
    if (v > (UINT64_MAX - digit) / 10) fail("integer does not fit in 64 bits");
    v = v * 10 + digit;
    ++pos_;
  }
  if (pos_ == start) fail("expected an integer");
  if (pos_ - start > 1 && s_[start] == '0') fail_at(start, "integer with a leading zero");
  if (!at_end() && (peek() == '.' || peek() == 'e' || peek() == 'E'))
    fail("only non-negative integers are allowed, not fractions or exponents");
  return v;
}

unsigned Reader::hex4() {
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

// The text was validated as UTF-8 before parsing, so raw bytes are copied as they are.
std::string Reader::string() {
  std::string out;
  skip_ws();
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
      // the run up to the next quote, escape or control character in one append
      size_t run = pos_;
      while (run < s_.size() && s_[run] != '"' && s_[run] != '\\' && static_cast<unsigned char>(s_[run]) >= 0x20) ++run;
      out.append(s_.substr(pos_, run - pos_));
      pos_ = run;
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
