// The small JSON subset a safetensors header uses: objects, arrays, strings (every escape,
// \uXXXX and surrogate pairs included) and non-negative integers. Anything else (numbers
// with a sign, fraction or exponent, true, false, null) is rejected with a clear message.
// Also strict UTF-8 validation and the string escaping serde_json applies when writing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::io::json {

struct Member;

struct Value {
  enum class Kind { Object, Array, String, Integer };
  Kind kind = Kind::Object;
  std::string string;
  uint64_t integer = 0;
  std::vector<Value> array;
  std::vector<Member> object;  // document order; keys are unique
};

struct Member {
  std::string key;
  Value value;
};

const char* kind_name(Value::Kind kind);

/// Parses one JSON value filling `text` (surrounding JSON whitespace allowed). Raises
/// strata::Error "[safetensors] header: <problem> at byte <k>" on anything outside the
/// subset, on duplicate object keys and on nesting deeper than a header needs.
Value parse(std::string_view text);

/// Byte offset of the first invalid UTF-8 sequence (overlong forms, surrogates and code
/// points past U+10FFFF are invalid), or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

/// Appends `s` as a quoted JSON string, escaped as serde_json does: \" \\ \b \f \n \r \t,
/// other control characters as \u00xx, everything else (UTF-8 included) as is.
void append_string(std::string& out, std::string_view s);

}  // namespace strata::io::json
