#pragma once
// A small JSON reader (RFC 8259) for safetensors headers, index files and config.json,
// and the writer that gives an edited config.json back. Objects keep
// their key order; duplicate keys are an error (a header must not name a tensor twice).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kqlora::json {

struct Value {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0.0;
  bool is_integer = false;  // the literal had no fraction or exponent and fits int64
  int64_t integer = 0;
  std::string string;
  std::vector<Value> array;
  std::vector<std::pair<std::string, Value>> object;

  const Value* find(const std::string& key) const;
  const char* kind_name() const;
};

/// Parses `text`; throws InputError "<where>: JSON error at line L, column C: ...".
Value parse(const std::string& text, const std::string& where);

/// Serialises a string with JSON escapes (quotes included).
std::string quote(const std::string& s);

/// Serialises `v` (objects in their key order, two-space indents; numbers as the integer
/// literal they were or the shortest decimal that reads back as the same double).
std::string write(const Value& v);

}  // namespace kqlora::json
