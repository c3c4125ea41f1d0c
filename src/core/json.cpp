#include "kqlora/core/json.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "kqlora/core/error.hpp"

namespace kqlora::json {

const Value* Value::find(const std::string& key) const {
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

const char* Value::kind_name() const {
  switch (kind) {
    case Kind::null:
      return "null";
    case Kind::boolean:
      return "a boolean";
    case Kind::number:
      return "a number";
    case Kind::string:
      return "a string";
    case Kind::array:
      return "an array";
    default:
      return "an object";
  }
}

namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::string& where) : s_(text), where_(where) {}

  Value document() {
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected trailing characters");
    return v;
  }

 private:
  const std::string& s_;
  const std::string& where_;
  size_t pos_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    KQLORA_INPUT_CHECK(
        false, where_ << ": JSON error at line " << line << ", column " << col << ": " << what);
  }

  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of text");
    return s_[pos_];
  }

  void expect(const char* word) {
    for (const char* c = word; *c; ++c, ++pos_)
      if (pos_ >= s_.size() || s_[pos_] != *c) fail(std::string("expected '") + word + "'");
  }

  Value value(int depth) {
    if (depth > 64) fail("nesting deeper than 64 levels");
    Value v;
    const char c = peek();
    if (c == '{') {
      v.kind = Value::Kind::object;
      ++pos_;
      std::set<std::string> keys;
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      for (;;) {
        if (peek() != '"') fail("expected a string key");
        std::string key = string();
        if (!keys.insert(key).second) fail("duplicate key '" + key + "'");
        if (peek() != ':') fail("expected ':'");
        ++pos_;
        v.object.emplace_back(std::move(key), value(depth + 1));
        const char d = peek();
        ++pos_;
        if (d == '}') break;
        if (d != ',') fail("expected ',' or '}'");
      }
    } else if (c == '[') {
      v.kind = Value::Kind::array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      for (;;) {
        v.array.push_back(value(depth + 1));
        const char d = peek();
        ++pos_;
        if (d == ']') break;
        if (d != ',') fail("expected ',' or ']'");
      }
    } else if (c == '"') {
      v.kind = Value::Kind::string;
      v.string = string();
    } else if (c == 't') {
      expect("true");
      v.kind = Value::Kind::boolean;
      v.boolean = true;
    } else if (c == 'f') {
      expect("false");
      v.kind = Value::Kind::boolean;
    } else if (c == 'n') {
      expect("null");
    } else {
      number(v);
    }
    return v;
  }

  void number(Value& v) {
    const size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    const size_t digits = pos_;
    while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == digits) fail("expected a value");
    if (s_[digits] == '0' && pos_ - digits > 1) fail("leading zero in a number");
    bool integer = true;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      integer = false;
      ++pos_;
      const size_t f = pos_;
      while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (pos_ == f) fail("expected digits after '.'");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      integer = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      const size_t e = pos_;
      while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (pos_ == e) fail("expected digits in the exponent");
    }
    const std::string lit = s_.substr(start, pos_ - start);
    v.kind = Value::Kind::number;
    v.number = std::strtod(lit.c_str(), nullptr);
    // A number beyond double's range would read back as infinity (and no JSON holds one).
    if (!std::isfinite(v.number)) fail("number " + lit.substr(0, 40) + " is out of range");
    if (integer && pos_ - digits <= 18) {  // fits int64 without overflow
      v.is_integer = true;
      v.integer = std::strtoll(lit.c_str(), nullptr, 10);
    }
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = s_[pos_++];
      u <<= 4;
      if (h >= '0' && h <= '9')
        u |= h - '0';
      else if (h >= 'a' && h <= 'f')
        u |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F')
        u |= h - 'A' + 10;
      else
        fail("bad hex digit in \\u escape");
    }
    return u;
  }

  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xd800 && cp < 0xdc00) {
            if (pos_ + 2 > s_.size() || s_[pos_] != '\\' || s_[pos_ + 1] != 'u')
              fail("unpaired surrogate");
            pos_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xdc00 || lo >= 0xe000) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            fail("unpaired surrogate");
          }
          utf8(out, cp);
          break;
        }
        default:
          fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }
};

}  // namespace

Value parse(const std::string& text, const std::string& where) {
  return Parser(text, where).document();
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

namespace {

std::string number_text(const Value& v) {
  if (v.is_integer) return std::to_string(v.integer);
  KQLORA_INPUT_CHECK(std::isfinite(v.number), "JSON cannot hold the number " << v.number);
  for (int p = 1; p <= 17; ++p) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", p, v.number);
    if (std::strtod(buf, nullptr) == v.number) {
      std::string t = buf;
      // (a fraction or exponent keeps it a float for readers that tell them apart)
      if (t.find_first_of(".eE") == std::string::npos) t += ".0";
      return t;
    }
  }
  return std::to_string(v.number);
}

void write_to(const Value& v, int depth, std::string& out);

/// An array's or an object's items, one per line, indented one level deeper than `depth`.
template <class Items, class WriteItem>
void write_items(const Items& items, const char* brackets, int depth, std::string& out,
                 WriteItem&& write_item) {
  if (items.empty()) {
    out += brackets;
    return;
  }
  out += brackets[0];
  out += '\n';
  for (size_t i = 0; i < items.size(); ++i) {
    out += std::string(static_cast<size_t>(2 * (depth + 1)), ' ');
    write_item(items[i]);
    out += i + 1 < items.size() ? ",\n" : "\n";
  }
  out += std::string(static_cast<size_t>(2 * depth), ' ') + brackets[1];
}

void write_to(const Value& v, int depth, std::string& out) {
  switch (v.kind) {
    case Value::Kind::null:
      out += "null";
      break;
    case Value::Kind::boolean:
      out += v.boolean ? "true" : "false";
      break;
    case Value::Kind::number:
      out += number_text(v);
      break;
    case Value::Kind::string:
      out += quote(v.string);
      break;
    case Value::Kind::array:
      write_items(v.array, "[]", depth, out, [&](const Value& x) { write_to(x, depth + 1, out); });
      break;
    case Value::Kind::object:
      write_items(v.object, "{}", depth, out, [&](const std::pair<std::string, Value>& kv) {
        out += quote(kv.first) + ": ";
        write_to(kv.second, depth + 1, out);
      });
      break;
  }
}

}  // namespace

std::string write(const Value& v) {
  std::string out;
  write_to(v, 0, out);
  return out + "\n";
}

}  // namespace kqlora::json
