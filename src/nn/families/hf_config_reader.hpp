#pragma once
// Reads a config.json object field by field for a family file, remembering which fields
// were read or accepted, so that `finish` refuses every other one: nothing a family sets is
// silently ignored (docs/MODELS.md). Errors are InputErrors naming the file, the field
// (with its path inside nested objects) and the value.

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "kqlora/core/json.hpp"

namespace kqlora::impl {

/// A value as a message shows it.
std::string value_text(const json::Value& v);

class HfConfigReader {
 public:
  HfConfigReader(const json::Value& obj, std::string source, std::string prefix = "");

  /// The field, or null when absent or JSON null; marks it read.
  const json::Value* get(const char* key);
  bool has(const char* key) { return get(key) != nullptr; }
  /// Whether the field is there at all (JSON null included); marks it read.
  bool present(const char* key);
  [[noreturn]] void fail(const char* key, const std::string& what) const;

  int64_t integer(const char* key, int64_t fallback, bool required, int64_t min = 1);
  double number(const char* key, double fallback, bool required);
  bool boolean(const char* key, bool fallback);
  std::string string(const char* key, const std::string& fallback, bool required);
  /// An array of numbers (null or absent: empty).
  std::vector<double> numbers(const char* key);
  /// An array of strings (null or absent: empty).
  std::vector<std::string> strings(const char* key);
  /// A nested object's reader (the field must be an object); its fields are checked by its
  /// own finish().
  HfConfigReader object(const char* key);

  /// Fields that do not change the computation (token ids, dtype, ...): accepted as they are.
  void accept(std::initializer_list<const char*> keys);
  /// A field that must be absent, null or equal to `neutral` (a number or boolean whose
  /// value kqlora implements); anything else refused with `why`.
  void require_neutral(const char* key, double neutral, const std::string& why);
  /// Refuses the first field neither read nor accepted (a JSON null is a field unset).
  void finish() const;

  const std::string& source() const { return source_; }

 private:
  const json::Value& obj_;
  std::string source_, prefix_;
  std::set<std::string> seen_;
};

/// The fields every PretrainedConfig writes that do not change a decoder's numbers.
void accept_common_fields(HfConfigReader& r);

}  // namespace kqlora::impl
