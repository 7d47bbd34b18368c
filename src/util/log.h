#pragma once

// A minimal logger: one line per message on stderr, prefixed with "asyncckpt: " (and the level,
// for warnings and errors). Tests and the Python package redirect it with SetLogSink
// (asyncckpt/log.h).

#include <string_view>

#include "asyncckpt/log.h"

namespace asyncckpt {

/// Writes one line of `level` through the current sink.
void Log(LogLevel level, std::string_view message);

/// Log(kInfo, message): what the library did as it should.
inline void LogInfo(std::string_view message) { Log(LogLevel::kInfo, message); }
/// Log(kWarning, message): worth a look; the job goes on as asked.
inline void LogWarning(std::string_view message) { Log(LogLevel::kWarning, message); }
/// Log(kError, message): a failure or damage.
inline void LogError(std::string_view message) { Log(LogLevel::kError, message); }

}  // namespace asyncckpt
