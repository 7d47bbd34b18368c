#include "src/cli/flags.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace asyncckpt::cli {

namespace {

const FlagSpec* FindSpec(const std::vector<FlagSpec>& specs, const std::string& name) {
  for (const auto& spec : specs) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

Status BadValue(const std::string& name, const std::string& value, const std::string& expected) {
  return Status::InvalidArgument("bad value for --" + name + ": '" + value + "' is not " +
                                 expected);
}

// A decimal number as people write it ("2.5", "1e3", "-1"): no hexadecimal ("0x10"), no "inf"
// or "nan", no leading space, all of `text`; strtod would take each of those.
std::optional<double> ParseDecimal(std::string_view text) {
  double value = 0;
  const auto [end, err] =
      std::from_chars(text.data(), text.data() + text.size(), value, std::chars_format::general);
  if (text.empty() || err != std::errc() || end != text.data() + text.size() ||
      !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

std::string ParsedFlags::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end()) return it->second;
  auto def = defaults_.find(name);
  return def == defaults_.end() ? std::string() : def->second;
}

Result<int64_t> ParsedFlags::get_int(const std::string& name) const {
  const std::string text = get(name);
  int64_t value = 0;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || err != std::errc() || end != text.data() + text.size()) {
    return BadValue(name, text, "an integer");
  }
  return value;
}

Result<double> ParsedFlags::get_double(const std::string& name) const {
  const std::optional<double> value = ParseDecimal(get(name));
  if (!value) return BadValue(name, get(name), "a decimal number");
  return *value;
}

Result<bool> ParsedFlags::get_bool(const std::string& name) const {
  const std::string text = get(name);
  if (text == "true" || text == "yes" || text == "1") return true;
  if (text == "false" || text == "no" || text == "0") return false;
  return BadValue(name, text, "true or false");
}

Result<uint64_t> ParsedFlags::get_bytes(const std::string& name) const {
  auto bytes = ParseByteSize(get(name));
  if (!bytes.ok()) return BadValue(name, get(name), "a byte size such as 512MiB or 4GiB");
  return bytes;
}

Result<ParsedFlags> ParseFlags(const std::vector<FlagSpec>& specs, int argc, char** argv) {
  ParsedFlags flags;
  for (const auto& spec : specs) flags.defaults_[spec.name] = spec.default_value;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return Status::Cancelled("help requested");
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      flags.positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* spec = FindSpec(specs, name);
    if (spec == nullptr) return Status::InvalidArgument("unknown flag --" + name);
    if (flags.values_.count(name)) return Status::InvalidArgument("--" + name + " given twice");
    if (spec->is_switch) {
      if (value) return Status::InvalidArgument("--" + name + " takes no value");
      flags.values_[name] = "true";
      continue;
    }
    if (!value) {
      if (i + 1 >= argc) return Status::InvalidArgument("--" + name + " needs a value");
      value = argv[++i];
    }
    flags.values_[name] = *value;
  }
  return flags;
}

std::string FlagsHelp(const std::string& usage, const std::vector<FlagSpec>& specs) {
  std::string text = "usage: " + usage + "\n";
  if (!specs.empty()) text += "\nflags:\n";
  for (const auto& spec : specs) {
    std::string left = "  --" + spec.name + (spec.is_switch ? "" : " VALUE");
    if (left.size() < 26) left.resize(26, ' ');
    text += left + " " + spec.help;
    if (!spec.default_value.empty()) text += " (default: " + spec.default_value + ")";
    text += "\n";
  }
  return text;
}

Result<uint64_t> ParseByteSize(const std::string& text) {
  // The number is the leading digits, point, exponent and sign (no unit begins with any of
  // them); the rest is the unit.
  const size_t unit_at = text.find_first_not_of("0123456789.eE+-");
  const std::optional<double> parsed = ParseDecimal(std::string_view(text).substr(0, unit_at));
  if (!parsed || *parsed < 0) {
    return Status::InvalidArgument("'" + text + "' is not a byte size");
  }
  const double number = *parsed;
  std::string unit(unit_at == std::string::npos ? std::string() : text.substr(unit_at));
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "k" || unit == "kib")
    scale = 1024.0;
  else if (unit == "m" || unit == "mib")
    scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  if (scale == 0) return Status::InvalidArgument("'" + text + "' has an unknown unit");
  const double bytes = number * scale;
  if (bytes > 1.8e19) return Status::InvalidArgument("'" + text + "' is too large");
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return buffer;
}

}  // namespace asyncckpt::cli
