// ExportSafetensors and ImportSafetensors: a checkpoint's tensors to safetensors files and back,
// through the public reader and Checkpointer, and the file system seam.

#include "asyncckpt/safetensors.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/interop/safetensors_format.h"
#include "src/interop/slab_copy.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

using interop::SafetensorsTensor;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr uint64_t kPage = 4096;  // O_DIRECT's alignment

struct FreeBytes {
  void operator()(uint8_t* p) const { std::free(p); }
};

std::string Join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

// "a/b~1c" -> "a.b/c": a checkpoint's key path (each key escaped as in a JSON pointer) as
// Hugging Face names the same tensor.
std::string DottedName(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '/') {
      out += '.';
    } else if (name[i] == '~' && i + 1 < name.size() &&
               (name[i + 1] == '0' || name[i + 1] == '1')) {
      out += name[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      out += name[i];
    }
  }
  return out;
}

// fnmatch's '*' and '?' without character classes.
bool GlobMatches(std::string_view pattern, std::string_view text) {
  size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool Selected(const std::string& select, const std::string& name) {
  if (select.empty()) return true;
  if (select.find_first_of("*?") != std::string::npos) return GlobMatches(select, name);
  return name.compare(0, select.size(), select) == 0;
}

std::string RandomHex() {
  std::random_device device;
  char out[17];
  std::snprintf(out, sizeof out, "%08x%08x", device(), device());
  return out;
}

// A checkpoint tensor on its way into a file.
struct Planned {
  const TensorInfo* info;
  std::string name;  // as exported
};

// The files of an export: each one's tensors, in order.
std::vector<std::vector<Planned>> PlanFiles(std::vector<Planned> tensors, uint64_t max_bytes) {
  std::vector<std::vector<Planned>> files(1);
  uint64_t in_file = 0;
  for (Planned& t : tensors) {
    if (max_bytes != 0 && in_file > 0 && in_file + t.info->bytes > max_bytes) {
      files.emplace_back();
      in_file = 0;
    }
    in_file += t.info->bytes;
    files.back().push_back(std::move(t));
  }
  return files;
}

std::string ShardName(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

// Writes one safetensors file of `tensors` at `path`, synced: the header, then the tensors'
// bytes through a few slabs of `buffer_bytes` in all, read ahead while earlier ones are written.
Status WriteFile(CheckpointReader& reader, io::FileSystem& fs, const std::vector<Planned>& tensors,
                 const std::string& path, uint64_t buffer_bytes) {
  std::vector<SafetensorsTensor> entries;
  uint64_t data = 0;
  for (const Planned& t : tensors) {
    entries.push_back({t.name, t.info->dtype, t.info->shape, data, data + t.info->bytes});
    data += t.info->bytes;
  }
  std::string header = interop::EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  // The format allows trailing spaces: with them the data starts on a page, so that the
  // tensors go out through O_DIRECT (no page cache to fill, the export's largest cost) and
  // a raw chunk is read straight into its slab.
  header.append((kPage - (8 + header.size()) % kPage) % kPage, ' ');
  const uint64_t data_start = 8 + header.size();
  std::unique_ptr<uint8_t, FreeBytes> head(
      static_cast<uint8_t*>(std::aligned_alloc(kPage, data_start)));
  if (head == nullptr) return Status::ResourceExhausted("the header of " + path);
  for (int i = 0; i < 8; ++i) head.get()[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
  std::copy(header.begin(), header.end(), head.get() + 8);
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(
      fs.open(path, {.write = true, .create = true, .truncate = true, .direct = true}, &file)));
  std::vector<const TensorInfo*> infos;
  for (const Planned& t : tensors) infos.push_back(t.info);
  const interop::SlabCopyOptions copy;
  const std::vector<interop::Slab> slabs =
      interop::PlanSlabs(infos, data_start, buffer_bytes / copy.slabs);
  RETURN_IF_ERROR(interop::CopySlabs(reader, slabs, *file, copy));
  // The header last: a file an export left behind unfinished (killed before it could remove
  // it) starts with a length of 0, which no reader takes for a safetensors file.
  RETURN_IF_ERROR(ToStatus(file->write_at(0, head.get(), data_start)));
  return ToStatus(file->sync());
}

Result<std::string> ResolveCheckpoint(io::FileSystem& fs, const std::string& path) {
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs.entry_type(Join(path, "index"), &type)));
  if (type == io::EntryType::kFile) return path;
  return LatestCheckpoint(path);
}

// Every selected tensor under its exported name, refusing names two tensors would share and a
// selection that matches nothing.
Result<std::vector<Planned>> SelectTensors(const CheckpointReader& reader,
                                           const SafetensorsExportOptions& options) {
  std::vector<Planned> selected;
  std::map<std::string, std::string> claimed;  // exported name -> checkpoint name
  for (const TensorInfo& info : reader.tensors()) {
    std::string name = options.keep_names ? info.name : DottedName(info.name);
    if (!Selected(options.select, name)) continue;
    auto [it, fresh] = claimed.emplace(name, info.name);
    if (!fresh) {
      return Status::InvalidArgument("tensors \"" + it->second + "\" and \"" + info.name +
                                     "\" would both be named \"" + name +
                                     "\"; export with keep_names");
    }
    selected.push_back({&info, std::move(name)});
  }
  if (selected.empty()) {
    std::string some = reader.tensors().empty()
                           ? "none"
                           : "e.g. \"" +
                                 (options.keep_names ? reader.tensors()[0].name
                                                     : DottedName(reader.tensors()[0].name)) +
                                 "\"";
    return Status::InvalidArgument("select '" + options.select + "' matches none of the " +
                                   std::to_string(reader.tensors().size()) + " tensors of " +
                                   reader.path() + " (" + some + ")");
  }
  return selected;
}

}  // namespace

Result<SafetensorsExportReport> ExportSafetensors(const std::string& checkpoint,
                                                  const std::string& out_dir,
                                                  const SafetensorsExportOptions& options) {
  std::unique_ptr<io::FileSystem> fs = io::NewPosixFileSystem();
  ASSIGN_OR_RETURN(const std::string path, ResolveCheckpoint(*fs, checkpoint));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(path));
  ASSIGN_OR_RETURN(std::vector<Planned> selected, SelectTensors(*reader, options));
  const std::vector<std::vector<Planned>> files =
      PlanFiles(std::move(selected), options.max_shard_bytes);
  SafetensorsExportReport report;
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < files.size(); ++i) {
    report.files.push_back(files.size() == 1 ? kSingleFile : ShardName(i, files.size()));
    for (const Planned& t : files[i]) {
      weight_map[t.name] = report.files.back();
      report.bytes += t.info->bytes;
      ++report.tensors;
    }
  }
  if (files.size() > 1) report.files.push_back(kIndexFile);
  RETURN_IF_ERROR(ToStatus(fs->create_dirs(out_dir)));
  for (const std::string& name : report.files) {
    io::EntryType type = io::EntryType::kNone;
    RETURN_IF_ERROR(ToStatus(fs->entry_type(Join(out_dir, name), &type)));
    if (type != io::EntryType::kNone) {
      return Status::FailedPrecondition(Join(out_dir, name) +
                                        " exists already; export into an "
                                        "empty directory or remove it");
    }
  }
  // Every file is written and synced under a temporary name first, so a failure leaves none of
  // them behind, and the renames come last.
  const std::string tmp = ".export-" + RandomHex() + "-";
  Status written = Status::OK();
  for (size_t i = 0; i < files.size() && written.ok(); ++i) {
    written = WriteFile(*reader, *fs, files[i], Join(out_dir, tmp + report.files[i]),
                        options.buffer_bytes);
  }
  if (written.ok() && files.size() > 1) {
    const std::string index = interop::EncodeSafetensorsIndex(weight_map, report.bytes);
    std::unique_ptr<io::File> file;
    written = ToStatus(fs->open(Join(out_dir, tmp + kIndexFile),
                                {.write = true, .create = true, .truncate = true}, &file));
    if (written.ok()) written = ToStatus(file->write_at(0, index.data(), index.size()));
    if (written.ok()) written = ToStatus(file->sync());
  }
  for (const std::string& name : report.files) {
    if (written.ok()) {
      written = ToStatus(fs->rename(Join(out_dir, tmp + name), Join(out_dir, name)));
    } else {
      (void)fs->remove_file(Join(out_dir, tmp + name));
    }
  }
  RETURN_IF_ERROR(written.WithContext("exporting " + path + " to " + out_dir));
  RETURN_IF_ERROR(ToStatus(fs->sync_dir(out_dir)));
  return report;
}

namespace {

// A safetensors file mapped read-only, its header parsed and checked.
class MappedSafetensors {
 public:
  static Result<std::unique_ptr<MappedSafetensors>> Open(io::FileSystem& fs,
                                                         const std::string& path) {
    std::unique_ptr<io::File> file;
    RETURN_IF_ERROR(ToStatus(fs.open(path, {}, &file)));
    uint64_t size = 0;
    RETURN_IF_ERROR(ToStatus(file->size(&size)));
    uint8_t length_bytes[8];
    if (size < sizeof length_bytes) {
      return Status::InvalidArgument(path + ": " + std::to_string(size) +
                                     " bytes, too short for a safetensors file");
    }
    RETURN_IF_ERROR(ToStatus(file->read_at(0, length_bytes, sizeof length_bytes)));
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= uint64_t(length_bytes[i]) << (8 * i);
    if (length > interop::kMaxSafetensorsHeaderBytes || length > size - sizeof length_bytes) {
      return Status::InvalidArgument(path + ": its header claims " + std::to_string(length) +
                                     " bytes, more than the file or the format allows");
    }
    std::string json(length, '\0');
    RETURN_IF_ERROR(ToStatus(file->read_at(sizeof length_bytes, json.data(), length)));
    const uint64_t data_start = sizeof length_bytes + length;
    ASSIGN_OR_RETURN(interop::SafetensorsHeader header,
                     interop::ParseSafetensorsHeader(json, size - data_start, path));
    auto mapped = std::unique_ptr<MappedSafetensors>(
        new MappedSafetensors(path, std::move(header), data_start, size));
    if (size > 0) {
      // A read-only mapping: the checkpoint's save copies straight from the page cache, and
      // nothing of the file is held twice in memory.
      void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file->fd(), 0);
      if (map == MAP_FAILED) return ToStatus(io::IoStatus(errno, "mmap " + path));
      mapped->map_ = static_cast<uint8_t*>(map);
    }
    return mapped;
  }
  ~MappedSafetensors() {
    if (map_ != nullptr) munmap(map_, size_);
  }
  const std::string& path() const { return path_; }
  const interop::SafetensorsHeader& header() const { return header_; }
  void* data(const SafetensorsTensor& t) const { return map_ + data_start_ + t.begin; }

 private:
  MappedSafetensors(std::string path, interop::SafetensorsHeader header, uint64_t data_start,
                    uint64_t size)
      : path_(std::move(path)), header_(std::move(header)), data_start_(data_start), size_(size) {}
  std::string path_;
  interop::SafetensorsHeader header_;
  uint64_t data_start_;
  uint64_t size_;
  uint8_t* map_ = nullptr;
};

// The files to import and, for a split model, the index's tensor -> file map.
Result<std::pair<std::vector<std::string>, std::map<std::string, std::string>>> InputFiles(
    io::FileSystem& fs, const std::string& input) {
  io::EntryType type = io::EntryType::kNone;
  RETURN_IF_ERROR(ToStatus(fs.entry_type(input, &type, io::Symlinks::kFollow)));
  if (type == io::EntryType::kFile)
    return std::make_pair(std::vector<std::string>{input}, std::map<std::string, std::string>{});
  if (type != io::EntryType::kDirectory) {
    return Status::NotFound(input + " is neither a .safetensors file nor a directory of them");
  }
  const std::string index_path = Join(input, kIndexFile);
  RETURN_IF_ERROR(ToStatus(fs.entry_type(index_path, &type, io::Symlinks::kFollow)));
  if (type != io::EntryType::kFile) {
    return std::make_pair(std::vector<std::string>{Join(input, kSingleFile)},
                          std::map<std::string, std::string>{});
  }
  uint64_t size = 0;
  RETURN_IF_ERROR(ToStatus(fs.file_size(index_path, &size)));
  if (size > interop::kMaxSafetensorsHeaderBytes) {
    return Status::InvalidArgument(index_path + ": " + std::to_string(size) +
                                   " bytes, too large "
                                   "for an index");
  }
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs.open(index_path, {}, &file)));
  std::string json(size, '\0');
  RETURN_IF_ERROR(ToStatus(file->read_at(0, json.data(), size)));
  ASSIGN_OR_RETURN(auto weight_map, interop::ParseSafetensorsIndex(json, index_path));
  std::set<std::string> names;
  for (const auto& [tensor, name] : weight_map) names.insert(name);
  std::vector<std::string> files;
  for (const std::string& name : names) files.push_back(Join(input, name));
  return std::make_pair(std::move(files), std::move(weight_map));
}

// The tensors of every file, under their checkpoint names; refuses a name twice and, with an
// index, a tensor the index places elsewhere or a tensor the index names that no file holds.
Result<TensorRegistry> Register(const std::vector<std::unique_ptr<MappedSafetensors>>& files,
                                const std::map<std::string, std::string>& weight_map,
                                const std::string& prefix) {
  TensorRegistry registry;
  std::map<std::string, std::string> found;  // tensor -> file
  for (const auto& file : files) {
    const std::string base = file->path().substr(file->path().rfind('/') + 1);
    for (const SafetensorsTensor& t : file->header().tensors) {
      if (!weight_map.empty()) {
        auto listed = weight_map.find(t.name);
        if (listed == weight_map.end() || listed->second != base) {
          return Status::InvalidArgument(file->path() + ": tensor \"" + t.name + "\" is not " +
                                         "where the index places it");
        }
      }
      auto [it, fresh] = found.emplace(t.name, file->path());
      if (!fresh) {
        return Status::InvalidArgument("tensor \"" + t.name + "\" is in both " + it->second +
                                       " and " + file->path());
      }
      RETURN_IF_ERROR(registry
                          .add({prefix + t.name,
                                t.dtype,
                                t.shape,
                                file->data(t),
                                t.end - t.begin,
                                nullptr,
                                {},
                                {}})
                          .WithContext(file->path()));
    }
  }
  for (const auto& [tensor, name] : weight_map) {
    if (!found.count(tensor)) {
      return Status::InvalidArgument("the index names tensor \"" + tensor + "\" in " + name +
                                     ", which does not hold it");
    }
  }
  return registry;
}

}  // namespace

Result<std::string> ImportSafetensors(const std::string& input, const std::string& checkpoint_dir,
                                      const SafetensorsImportOptions& options) {
  std::unique_ptr<io::FileSystem> fs = io::NewPosixFileSystem();
  ASSIGN_OR_RETURN(auto inputs, InputFiles(*fs, input));
  std::vector<std::unique_ptr<MappedSafetensors>> files;
  for (const std::string& path : inputs.first) {
    ASSIGN_OR_RETURN(auto file, MappedSafetensors::Open(*fs, path));
    files.push_back(std::move(file));
  }
  ASSIGN_OR_RETURN(TensorRegistry registry, Register(files, inputs.second, options.prefix));
  SaverOptions saver;
  saver.checkpoint_dir = checkpoint_dir;
  saver.basename = options.basename;
  saver.save_steps = 1;
  saver.max_to_keep = 0;  // an import never removes what the directory holds
  saver.compression = options.compression;
  ASSIGN_OR_RETURN(auto checkpointer, Checkpointer::Create(saver, SaveMode::kSynchronous,
                                                           CheckpointerStart::kAtFirstSave));
  const std::vector<int64_t> steps = checkpointer->all_steps();
  if (std::find(steps.begin(), steps.end(), options.step) != steps.end()) {
    return Status::FailedPrecondition(checkpointer->checkpoint_path(options.step) +
                                      " exists already; import as another step");
  }
  RETURN_IF_ERROR(checkpointer->save(options.step, registry, {{"asyncckpt.imported_from", input}}));
  RETURN_IF_ERROR(checkpointer->close());
  return checkpointer->checkpoint_path(options.step);
}

}  // namespace asyncckpt
