// The small JSON subset a safetensors header uses: objects, arrays, strings (every escape,
// \uXXXX and surrogate pairs included), non-negative integers and null (which the reference
// reader takes for an absent __metadata__). Anything else (numbers with a sign, fraction or
// exponent, true, false) is rejected with a clear message.
// Also strict UTF-8 validation and the string escaping serde_json applies when writing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <strata/core/error.hpp>

namespace strata::io::json {

enum class Kind { Object, Array, String, Integer, Null };

const char* kind_name(Kind kind);

/// A pull reader: the caller walks the document in the order its schema expects, so a
/// header becomes its entries directly, without a tree of values in between (a tree costs
/// tens of bytes per input byte, and a hostile 100 MB header could take gigabytes). Every
/// syntax problem raises strata::Error "[safetensors] header: <problem> at byte <k>".
class Reader {
 public:
  explicit Reader(std::string_view text) : s_(text) {}

  /// The kind of the next value, after whitespace; raises on anything outside the subset.
  Kind next_kind();
  /// Steps into an object or array (after whitespace).
  void begin_object() { skip_ws(), expect('{'); }
  void begin_array() { skip_ws(), expect('['); }
  /// The next member's key, its ':' consumed, or false at the object's '}' (consumed).
  /// `first` is true for the first call after begin_object.
  bool next_member(std::string& key, bool first);
  /// True when another array element follows (positioned at it), false at ']' (consumed).
  bool next_element(bool first);
  std::string string();
  uint64_t integer();
  /// Consumes the literal null.
  void null();
  /// Only whitespace may follow the document's value.
  void end();

  /// Where the key of the last next_member began, for messages about that key.
  size_t key_position() const { return key_pos_; }

  template <class... Args>
  [[noreturn]] void fail_at(size_t pos, fmt::format_string<Args...> format, Args&&... args) const {
    throw Error(
        fmt::format("[safetensors] header: {} at byte {}", fmt::format(format, std::forward<Args>(args)...), pos));
  }
  template <class... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    fail_at(pos_, format, std::forward<Args>(args)...);
  }

 private:
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }
  void skip_ws();
  void expect(char c);
  unsigned hex4();
  bool next_item(char close, const char* unterminated, bool first);

  std::string_view s_;
  size_t pos_ = 0;
  size_t key_pos_ = 0;
};

/// Byte offset of the first invalid UTF-8 sequence (overlong forms, surrogates and code
/// points past U+10FFFF are invalid), or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

/// Appends `s` as a quoted JSON string, escaped as serde_json does: \" \\ \b \f \n \r \t,
/// other control characters as \u00xx, everything else (UTF-8 included) as is.
void append_string(std::string& out, std::string_view s);

}  // namespace strata::io::json
