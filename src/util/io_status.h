#pragma once

// The one place where an io::IoStatus (errno + message) becomes an asyncckpt::Status, and an
// io::EntryType the words a message uses for it.

#include <string>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// OK, NotFound for ENOENT, AlreadyExists for EEXIST, FailedPrecondition for EWOULDBLOCK (a
/// lock another holder has), else IOError; the message is kept.
Status ToStatus(const io::IoStatus& status);

/// "a FIFO", "a directory", "missing", ...: what an entry is, for messages such as
/// "<path> is a FIFO, not a regular file".
std::string DescribeEntryType(io::EntryType type);

}  // namespace asyncckpt
