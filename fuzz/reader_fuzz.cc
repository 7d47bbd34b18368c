// libFuzzer target: CheckpointReader over a whole checkpoint directory. The input holds an index
// and the data files (framed as fuzz/fuzz_support.h says); they are written into a scratch
// directory (on tmpfs where there is one), opened, every tensor is read and the checkpoint
// verified. Besides "no crash, no hang, no allocation beyond the bounds", it checks:
//  - the reader's documented memory bound: a tensor claims at most kMaxZstdRatio raw bytes per
//    stored byte of its chunks, which lie in the data files without overlap;
//  - a failure is a Status that says what is wrong, never Internal (an unexpected exception);
//  - read() and verify() agree: verify() finds damage exactly when some read() fails;
//  - read_box() of a tensor that read() read gives the same bytes as that box of it.

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "fuzz/fuzz_support.h"
#include "src/format/format.h"

namespace asyncckpt::fuzz {
namespace {

// A directory of its own for this process, removed when the fuzzer exits normally.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/asyncckpt-fuzz-XXXXXX";
    Require(mkdtemp(pattern.data()) != nullptr, "cannot create a scratch directory");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

  // Replaces the directory's files with `files`, named as a checkpoint names them.
  void WriteCheckpoint(const std::vector<std::string_view>& files) {
    for (const std::string& name : written_) unlink((path_ + "/" + name).c_str());
    written_.clear();
    const uint32_t data_files = static_cast<uint32_t>(files.size() - 1);
    for (size_t i = 0; i < files.size(); ++i) {
      written_.push_back(i == 0 ? format::kIndexFileName
                                : format::DataFileName(static_cast<uint32_t>(i - 1), data_files));
      WriteFile(path_ + "/" + written_.back(), files[i]);
    }
  }

 private:
  static void WriteFile(const std::string& path, std::string_view bytes) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    Require(fd >= 0, "cannot create a file in the scratch directory");
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
      Require(n > 0, "cannot write a file in the scratch directory");
      done += static_cast<size_t>(n);
    }
    close(fd);
  }

  std::string path_;
  std::vector<std::string> written_;
};

// A box of `info` read with read_box() must equal the same box cut from the whole tensor
// (`whole`, read with read()): the lower half of dimension 0 and a middle band of the last.
void CheckBoxes(CheckpointReader& reader, const TensorInfo& info,
                const std::vector<uint8_t>& whole) {
  const size_t rank = info.shape.size();
  if (rank == 0 || info.bytes == 0) return;
  const size_t elem = DTypeSize(info.dtype);
  for (int which = 0; which < 2; ++which) {
    std::vector<int64_t> first(rank, 0), extent = info.shape;
    const size_t d = which == 0 ? 0 : rank - 1;
    first[d] = info.shape[d] / 3;
    extent[d] = info.shape[d] - first[d] - (which == 0 ? 0 : info.shape[d] / 4);
    std::vector<uint8_t> want(static_cast<size_t>(NumElements(extent)) * elem);
    std::vector<int64_t> at(rank, 0);
    for (size_t n = 0; n < want.size() / elem; ++n) {
      int64_t linear = 0;
      for (size_t i = 0; i < rank; ++i) linear = linear * info.shape[i] + first[i] + at[i];
      std::memcpy(want.data() + n * elem, whole.data() + static_cast<size_t>(linear) * elem, elem);
      for (size_t i = rank; i-- > 0;) {
        if (++at[i] < extent[i]) break;
        at[i] = 0;
      }
    }
    std::vector<uint8_t> got(want.size());
    const Status status = reader.read_box(info.name, first, extent, got.data(), got.size());
    Require(status.ok(), "read_box() failed where read() of the whole tensor succeeded");
    Require(got == want, "read_box() differs from the same box of read()");
  }
}

void Exercise(CheckpointReader& reader, uint64_t data_bytes) {
  uint64_t stored_total = 0;
  uint64_t chunks = 0;
  bool every_read_ok = true;
  for (const TensorInfo& info : reader.tensors()) {
    Require(info.stored_bytes <= data_bytes, "a tensor's chunks claim more than the data files");
    Require(info.bytes <= format::kMaxZstdRatio * info.stored_bytes,
            "a tensor claims more raw bytes than its stored bytes can decode to");
    stored_total += info.stored_bytes;
    chunks += info.num_chunks;
    std::vector<uint8_t> buffer(info.bytes);
    const Status read = reader.read(info.name, buffer.data(), buffer.size());
    Require(read.code() != StatusCode::kInternal, "read() failed with Internal");
    if (read.ok()) CheckBoxes(reader, info, buffer);
    every_read_ok = every_read_ok && read.ok();
  }
  Require(stored_total <= data_bytes, "the chunks claim more stored bytes than the data files");
  const VerifyReport report = reader.verify();
  Require(report.chunks_checked == chunks, "verify() did not check every chunk");
  Require(report.problems.empty() == every_read_ok, "verify() and read() disagree");
}

}  // namespace
}  // namespace asyncckpt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace asyncckpt;
  using namespace asyncckpt::fuzz;
  static ScratchDir dir;
  static const std::unique_ptr<io::FileSystem> fs = io::NewPosixFileSystem();

  const std::vector<std::string_view> files = SplitFiles(std::span<const uint8_t>(data, size));
  if (files.size() < 2) return 0;  // no data file: the reader stops at the count
  std::vector<uint8_t> index(files[0].begin(), files[0].end());
  RepairIndexEnvelope(index);
  std::vector<std::string_view> on_disk = files;
  on_disk[0] = std::string_view(reinterpret_cast<const char*>(index.data()), index.size());
  dir.WriteCheckpoint(on_disk);
  uint64_t data_bytes = 0;
  for (size_t i = 1; i < files.size(); ++i) data_bytes += files[i].size();

  ReaderOptions options;
  options.file_system = fs.get();
  Result<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir.path(), options);
  if (!reader.ok()) {
    Require(reader.status().code() != StatusCode::kInternal, "Open() failed with Internal");
    return 0;
  }
  Exercise(**reader, data_bytes);
  return 0;
}
