#include "src/util/io_status.h"

#include <cerrno>

namespace asyncckpt {

Status ToStatus(const io::IoStatus& status) {
  if (status.ok()) return Status::OK();
  switch (status.error_number()) {
    case ENOENT:
      return Status::NotFound(status.message());
    case EEXIST:
      return Status::AlreadyExists(status.message());
    default:
      return Status::IOError(status.message());
  }
}

}  // namespace asyncckpt
