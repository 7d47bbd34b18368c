#include "src/state/retention_score.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace asyncckpt {

Result<std::optional<double>> RetentionScore(
    const std::map<std::string, std::string>& user_metadata) {
  const auto found = user_metadata.find(kRetentionScoreKey);
  if (found == user_metadata.end()) return std::optional<double>();
  const std::string& text = found->second;
  double score = 0;
  // from_chars, not strtod: no locale, no leading spaces, and the whole text must be the number.
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), score);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() ||
      !std::isfinite(score)) {
    return Status::InvalidArgument(std::string("user metadata ") + kRetentionScoreKey + "='" +
                                   text.substr(0, 64) +
                                   "' is not a finite number: it is the checkpoint's score for "
                                   "best-N retention");
  }
  return std::optional<double>(score);
}

}  // namespace asyncckpt
