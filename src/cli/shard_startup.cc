// The start-up check of a train-sim --shard job: usage errors gathered from every rank, and the
// options every rank must share compared once.

#include "src/cli/shard_startup.h"

#include <cstdint>
#include <map>
#include <set>

#include "asyncckpt/dtype.h"

namespace asyncckpt::cli {

namespace {

// One rank's outcome as it travels: 'E' and its usage error, or 'O' and "flag=value" lines.
std::vector<uint8_t> Encode(const Result<TrainSimConfig>& config) {
  std::string text;
  if (!config.ok()) {
    text = "E" + config.status().message();
  } else {
    text = "O";
    for (const auto& [flag, value] : SharedOptions(*config)) text += flag + "=" + value + "\n";
  }
  return std::vector<uint8_t>(text.begin(), text.end());
}

std::vector<std::pair<std::string, std::string>> DecodeOptions(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> options;
  size_t begin = 1;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) options.emplace_back(line.substr(0, eq), line.substr(eq + 1));
    begin = end + 1;
  }
  return options;
}

std::string Optional(const auto& value) {
  return value ? std::to_string(*value) : std::string("unset");
}

std::string Joined(const std::set<int64_t>& steps) {
  std::string text;
  for (int64_t step : steps) {
    // Appended piece by piece: GCC 12's -O3 -Wrestrict misfires on "literal" + std::string&&.
    if (!text.empty()) text += ',';
    text += std::to_string(step);
  }
  return text.empty() ? std::string("none") : text;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> SharedOptions(const TrainSimConfig& config) {
  return {
      {"--steps", std::to_string(config.steps)},
      {"--save_steps", Optional(config.saver.save_steps)},
      {"--save_secs", Optional(config.saver.save_secs)},
      {"--max_to_keep", std::to_string(config.saver.max_to_keep)},
      {"--seed", std::to_string(config.model.seed)},
      {"--model_bytes", std::to_string(config.model.state_bytes)},
      {"--tensors", std::to_string(config.model.num_tensors)},
      {"--dtype", std::string(DTypeName(config.model.dtype))},
      {"--optimizer", std::to_string(static_cast<int>(config.model.optimizer))},
      {"--saver", config.saver_kind},
      {"--checkpoint_dir", config.saver.checkpoint_dir},
      {"--chunk_bytes", std::to_string(config.saver.chunk_bytes)},
      {"--batch_size", std::to_string(config.batch_size)},
      {"--dataset_records", std::to_string(config.dataset_records)},
      {"--record_bytes", std::to_string(config.record_bytes)},
      {"--preempt_at_steps", Joined(config.preempt_at_steps)},
      {"--coordination_timeout_secs", std::to_string(config.coordination_timeout_secs)},
  };
}

std::string DescribeDisagreement(
    const std::vector<std::vector<std::pair<std::string, std::string>>>& ranks) {
  if (ranks.empty()) return "";
  std::string message;
  const auto& lead = ranks[0];
  for (size_t i = 0; i < lead.size(); ++i) {
    std::string differing;
    for (size_t r = 1; r < ranks.size(); ++r) {
      if (ranks[r].empty() || i >= ranks[r].size()) continue;
      if (ranks[r][i].second != lead[i].second) {
        differing += ", rank " + std::to_string(r) + " has " + ranks[r][i].second;
      }
    }
    if (differing.empty()) continue;
    message += (message.empty() ? "" : "; ") + lead[i].first +
               " differs across ranks: rank 0 has " + lead[i].second + differing;
  }
  return message;
}

Status AgreeOnConfig(Coordinator& coordinator, const Result<TrainSimConfig>& config) {
  auto gathered = coordinator.all_gather(Encode(config));
  if (!gathered.ok()) {
    return Status::Unavailable(
        "could not compare the flags with the other ranks (" + gathered.status().ToString() + ")" +
        (config.ok() ? std::string() : "; this rank's own: " + config.status().message()));
  }
  std::map<std::string, std::string> errors;  // message -> the ranks that have it
  std::vector<std::vector<std::pair<std::string, std::string>>> options;
  for (size_t r = 0; r < gathered->size(); ++r) {
    const std::string text((*gathered)[r].begin(), (*gathered)[r].end());
    options.emplace_back();
    if (!text.empty() && text[0] == 'E') {
      std::string& ranks = errors[text.substr(1)];
      ranks += (ranks.empty() ? "rank " : ", ") + std::to_string(r);
    } else {
      options.back() = DecodeOptions(text);
    }
  }
  std::string message;
  for (const auto& [error, ranks] : errors) {
    if (!message.empty()) message += "; ";
    message += ranks + ": " + error;
  }
  if (message.empty()) message = DescribeDisagreement(options);
  if (message.empty()) return Status::OK();
  return Status::InvalidArgument(message);
}

}  // namespace asyncckpt::cli
