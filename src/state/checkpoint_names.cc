// Names and paths of the entries of a checkpoint directory (see checkpoint_names.h).

#include "src/state/checkpoint_names.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <random>
#include <system_error>

namespace asyncckpt {
namespace {

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

std::string RandomHex16() {
  std::random_device device;
  const uint64_t value = (uint64_t{device()} << 32) ^ uint64_t { device() };
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx", static_cast<unsigned long long>(value));
  return std::string(buffer, 16);
}

}  // namespace

namespace state_internal {

bool AllOf(std::string_view s, bool (*pred)(char)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), pred);
}

bool IsDecimalDigit(char c) { return c >= '0' && c <= '9'; }

bool IsMarkedOf(std::string_view name, std::string_view prefix, std::string_view infix) {
  if (name.size() <= prefix.size() + infix.size()) return false;
  if (name.substr(0, prefix.size()) != prefix) return false;
  name.remove_prefix(prefix.size());
  if (name.substr(0, infix.size()) != infix) return false;
  return AllOf(name.substr(infix.size()), IsHexDigit);
}

std::string NameProblem(std::string_view name) {
  if (name.empty()) return "empty checkpoint name";
  if (name.find('/') != std::string_view::npos) return "checkpoint name contains '/'";
  if (name.find("..") != std::string_view::npos || name == ".") {
    return "checkpoint name contains '..' or is '.'";
  }
  for (char c : name) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f || c == '"' || c == '\\') {
      return "checkpoint name contains a control byte, '\"' or '\\'";
    }
  }
  return {};
}

}  // namespace state_internal

using state_internal::AllOf;
using state_internal::IsDecimalDigit;
using state_internal::kCorruptInfix;
using state_internal::kDeletingInfix;
using state_internal::kTmpInfix;
using state_internal::NameProblem;

Status ValidateCheckpointName(std::string_view name) {
  const std::string problem = NameProblem(name);
  if (problem.empty()) return Status::OK();
  return Status::InvalidArgument(problem + ": " + QuoteForMessage(name));
}

std::string QuoteForMessage(std::string_view text) {
  constexpr size_t kMax = 200;
  std::string quoted = "'";
  for (size_t i = 0; i < text.size() && i < kMax; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f && byte != '\'' && byte != '\\') {
      quoted.push_back(static_cast<char>(byte));
      continue;
    }
    char escaped[5];
    std::snprintf(escaped, sizeof(escaped), "\\x%02x", byte);
    quoted += escaped;
  }
  quoted.push_back('\'');
  if (text.size() > kMax) quoted += "... (" + std::to_string(text.size()) + " bytes)";
  return quoted;
}

std::string JoinCheckpointPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

std::string TempDirName(const std::string& final_name) {
  return final_name + std::string(kTmpInfix) + RandomHex16();
}

std::string QuarantineDirName(const std::string& name) {
  return name + std::string(kCorruptInfix) + RandomHex16();
}

bool IsQuarantinedCheckpoint(std::string_view name, std::string_view basename) {
  const size_t at = name.rfind(kCorruptInfix);
  if (at == std::string_view::npos) return false;
  const std::string_view checkpoint = name.substr(0, at);
  return CheckpointStep(checkpoint, basename).has_value() &&
         state_internal::IsMarkedOf(name, checkpoint, kCorruptInfix);
}

std::string DeletingDirName(const std::string& name) {
  return name + std::string(kDeletingInfix) + RandomHex16();
}

std::optional<int64_t> CheckpointStep(std::string_view name, std::string_view basename) {
  if (basename.empty() || name.size() <= basename.size() + 1) return std::nullopt;
  if (name.substr(0, basename.size()) != basename || name[basename.size()] != '-') {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(basename.size() + 1);
  if (!AllOf(digits, IsDecimalDigit) || (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

Status ValidateCheckpointStep(int64_t step) {
  if (step >= 0) return Status::OK();
  return Status::InvalidArgument("step " + std::to_string(step) +
                                 " is negative; a checkpoint's step is 0 or more");
}

}  // namespace asyncckpt
