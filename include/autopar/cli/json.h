// A small streaming JSON writer: enough for the CLI's outputs, with correct string escaping and
// non-finite numbers written as null.
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace autopar::cli {

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}

  JsonWriter& BeginObject() { return Open('{'); }
  JsonWriter& EndObject() { return Close('}'); }
  JsonWriter& BeginArray() { return Open('['); }
  JsonWriter& EndArray() { return Close(']'); }

  JsonWriter& Key(const std::string& key) {
    Separate();
    WriteString(key);
    out_ << ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& String(const std::string& v) {
    Separate();
    WriteString(v);
    return *this;
  }
  JsonWriter& Number(double v) {
    Separate();
    if (std::isfinite(v)) {
      out_.precision(6);
      out_ << v;
    } else {
      out_ << "null";
    }
    return *this;
  }
  JsonWriter& Int(int64_t v) {
    Separate();
    out_ << v;
    return *this;
  }
  JsonWriter& Bool(bool v) {
    Separate();
    out_ << (v ? "true" : "false");
    return *this;
  }

  // Key + value in one call.
  template <class T>
  JsonWriter& Field(const std::string& key, const T& v) {
    Key(key);
    if constexpr (std::is_same_v<T, bool>) return Bool(v);
    else if constexpr (std::is_integral_v<T>) return Int(v);
    else if constexpr (std::is_floating_point_v<T>) return Number(v);
    else return String(v);
  }

 private:
  JsonWriter& Open(char c) {
    Separate();
    out_ << c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& Close(char c) {
    out_ << c;
    first_.pop_back();
    return *this;
  }
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ << ',';
      first_.back() = false;
    }
  }
  void WriteString(const std::string& s) {
    out_ << '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out_ << "\\\""; break;
        case '\\': out_ << "\\\\"; break;
        case '\n': out_ << "\\n"; break;
        case '\t': out_ << "\\t"; break;
        case '\r': out_ << "\\r"; break;
        default:
          if (c < 0x20) {
            static const char* hex = "0123456789abcdef";
            out_ << "\\u00" << hex[c >> 4] << hex[c & 15];
          } else {
            out_ << c;
          }
      }
    }
    out_ << '"';
  }

  std::ostream& out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace autopar::cli
