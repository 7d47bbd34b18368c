#pragma once

// A minimal logger: one line per message on stderr, prefixed with "asyncckpt: ".
// Tests can redirect it to capture what was said.

#include <functional>
#include <string>
#include <string_view>

namespace asyncckpt {

/// Writes one line through the current sink.
void LogLine(std::string_view message);
/// Replaces the sink (null restores stderr); returns the previous one.
std::function<void(std::string_view)> SetLogSink(std::function<void(std::string_view)> sink);

}  // namespace asyncckpt
