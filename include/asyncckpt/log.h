#pragma once

// Where the library's log lines go: one line per message, on stderr ("asyncckpt: <line>", with
// "WARNING: " or "ERROR: " before a line of that level) unless a sink is set. The Python
// package sets one to hand the lines to Python's logging at their level.

#include <functional>
#include <string_view>

namespace asyncckpt {

/// How much a log line matters, as Python's logging and TensorFlow's logging rank them.
enum class LogLevel {
  /// What the library did as it should: retention, start-up clean-up, a restore, a recovery.
  kInfo,
  /// Something a person may want to look at; the job goes on as asked.
  kWarning,
  /// Something failed or is damaged: a save, a checkpoint, a listener.
  kError,
};

/// "INFO", "WARNING" or "ERROR".
std::string_view LogLevelName(LogLevel level);

/// Receives each log line (without the "asyncckpt: " prefix, and without a level prefix) and
/// its level. Called from whichever thread logs, background threads included, one call at a
/// time.
using LogSinkFunction = std::function<void(LogLevel, std::string_view)>;

/// Replaces the sink (null restores stderr); returns the previous one.
LogSinkFunction SetLogSink(LogSinkFunction sink);

}  // namespace asyncckpt
