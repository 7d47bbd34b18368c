// The safetensors header and index, parsed by a small strict JSON reader of our own: the
// library takes no JSON dependency, and a header is hostile input, so every value is bounded.

#include "src/interop/safetensors_format.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <utility>

namespace asyncckpt::interop {
namespace {

constexpr int kMaxJsonDepth = 16;  // a header nests 3 levels; anything deeper is not one

struct JsonMember;

// A parsed JSON value. Numbers are non-negative integers only: a safetensors header and its
// index hold no others.
struct Json {
  enum class Kind { kNull, kBool, kInteger, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  uint64_t integer = 0;
  std::string text;
  std::vector<Json> items;
  // A named struct, not std::pair: pair of an incomplete type fails under clang with
  // libstdc++ 12, while vector of one is allowed.
  std::vector<JsonMember> members;  // in file order
};

// One key and its value in a JSON object.
struct JsonMember {
  std::string name;
  Json value;
};

// Reads one JSON document; errors say where.
class JsonReader {
 public:
  explicit JsonReader(std::string_view in) : in_(in) {}

  Result<Json> Document() {
    Json value;
    if (Status status = Value(&value, 0); !status.ok()) return status;
    SkipSpace();
    if (pos_ != in_.size()) return Error("unexpected text after the JSON value");
    return value;
  }

 private:
  Status Error(const std::string& what) const {
    return Status::InvalidArgument(what + " at byte " + std::to_string(pos_));
  }
  void SkipSpace() {
    while (pos_ < in_.size() &&
           (in_[pos_] == ' ' || in_[pos_] == '\t' || in_[pos_] == '\n' || in_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Take(char c) {
    SkipSpace();
    if (pos_ < in_.size() && in_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Literal(std::string_view word) {
    if (in_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  Status Value(Json* out, int depth) {
    if (depth > kMaxJsonDepth)
      return Error("JSON nested deeper than " + std::to_string(kMaxJsonDepth));
    SkipSpace();
    if (pos_ >= in_.size()) return Error("unexpected end of the JSON");
    const char c = in_[pos_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out->kind = Json::Kind::kString;
      return String(&out->text);
    }
    if (c >= '0' && c <= '9') return Integer(out);
    if (Literal("true") || Literal("false")) {
      out->kind = Json::Kind::kBool;
      out->boolean = c == 't';
      return Status::OK();
    }
    if (Literal("null")) return Status::OK();
    return Error(std::string("unexpected character '") + c +
                 "' (only non-negative integers, "
                 "strings, arrays, objects, true, false and null are expected)");
  }

  Status Integer(Json* out) {
    uint64_t value = 0;
    const size_t start = pos_;
    while (pos_ < in_.size() && in_[pos_] >= '0' && in_[pos_] <= '9') {
      const uint64_t digit = uint64_t(in_[pos_] - '0');
      if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
        return Error("an integer too large for 64 bits");
      }
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ - start > 1 && in_[start] == '0') return Error("an integer with a leading zero");
    if (pos_ < in_.size() && (in_[pos_] == '.' || in_[pos_] == 'e' || in_[pos_] == 'E')) {
      return Error("a fraction or exponent where an integer was expected");
    }
    out->kind = Json::Kind::kInteger;
    out->integer = value;
    return Status::OK();
  }

  Status Hex4(uint32_t* out) {
    if (pos_ + 4 > in_.size()) return Error("a truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = in_[pos_++];
      value <<= 4;
      if (h >= '0' && h <= '9')
        value |= uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f')
        value |= uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        value |= uint32_t(h - 'A' + 10);
      else
        return Error("a bad \\u escape");
    }
    *out = value;
    return Status::OK();
  }

  static void AppendUtf8(uint32_t code, std::string* out) {
    if (code < 0x80) {
      out->push_back(char(code));
    } else if (code < 0x800) {
      out->push_back(char(0xC0 | (code >> 6)));
      out->push_back(char(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out->push_back(char(0xE0 | (code >> 12)));
      out->push_back(char(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(char(0x80 | (code & 0x3F)));
    } else {
      out->push_back(char(0xF0 | (code >> 18)));
      out->push_back(char(0x80 | ((code >> 12) & 0x3F)));
      out->push_back(char(0x80 | ((code >> 6) & 0x3F)));
      out->push_back(char(0x80 | (code & 0x3F)));
    }
  }

  Status Escape(std::string* out) {
    if (pos_ >= in_.size()) return Error("a truncated escape");
    const char e = in_[pos_++];
    switch (e) {
      case '"':
      case '\\':
      case '/':
        out->push_back(e);
        return Status::OK();
      case 'b':
        out->push_back('\b');
        return Status::OK();
      case 'f':
        out->push_back('\f');
        return Status::OK();
      case 'n':
        out->push_back('\n');
        return Status::OK();
      case 'r':
        out->push_back('\r');
        return Status::OK();
      case 't':
        out->push_back('\t');
        return Status::OK();
      case 'u':
        break;
      default:
        return Error(std::string("a bad escape '\\") + e + "'");
    }
    uint32_t code = 0;
    if (Status status = Hex4(&code); !status.ok()) return status;
    if (code >= 0xD800 && code < 0xDC00) {
      uint32_t low = 0;
      if (!Literal("\\u")) return Error("a lone high surrogate");
      if (Status status = Hex4(&low); !status.ok()) return status;
      if (low < 0xDC00 || low >= 0xE000) return Error("a bad low surrogate");
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    } else if (code >= 0xDC00 && code < 0xE000) {
      return Error("a lone low surrogate");
    }
    AppendUtf8(code, out);
    return Status::OK();
  }

  Status String(std::string* out) {
    ++pos_;  // the opening quote
    while (pos_ < in_.size()) {
      const char c = in_[pos_++];
      if (c == '"') return Status::OK();
      if (static_cast<unsigned char>(c) < 0x20) return Error("a control character in a string");
      if (c != '\\') {
        out->push_back(c);
      } else if (Status status = Escape(out); !status.ok()) {
        return status;
      }
    }
    return Error("an unterminated string");
  }

  Status Array(Json* out, int depth) {
    ++pos_;
    out->kind = Json::Kind::kArray;
    if (Take(']')) return Status::OK();
    do {
      Json item;
      if (Status status = Value(&item, depth + 1); !status.ok()) return status;
      out->items.push_back(std::move(item));
    } while (Take(','));
    return Take(']') ? Status::OK() : Error("an array without its ']'");
  }

  Status Object(Json* out, int depth) {
    ++pos_;
    out->kind = Json::Kind::kObject;
    if (Take('}')) return Status::OK();
    do {
      SkipSpace();
      if (pos_ >= in_.size() || in_[pos_] != '"') return Error("an object key that is no string");
      std::string key;
      if (Status status = String(&key); !status.ok()) return status;
      for (const auto& [existing, unused] : out->members) {
        if (existing == key) return Error("the key \"" + key + "\" twice in one object");
      }
      if (!Take(':')) return Error("a key without its ':'");
      Json value;
      if (Status status = Value(&value, depth + 1); !status.ok()) return status;
      out->members.push_back(JsonMember{std::move(key), std::move(value)});
    } while (Take(','));
    return Take('}') ? Status::OK() : Error("an object without its '}'");
  }

  std::string_view in_;
  size_t pos_ = 0;
};

const Json* Member(const Json& object, std::string_view key) {
  for (const auto& [name, value] : object.members) {
    if (name == key) return &value;
  }
  return nullptr;
}

void AppendJsonString(std::string_view text, std::string* out) {
  out->push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
          *out += escaped;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

struct DTypeName {
  DType dtype;
  std::string_view name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::kF64, "F64"},   {DType::kF32, "F32"},        {DType::kF16, "F16"},
    {DType::kBF16, "BF16"}, {DType::kF8E4M3, "F8_E4M3"}, {DType::kF8E5M2, "F8_E5M2"},
    {DType::kI8, "I8"},     {DType::kI16, "I16"},        {DType::kI32, "I32"},
    {DType::kI64, "I64"},   {DType::kU8, "U8"},          {DType::kU16, "U16"},
    {DType::kU32, "U32"},   {DType::kU64, "U64"},        {DType::kBool, "BOOL"},
};

// One tensor entry of a header, checked on its own.
Status ParseTensor(const std::string& name, const Json& entry, SafetensorsTensor* out) {
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("tensor \"" + name + "\": " + what);
  };
  if (entry.kind != Json::Kind::kObject) return bad("its entry is not an object");
  const Json* dtype = Member(entry, "dtype");
  const Json* shape = Member(entry, "shape");
  const Json* offsets = Member(entry, "data_offsets");
  if (dtype == nullptr || dtype->kind != Json::Kind::kString) return bad("no \"dtype\" string");
  if (shape == nullptr || shape->kind != Json::Kind::kArray) return bad("no \"shape\" array");
  if (offsets == nullptr || offsets->kind != Json::Kind::kArray || offsets->items.size() != 2 ||
      offsets->items[0].kind != Json::Kind::kInteger ||
      offsets->items[1].kind != Json::Kind::kInteger) {
    return bad("no \"data_offsets\" pair of integers");
  }
  std::optional<DType> parsed = SafetensorsDType(dtype->text);
  if (!parsed) return bad("dtype \"" + dtype->text + "\" is not one asyncckpt can hold");
  out->name = name;
  out->dtype = *parsed;
  uint64_t elements = 1;
  for (const Json& dim : shape->items) {
    if (dim.kind != Json::Kind::kInteger || dim.integer > uint64_t(INT64_MAX)) {
      return bad("a shape entry that is not a non-negative integer");
    }
    if (dim.integer != 0 && elements > std::numeric_limits<uint64_t>::max() / dim.integer) {
      return bad("a shape whose size overflows 64 bits");
    }
    elements *= dim.integer;
    out->shape.push_back(int64_t(dim.integer));
  }
  out->begin = offsets->items[0].integer;
  out->end = offsets->items[1].integer;
  if (out->end < out->begin) return bad("data_offsets end before they begin");
  const uint64_t element = DTypeSize(*parsed);
  if (elements > std::numeric_limits<uint64_t>::max() / element ||
      elements * element != out->end - out->begin) {
    return bad("data_offsets [" + std::to_string(out->begin) + ", " + std::to_string(out->end) +
               ") hold " + std::to_string(out->end - out->begin) + " bytes, its shape and dtype " +
               "need " + std::to_string(elements) + " x " + std::to_string(element));
  }
  return Status::OK();
}

// The tensors must tile [0, data_bytes): sorted by begin, each beginning where the one before
// ends (empty tensors anywhere within).
Status CheckTiling(std::vector<SafetensorsTensor>& tensors, uint64_t data_bytes) {
  std::stable_sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const SafetensorsTensor* last = nullptr;
  for (const SafetensorsTensor& t : tensors) {
    if (t.begin > covered) {
      return Status::InvalidArgument("no tensor covers data bytes [" + std::to_string(covered) +
                                     ", " + std::to_string(t.begin) + ") (before \"" + t.name +
                                     "\")");
    }
    if (t.begin < covered && t.end > t.begin) {
      return Status::InvalidArgument("tensors \"" + (last ? last->name : std::string()) +
                                     "\" and \"" + t.name + "\" overlap at data byte " +
                                     std::to_string(t.begin));
    }
    if (t.end > data_bytes) {
      return Status::InvalidArgument("tensor \"" + t.name + "\" ends at data byte " +
                                     std::to_string(t.end) + ", past the file's " +
                                     std::to_string(data_bytes) + " bytes of data");
    }
    covered = std::max(covered, t.end);
    if (t.end > t.begin) last = &t;
  }
  if (covered != data_bytes) {
    return Status::InvalidArgument("no tensor covers data bytes [" + std::to_string(covered) +
                                   ", " + std::to_string(data_bytes) + ") at the end of the file");
  }
  return Status::OK();
}

}  // namespace

std::string_view SafetensorsDTypeName(DType dtype) {
  for (const DTypeName& entry : kDTypeNames) {
    if (entry.dtype == dtype) return entry.name;
  }
  return "?";
}

std::optional<DType> SafetensorsDType(std::string_view name) {
  for (const DTypeName& entry : kDTypeNames) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json, uint64_t data_bytes,
                                                 std::string_view file) {
  const std::string where(file);
  Result<Json> parsed = JsonReader(json).Document();
  if (!parsed.ok()) {
    return Status::InvalidArgument(where +
                                   ": the header is not valid JSON: " + parsed.status().message());
  }
  if (parsed->kind != Json::Kind::kObject) {
    return Status::InvalidArgument(where + ": the header is not a JSON object");
  }
  SafetensorsHeader header;
  for (const auto& [name, entry] : parsed->members) {
    if (name == "__metadata__") {
      if (entry.kind != Json::Kind::kObject) {
        return Status::InvalidArgument(where + ": \"__metadata__\" is not an object");
      }
      for (const auto& [key, value] : entry.members) {
        if (value.kind != Json::Kind::kString) {
          return Status::InvalidArgument(where + ": \"__metadata__\" value of \"" + key +
                                         "\" is not a string");
        }
        header.metadata[key] = value.text;
      }
      continue;
    }
    SafetensorsTensor tensor;
    if (Status status = ParseTensor(name, entry, &tensor); !status.ok()) {
      return status.WithContext(where);
    }
    header.tensors.push_back(std::move(tensor));
  }
  if (Status status = CheckTiling(header.tensors, data_bytes); !status.ok()) {
    return status.WithContext(where);
  }
  return header;
}

std::string EncodeSafetensorsHeader(const std::vector<SafetensorsTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata) {
  std::string out = "{";
  bool first = true;
  if (!metadata.empty()) {
    out += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      if (!first) out += ",";
      first = false;
      AppendJsonString(key, &out);
      out += ":";
      AppendJsonString(value, &out);
    }
    out += "}";
    first = false;
  }
  for (const SafetensorsTensor& t : tensors) {
    if (!first) out += ",";
    first = false;
    AppendJsonString(t.name, &out);
    out += ":{\"dtype\":\"" + std::string(SafetensorsDTypeName(t.dtype)) + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) out += ",";
      out += std::to_string(t.shape[i]);
    }
    out += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  out += "}";
  out.append((8 - out.size() % 8) % 8, ' ');
  return out;
}

Result<std::map<std::string, std::string>> ParseSafetensorsIndex(std::string_view json,
                                                                 std::string_view file) {
  const std::string where(file);
  Result<Json> parsed = JsonReader(json).Document();
  if (!parsed.ok()) {
    return Status::InvalidArgument(where + ": not valid JSON: " + parsed.status().message());
  }
  const Json* map = parsed->kind == Json::Kind::kObject ? Member(*parsed, "weight_map") : nullptr;
  if (map == nullptr || map->kind != Json::Kind::kObject) {
    return Status::InvalidArgument(where + ": no \"weight_map\" object");
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, value] : map->members) {
    if (value.kind != Json::Kind::kString || value.text.empty() ||
        value.text.find('/') != std::string::npos || value.text == "." || value.text == "..") {
      return Status::InvalidArgument(where + ": tensor \"" + name +
                                     "\" maps to no plain file name beside the index");
    }
    weight_map[name] = value.text;
  }
  return weight_map;
}

std::string EncodeSafetensorsIndex(const std::map<std::string, std::string>& weight_map,
                                   uint64_t total_size) {
  std::string out = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_size) +
                    "\n  },\n  \"weight_map\": {";
  bool first = true;
  for (const auto& [name, file] : weight_map) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    AppendJsonString(name, &out);
    out += ": ";
    AppendJsonString(file, &out);
  }
  out += "\n  }\n}\n";
  return out;
}

}  // namespace asyncckpt::interop
