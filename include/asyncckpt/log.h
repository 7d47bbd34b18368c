#pragma once

// Where the library's log lines go: one line per message, on stderr ("asyncckpt: <line>")
// unless a sink is set. The Python package sets one to hand the lines to Python's logging.

#include <functional>
#include <string_view>

namespace asyncckpt {

/// Receives each log line (without the "asyncckpt: " prefix). Called from whichever thread
/// logs, background threads included, one call at a time.
using LogSinkFunction = std::function<void(std::string_view)>;

/// Replaces the sink (null restores stderr); returns the previous one.
LogSinkFunction SetLogSink(LogSinkFunction sink);

}  // namespace asyncckpt
