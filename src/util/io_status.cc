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
    case EWOULDBLOCK:
      // Only FileSystem::lock_file() reports it (transfers retry EAGAIN, its twin): another
      // holder of the lock, which waiting in this process will not remove.
      return Status::FailedPrecondition(status.message());
    default:
      return Status::IOError(status.message());
  }
}

std::string DescribeEntryType(io::EntryType type) {
  switch (type) {
    case io::EntryType::kNone:
      return "missing";
    case io::EntryType::kFile:
      return "a file";
    case io::EntryType::kDirectory:
      return "a directory";
    case io::EntryType::kSymlink:
      return "a symlink";
    case io::EntryType::kFifo:
      return "a FIFO";
    case io::EntryType::kDevice:
      return "a device";
    case io::EntryType::kSocket:
      return "a socket";
    case io::EntryType::kOther:
      break;
  }
  return "a special file";
}

}  // namespace asyncckpt
