#pragma once

// A tiny JSON writer for --json and --metrics_json output.

#include <cstdint>
#include <string>
#include <vector>

namespace asyncckpt::cli {

/// Builds one JSON document; commas and escaping are handled here.
class JsonWriter {
 public:
  /// Opens an object.
  JsonWriter& begin_object();
  /// Closes the innermost object.
  JsonWriter& end_object();
  /// Opens an array.
  JsonWriter& begin_array();
  /// Closes the innermost array.
  JsonWriter& end_array();
  /// Writes a key inside an object; the next call writes its value.
  JsonWriter& key(const std::string& name);
  /// Writes a string value.
  JsonWriter& value(const std::string& text);
  /// Writes an integer value.
  JsonWriter& value(int64_t number);
  /// Writes an unsigned integer value.
  JsonWriter& value(uint64_t number);
  /// Writes a number (non-finite numbers become null).
  JsonWriter& value(double number);
  /// Writes a boolean.
  JsonWriter& value(bool flag);
  /// key + value.
  template <typename T>
  JsonWriter& field(const std::string& name, const T& v) {
    key(name);
    return value(v);
  }
  /// key + string value.
  JsonWriter& field(const std::string& name, const char* v) { return field(name, std::string(v)); }
  /// The document so far.
  const std::string& str() const { return out_; }

 private:
  void separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace asyncckpt::cli
