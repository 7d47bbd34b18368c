#pragma once

// Command-line flags for the asyncckpt CLI (the only place that parses flags).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/status.h"

namespace asyncckpt::cli {

/// One flag a command accepts.
struct FlagSpec {
  /// Name without dashes, e.g. "save_steps".
  std::string name;
  /// Default shown in --help ("" for none).
  std::string default_value;
  /// One line of help.
  std::string help;
  /// True for a switch that takes no value (--json).
  bool is_switch = false;
};

/// The flags and positional arguments given to one command.
class ParsedFlags {
 public:
  /// True when the flag was given on the command line.
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  /// The given value or the spec's default.
  std::string get(const std::string& name) const;
  /// The value as an integer; InvalidArgument naming the flag when it is not one.
  Result<int64_t> get_int(const std::string& name) const;
  /// The value as a number.
  Result<double> get_double(const std::string& name) const;
  /// The value as a byte size ("512MiB", "4GiB", "1.5GB", "4096").
  Result<uint64_t> get_bytes(const std::string& name) const;
  /// The value as a boolean: true/false, yes/no, 1/0; InvalidArgument naming the flag otherwise.
  Result<bool> get_bool(const std::string& name) const;
  /// True when a switch was given.
  bool get_switch(const std::string& name) const { return has(name); }
  /// Arguments that are not flags, in order.
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  friend Result<ParsedFlags> ParseFlags(const std::vector<FlagSpec>&, int, char**);
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> defaults_;
  std::vector<std::string> positional_;
};

/// Parses `--name=value`, `--name value` and switches; an unknown flag, a missing value or a
/// repeated flag is InvalidArgument naming it. "--help" is reported as kCancelled.
Result<ParsedFlags> ParseFlags(const std::vector<FlagSpec>& specs, int argc, char** argv);

/// The --help text of a command: usage line, then one line per flag.
std::string FlagsHelp(const std::string& usage, const std::vector<FlagSpec>& specs);

/// Parses a byte size such as "512MiB", "4GiB", "1.5GB", "64k" or "4096".
Result<uint64_t> ParseByteSize(const std::string& text);

/// "512.0 MiB"-style rendering of a byte count.
std::string FormatBytes(double bytes);

}  // namespace asyncckpt::cli
