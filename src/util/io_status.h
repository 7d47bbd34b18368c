#pragma once

// The one place where an io::IoStatus (errno + message) becomes an asyncckpt::Status.

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// OK, NotFound for ENOENT, AlreadyExists for EEXIST, FailedPrecondition for EWOULDBLOCK (a
/// lock another holder has), else IOError; the message is kept.
Status ToStatus(const io::IoStatus& status);

}  // namespace asyncckpt
