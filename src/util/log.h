#pragma once

// A minimal logger: one line per message on stderr, prefixed with "asyncckpt: ".
// Tests and the Python package redirect it with SetLogSink (asyncckpt/log.h).

#include <string_view>

#include "asyncckpt/log.h"

namespace asyncckpt {

/// Writes one line through the current sink.
void LogLine(std::string_view message);

}  // namespace asyncckpt
