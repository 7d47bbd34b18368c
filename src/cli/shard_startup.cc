// The start-up check of a train-sim --shard job: usage errors gathered from every rank, the
// options every rank must share compared once, and the dataset every rank reads.

#include "src/cli/shard_startup.h"

#include <xxhash.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "asyncckpt/dtype.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/input_pipeline.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

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

// The bytes of a dataset compared across ranks: its header and first records.
constexpr uint64_t kDatasetDigestBytes = 4096;

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
  const auto on_off = [](bool on) { return std::string(on ? "on" : "off"); };
  return {
      // The state: its shape, its initial values and its updates.
      {"--steps", std::to_string(config.steps)},
      {"--seed", std::to_string(config.model.seed)},
      {"--model_bytes", std::to_string(config.model.state_bytes)},
      {"--tensors", std::to_string(config.model.num_tensors)},
      {"--dtype", std::string(DTypeName(config.model.dtype))},
      {"--optimizer", config.model.optimizer == Optimizer::kAdam ? "adam" : "sgd"},
      // The input stream, which feeds every update.
      {"--batch_size", std::to_string(config.batch_size)},
      {"--shuffle_buffer", std::to_string(config.input.shuffle_buffer)},
      {"--prefetch", std::to_string(config.input.prefetch)},
      {"--epochs", std::to_string(config.input.epochs)},
      {"--dataset_records", std::to_string(config.dataset_records)},
      {"--record_bytes", std::to_string(config.record_bytes)},
      // Which steps save, what is kept, and how a checkpoint is laid out across the ranks.
      {"--save_steps", Optional(config.saver.save_steps)},
      {"--save_secs", Optional(config.saver.save_secs)},
      {"--max_to_keep", std::to_string(config.saver.max_to_keep)},
      {"--keep_checkpoint_every_n_hours",
       std::to_string(config.saver.keep_checkpoint_every_n_hours)},
      {"--keep_period", std::to_string(config.saver.keep_period)},
      {"--saver", config.saver_kind},
      {"--checkpoint_dir", config.saver.checkpoint_dir},
      {"--chunk_bytes", std::to_string(config.saver.chunk_bytes)},
      {"--num_data_files", std::to_string(config.saver.num_data_files)},
      // What the job does when a save is busy or fails, or a rank is late: every rank alike.
      {"--on_busy", config.saver.on_busy == OnBusy::kSkip ? "skip" : "wait"},
      {"--on_error", config.saver.on_error == OnError::kContinue ? "continue" : "stop"},
      {"--allow_fresh_start", on_off(config.allow_fresh_start)},
      {"--preempt_at_steps", Joined(config.preempt_at_steps)},
      {"--coordination_timeout_secs", std::to_string(config.coordination_timeout_secs)},
  };
}

const std::vector<std::pair<std::string, std::string>>& RankLocalFlags() {
  static const std::vector<std::pair<std::string, std::string>> flags = {
      {"step_ms", "simulated accelerator time: a rank's pace, not its updates"},
      {"compression", "each chunk records its codec: any mix restores bit for bit"},
      {"compression_level", "each chunk records its codec: any mix restores bit for bit"},
      {"staging_bytes", "this rank's pinned memory budget"},
      {"background_threads", "this rank's threads"},
      {"io", "this rank's I/O backend: the same bytes either way"},
      {"queue_depth", "this rank's writes in flight"},
      {"o_direct", "this rank's page cache: the same bytes either way"},
      {"metrics_json", "rank 0 alone reports"},
      {"step_series", "rank 0 alone reports"},
      {"verify", "rank 0 alone verifies"},
      {"quiet", "rank 0 alone prints progress"},
      {"memcpy_yardstick", "a local measurement; it saves nothing and calls no collective"},
      {"max_memory", "this rank's memory plan"},
      {"shard", "every rank of the job has it (a process without it is not in the job)"},
      {"device", "--shard runs on host memory only: every rank's is host"},
      {"stream_ordered", "needs --device cuda, which --shard refuses"},
      {"kill_at", "testing: names the one rank it kills"},
      {"end_rank_early", "testing: names the one rank that ends early"},
  };
  return flags;
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

Result<std::string> DescribeDataset(const std::string& path) {
  auto fs = io::NewPosixFileSystem();
  std::unique_ptr<io::File> file;
  uint64_t size = 0;
  RETURN_IF_ERROR(ToStatus(fs->open(path, {}, &file)));
  RETURN_IF_ERROR(ToStatus(file->size(&size)));
  std::vector<uint8_t> head(std::min(size, kDatasetDigestBytes));
  RETURN_IF_ERROR(ToStatus(file->read_at(0, head.data(), head.size())));
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016" PRIx64, XXH3_64bits(head.data(), head.size()));
  return path + " (" + std::to_string(size) + " bytes, XXH3 of the first " +
         std::to_string(head.size()) + " bytes " + digest + ")";
}

Status AgreeOnDataset(Coordinator& coordinator, TrainSimConfig& config) {
  if (config.dataset.empty()) {
    config.dataset = config.saver.checkpoint_dir + "/train-sim-dataset.bin";
  }
  Status written;
  if (coordinator.rank() == 0) {
    auto fs = io::NewPosixFileSystem();
    io::EntryType type = io::EntryType::kNone;
    written = ToStatus(fs->create_dirs(config.saver.checkpoint_dir));
    if (written.ok()) {
      written = ToStatus(fs->entry_type(config.dataset, &type, io::Symlinks::kFollow));
    }
    if (written.ok() && type == io::EntryType::kNone) {
      written = WriteRecordDataset(config.dataset, config.dataset_records, config.record_bytes,
                                   config.model.seed);
    }
  }
  // Rank 0's outcome first: the others look at the file only once it is written.
  std::vector<uint8_t> outcome;
  if (!written.ok()) {
    const std::string text =
        "rank 0 could not write the dataset " + config.dataset + ": " + written.message();
    outcome.assign(text.begin(), text.end());
  }
  RETURN_IF_ERROR(coordinator.broadcast(outcome, 0));
  if (!outcome.empty()) return Status::Unavailable(std::string(outcome.begin(), outcome.end()));
  // 'O' and the description, or 'E' and why the file cannot be read.
  Result<std::string> mine = DescribeDataset(config.dataset);
  const std::string sent =
      mine.ok() ? "O" + *mine
                : "E" + config.dataset + " cannot be read: " + mine.status().message();
  ASSIGN_OR_RETURN(auto gathered,
                   coordinator.all_gather(std::vector<uint8_t>(sent.begin(), sent.end())));
  std::vector<std::string> seen;
  for (const auto& bytes : gathered) seen.emplace_back(bytes.begin(), bytes.end());
  std::string unreadable;
  for (size_t r = 0; r < seen.size(); ++r) {
    if (seen[r].starts_with("E")) {
      unreadable += (unreadable.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": ") +
                    seen[r].substr(1);
    }
  }
  if (!unreadable.empty()) return Status::InvalidArgument("--dataset: " + unreadable);
  std::string differing;
  for (size_t r = 1; r < seen.size(); ++r) {
    if (seen[r] != seen[0])
      differing += ", rank " + std::to_string(r) + " has " + seen[r].substr(1);
  }
  if (differing.empty()) return Status::OK();
  return Status::InvalidArgument("--dataset differs across ranks: rank 0 has " + seen[0].substr(1) +
                                 differing);
}

}  // namespace asyncckpt::cli
