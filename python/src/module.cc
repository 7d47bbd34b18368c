// asyncckpt._core: the pybind11 bindings under the Python package `asyncckpt`.
//
// Only the public API (include/asyncckpt/) is bound. Python hands tensors over as plain
// descriptions (name, dtype, shape, address, bytes, CUDA ordinal) that the thin Python layer
// takes from torch.Tensor.data_ptr() or the NumPy array interface: no bytes are copied here,
// the engine copies them straight from that memory into its staging. Every call that blocks
// (a snapshot copy, a synchronous save, waiting, reading) releases the GIL.
//
// Log lines: with capture_log(True) the library's lines are queued here, not printed, and the
// Python package hands them to logging.getLogger("asyncckpt") (take_log_lines) after each call.
// A queue rather than a sink that calls Python: lines come from the engine's threads, and one
// that waited for the GIL could deadlock with a training thread that holds it while it waits
// for the engine.
//
// Errors: a non-OK Status becomes ValueError (InvalidArgument), FileNotFoundError (NotFound) or
// asyncckpt.CheckpointError (everything else, message "<code>: <what>").

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/compression.h"
#include "asyncckpt/device.h"
#include "asyncckpt/dtype.h"
#include "asyncckpt/log.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/safetensors.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/state.h"
#include "asyncckpt/status.h"
#include "asyncckpt/tensor.h"

namespace py = pybind11;

namespace asyncckpt::python {
namespace {

// Carries a Status out of a binding to the translator registered in the module.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const char* what() const noexcept override { return status_.message().c_str(); }
  const Status& status() const { return status_; }

 private:
  Status status_;
};

PyObject* checkpoint_error = nullptr;  // asyncckpt.CheckpointError, made once at import

void Check(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T Take(Result<T> result) {
  Check(result.status());
  return std::move(result).value();
}

// Runs `work` without the GIL, so that the engine's threads and other Python threads go on while
// it blocks (a snapshot copy, a synchronous save, a wait, a read), and returns what it returns.
template <typename Work>
auto WithoutGil(Work&& work) {
  py::gil_scoped_release release;
  return work();
}

// WithoutGil, holding `mu` too: for the Checkpointer's calls, which are for one thread at a
// time. The GIL goes first, so that a thread waiting for `mu` never holds it.
template <typename Work>
auto WithoutGilLocked(std::mutex& mu, Work&& work) {
  py::gil_scoped_release release;
  std::lock_guard lock(mu);
  return work();
}

void TranslateStatusError(std::exception_ptr error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const StatusError& e) {
    const Status& status = e.status();
    switch (status.code()) {
      case StatusCode::kInvalidArgument:
        PyErr_SetString(PyExc_ValueError, status.message().c_str());
        break;
      case StatusCode::kNotFound:
        PyErr_SetString(PyExc_FileNotFoundError, status.message().c_str());
        break;
      default:
        PyErr_SetString(checkpoint_error, status.ToString().c_str());
    }
  }
}

// The library's log lines since the last take, at most kMaxQueuedLogLines (then counted).
class LogQueue {
 public:
  static constexpr size_t kMaxQueuedLogLines = 10000;

  // A line and its level, as Python's logging numbers levels (INFO 20, WARNING 30, ERROR 40).
  using Line = std::pair<int, std::string>;

  void Push(LogLevel level, std::string_view line) {
    std::lock_guard lock(mu_);
    if (lines_.size() < kMaxQueuedLogLines) {
      lines_.emplace_back(PythonLevel(level), line);
    } else {
      ++dropped_;
    }
  }

  // The queued lines, oldest first, and how many were dropped because the queue was full.
  std::pair<std::vector<Line>, uint64_t> Take() {
    std::lock_guard lock(mu_);
    std::vector<Line> out(std::make_move_iterator(lines_.begin()),
                          std::make_move_iterator(lines_.end()));
    lines_.clear();
    return {std::move(out), std::exchange(dropped_, 0)};
  }

 private:
  static int PythonLevel(LogLevel level) {
    switch (level) {
      case LogLevel::kInfo:
        return 20;
      case LogLevel::kWarning:
        return 30;
      case LogLevel::kError:
        return 40;
    }
    return 30;
  }

  std::mutex mu_;
  std::deque<Line> lines_;
  uint64_t dropped_ = 0;
};

// Leaked on purpose: engine threads may still log while the interpreter tears the module down.
LogQueue& Log() {
  static LogQueue* queue = new LogQueue;
  return *queue;
}

void CaptureLog(bool capture) {
  if (capture) {
    SetLogSink([](LogLevel level, std::string_view line) { Log().Push(level, line); });
  } else {
    SetLogSink(nullptr);
  }
}

// One CUDA device object per GPU, made on first use (a device holds streams and events).
std::shared_ptr<Device> CudaDevice(int ordinal) {
  static std::mutex mu;
  static std::map<int, std::shared_ptr<Device>> devices;
  std::lock_guard lock(mu);
  auto found = devices.find(ordinal);
  if (found != devices.end()) return found->second;
  std::shared_ptr<Device> device = Take(NewCudaDevice(ordinal));
  devices[ordinal] = device;
  return device;
}

// A tensor as the Python layer describes it: (name, dtype name, shape, address, bytes, CUDA
// ordinal or None). The memory stays owned by the caller, who keeps it alive over the call.
using TensorSpec = std::tuple<std::string, std::string, std::vector<int64_t>, uintptr_t, size_t,
                              std::optional<int>>;

// Shards of global tensors, by tensor name: (global shape, the shard's first index in each
// global dimension). A tensor without one is whole (in a job of several processes, a replica).
using ShardBoxes = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<int64_t>>>;

TensorRegistry ToRegistry(const std::vector<TensorSpec>& specs, const ShardBoxes& boxes = {}) {
  TensorRegistry registry;
  for (const auto& [name, dtype_name, shape, address, bytes, cuda_ordinal] : specs) {
    std::optional<DType> dtype = ParseDType(dtype_name);
    if (!dtype) {
      Check(Status::InvalidArgument("tensor '" + name + "': unknown dtype '" + dtype_name + "'"));
    }
    std::shared_ptr<Device> device;
    if (cuda_ordinal) device = CudaDevice(*cuda_ordinal);
    std::vector<int64_t> global_shape, global_offset;
    if (auto box = boxes.find(name); box != boxes.end()) {
      global_shape = box->second.first;
      global_offset = box->second.second;
    }
    Check(registry.add(TensorRef{name, *dtype, shape, reinterpret_cast<void*>(address), bytes,
                                 std::move(device), std::move(global_shape),
                                 std::move(global_offset)}));
  }
  return registry;
}

// A Coordinator whose collectives are Python callables (torch.distributed's, JAX's): called on
// the thread that saves, which released the GIL for the save, so each call takes it back. A
// callable that raises fails the collective with Unavailable, naming the exception.
class PyCoordinator final : public Coordinator {
 public:
  PyCoordinator(int rank, int size, py::function broadcast, py::function all_gather)
      : rank_(rank),
        size_(size),
        broadcast_(std::move(broadcast)),
        all_gather_(std::move(all_gather)) {
    if (size < 1 || rank < 0 || rank >= size) {
      throw StatusError(Status::InvalidArgument("coordinator: rank " + std::to_string(rank) +
                                                " of " + std::to_string(size) + " is no rank"));
    }
  }
  ~PyCoordinator() override {
    py::gil_scoped_acquire gil;
    broadcast_ = py::object();
    all_gather_ = py::object();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status broadcast(std::vector<uint8_t>& bytes, int root) override {
    py::gil_scoped_acquire gil;
    try {
      py::bytes out =
          broadcast_(py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size()), root);
      const std::string text = out;
      bytes.assign(text.begin(), text.end());
      return Status::OK();
    } catch (py::error_already_set& e) {
      return Status::Unavailable("coordinator broadcast: " + std::string(e.what()));
    }
  }

  Result<std::vector<std::vector<uint8_t>>> all_gather(std::span<const uint8_t> bytes) override {
    py::gil_scoped_acquire gil;
    try {
      py::list gathered =
          all_gather_(py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
      std::vector<std::vector<uint8_t>> out;
      for (py::handle item : gathered) {
        const std::string text = py::cast<py::bytes>(item);
        out.emplace_back(text.begin(), text.end());
      }
      return out;
    } catch (py::error_already_set& e) {
      return Status::Unavailable("coordinator all_gather: " + std::string(e.what()));
    } catch (py::cast_error& e) {
      return Status::Unavailable("coordinator all_gather returned no list of bytes: " +
                                 std::string(e.what()));
    }
  }

 private:
  const int rank_;
  const int size_;
  py::object broadcast_;
  py::object all_gather_;
};

OnBusy ParseOnBusy(const std::string& value) {
  if (value == "wait") return OnBusy::kWait;
  if (value == "skip") return OnBusy::kSkip;
  throw StatusError(
      Status::InvalidArgument("on_busy must be 'wait' or 'skip', got '" + value + "'"));
}

OnError ParseOnError(const std::string& value) {
  if (value == "stop") return OnError::kStop;
  if (value == "continue") return OnError::kContinue;
  throw StatusError(
      Status::InvalidArgument("on_error must be 'stop' or 'continue', got '" + value + "'"));
}

BestMode ParseBestMode(const std::string& value) {
  if (value == "none") return BestMode::kNone;
  if (value == "max") return BestMode::kMax;
  if (value == "min") return BestMode::kMin;
  throw StatusError(
      Status::InvalidArgument("best_mode must be 'none', 'max' or 'min', got '" + value + "'"));
}

const char* BestModeName(BestMode mode) {
  return mode == BestMode::kMax ? "max" : mode == BestMode::kMin ? "min" : "none";
}

CompressionKind ParseCompression(const std::string& value) {
  std::optional<CompressionKind> kind = ParseCompressionKind(value);
  if (!kind) {
    throw StatusError(Status::InvalidArgument(
        "compression must be 'none', 'zstd' or 'shuffle+zstd', got '" + value + "'"));
  }
  return *kind;
}

py::dict SaveStatsToDict(const SaveStats& stats) {
  py::dict out;
  out["step"] = stats.step;
  out["path"] = stats.path;
  out["ok"] = stats.status.ok();
  out["error"] = stats.status.ok() ? py::object(py::none()) : py::str(stats.status.ToString());
  out["bytes_raw"] = stats.bytes_raw;
  out["bytes_stored"] = stats.bytes_stored;
  out["chunks_by_codec"] = stats.chunks_by_codec;
  out["final_level"] = stats.final_level;
  out["switched_to_raw"] = stats.switched_to_raw;
  out["blocked_seconds"] = stats.blocked_seconds;
  out["seconds_to_durable"] = stats.seconds_to_durable;
  return out;
}

py::dict TotalsToDict(const SaverTotals& totals) {
  py::dict out;
  out["saves_committed"] = totals.saves_committed;
  out["saves_failed"] = totals.saves_failed;
  out["saves_skipped"] = totals.saves_skipped;
  out["blocked_seconds_total"] = totals.blocked_seconds_total;
  out["blocked_seconds_max"] = totals.blocked_seconds_max;
  out["bytes_raw"] = totals.bytes_raw;
  out["bytes_stored"] = totals.bytes_stored;
  out["staging_high_water_bytes"] = totals.staging_high_water_bytes;
  out["startup_seconds"] = totals.startup_seconds;
  out["stale_temporaries_removed"] = totals.stale_temporaries_removed;
  py::list saves;
  for (const SaveStats& stats : totals.saves) saves.append(SaveStatsToDict(stats));
  out["saves"] = saves;
  return out;
}

// A reader, and the checkpointer it came from when it did (kept alive: the reader's pin on its
// checkpoint is released through it).
class PyReader {
 public:
  PyReader(std::unique_ptr<CheckpointReader> reader, py::object owner)
      : reader_(std::move(reader)), owner_(std::move(owner)) {}

  ~PyReader() {
    // The reader may unpin through the owner's manager: gone before the owner is released.
    reader_.reset();
  }

  const std::string& path() const { return reader_->path(); }
  int64_t step() const { return reader_->metadata().step; }
  double wall_time() const { return reader_->metadata().wall_time; }
  std::map<std::string, std::string> metadata() const { return reader_->metadata().user; }

  // (name, dtype name, shape, bytes, stored bytes) for every tensor, in name order.
  py::list tensors() const {
    py::list out;
    for (const TensorInfo& info : reader_->tensors()) {
      out.append(py::make_tuple(info.name, std::string(DTypeName(info.dtype)), info.shape,
                                info.bytes, info.stored_bytes));
    }
    return out;
  }

  // Reads every described tensor into its memory, verified; names, dtypes and shapes must
  // match the checkpoint.
  void read_into(const std::vector<TensorSpec>& specs, const ShardBoxes& boxes) {
    TensorRegistry registry = ToRegistry(specs, boxes);
    Check(WithoutGil([&] { return reader_->restore(registry); }));
  }

  // What this reader has read so far: {"bytes_read": ..., "chunks_read": ...}.
  py::dict read_stats() const {
    const ReadStats stats = reader_->read_stats();
    py::dict out;
    out["bytes_read"] = stats.bytes_read;
    out["chunks_read"] = stats.chunks_read;
    return out;
  }

  std::vector<std::string> verify() {
    return WithoutGil([&] { return reader_->verify().problems; });
  }

 private:
  std::unique_ptr<CheckpointReader> reader_;
  py::object owner_;
};

// The Checkpointer, serialised: its methods are for one thread at a time, and Python threads
// run them with the GIL released.
class PyCheckpointer {
  // Runs `work` on the checkpointer without the GIL, one thread at a time. (First in the class:
  // its return type is deduced, so it must be defined before the methods that call it.)
  template <typename Work>
  auto Locked(Work&& work) {
    return WithoutGilLocked(mu_, std::forward<Work>(work));
  }

 public:
  PyCheckpointer(std::unique_ptr<Checkpointer> checkpointer,
                 std::shared_ptr<PyCoordinator> coordinator)
      : coordinator_(std::move(coordinator)), checkpointer_(std::move(checkpointer)) {}

  ~PyCheckpointer() {
    // Waits for saves in flight; without the GIL, so that nothing the engine's threads need
    // is held up.
    Locked([&] { checkpointer_.reset(); });
  }

  // Called at every step by maybe_save, so it keeps the GIL (handing it over and taking it back
  // would let other Python threads delay the training thread): it does no I/O. Waits, holding
  // the GIL, only while another thread is inside a save, which never needs the GIL.
  //
  // The failure that stopped the checkpointer, raised; else whether a save is due at `step`.
  bool check_due(int64_t step) {
    std::lock_guard lock(mu_);
    if (checkpointer_->due(step)) return true;
    // Not due: maybe_save only reports a failure, and saves nothing.
    Take(checkpointer_->maybe_save(step, TensorRegistry()));
    return false;
  }

  // Whether a save is due at `step` by the C++ timer (save_secs); asks nothing else.
  bool due(int64_t step) {
    std::lock_guard lock(mu_);
    return checkpointer_->due(step);
  }

  void save(int64_t step, const std::vector<TensorSpec>& specs,
            const std::map<std::string, std::string>& metadata, const ShardBoxes& boxes) {
    TensorRegistry registry = ToRegistry(specs, boxes);
    Check(Locked([&] { return checkpointer_->save(step, registry, metadata); }));
  }

  void prepare(const std::vector<TensorSpec>& specs, uint64_t reserve_bytes,
               const ShardBoxes& boxes) {
    TensorRegistry registry = ToRegistry(specs, boxes);
    Check(Locked([&] { return checkpointer_->prepare(registry, reserve_bytes); }));
  }

  bool prepare_like_latest() {
    return Take(Locked([&] { return checkpointer_->prepare_like_latest(); }));
  }

  bool maybe_save(int64_t step, const std::vector<TensorSpec>& specs,
                  const std::map<std::string, std::string>& metadata, const ShardBoxes& boxes) {
    TensorRegistry registry = ToRegistry(specs, boxes);
    return Take(Locked([&] { return checkpointer_->maybe_save(step, registry, metadata); }));
  }

  void wait_until_finished() {
    Check(Locked([&] { return checkpointer_->wait_until_finished(); }));
  }

  void close() {
    Check(Locked([&] { return checkpointer_->close(); }));
  }

  // Thread-safe in the Checkpointer, so it takes no lock: a wait for a save to finish must not
  // queue behind the next save of the training thread.
  bool wait_for_finished_saves(int64_t finished, double timeout_seconds) const {
    return WithoutGil(
        [&] { return checkpointer_->wait_for_finished_saves(finished, timeout_seconds); });
  }

  // These four are thread-safe in the Checkpointer: no wait behind a save in progress.
  py::dict totals() const { return TotalsToDict(checkpointer_->totals()); }
  std::vector<int64_t> all_steps() const { return checkpointer_->all_steps(); }
  std::optional<int64_t> latest_step() const { return checkpointer_->latest_step(); }
  std::string checkpoint_path(int64_t step) const { return checkpointer_->checkpoint_path(step); }
  std::vector<std::string> damaged() const { return Take(checkpointer_->damaged()); }

  std::unique_ptr<CheckpointReader> open(std::optional<int64_t> step) {
    return Take(Locked([&] { return checkpointer_->open(step); }));
  }

  // Issue 31: a checkpoint a restore found damaged leaves the list (Checkpointer::quarantine).
  void quarantine(int64_t step, const std::string& why) {
    Check(Locked([&] { return checkpointer_->quarantine(step, why); }));
  }

 private:
  std::mutex mu_;
  std::shared_ptr<PyCoordinator> coordinator_;  // before checkpointer_: outlives it
  std::unique_ptr<Checkpointer> checkpointer_;
};

// The Python manager's options: SaverOptions itself, bound field by field in the module below
// (the one list of them; their defaults are SaverOptions', their ranges checked by Create).
std::unique_ptr<PyCheckpointer> MakeCheckpointer(
    const std::string& directory, SaverOptions options, bool asynchronous,
    std::optional<std::shared_ptr<PyCoordinator>> given) {
  std::shared_ptr<PyCoordinator> coordinator = given.value_or(nullptr);
  options.checkpoint_dir = directory;
  options.coordinator = coordinator.get();
  // The Python layer places the compute stream's wait itself: before the optimizer's update
  // when a step pre-hook is registered, else right after the save.
  options.cuda_defer_compute_wait = options.cuda_stream_ordered;
  // Constructing a manager only reads: the lock, clean-up and quarantine come at its first save.
  return std::make_unique<PyCheckpointer>(
      Take(WithoutGil([&] {
        return Checkpointer::Create(std::move(options),
                                    asynchronous ? SaveMode::kAsynchronous : SaveMode::kSynchronous,
                                    CheckpointerStart::kAtFirstSave);
      })),
      std::move(coordinator));
}

// Binds SaverOptions' fields that a Python caller sets, under the manager's names.
void BindSaverOptions(py::module_& m) {
  py::class_<SaverOptions>(m, "SaverOptions",
                           "The C++ SaverOptions: every option of CheckpointManager but the "
                           "directory, the schedule's Orbax rule and the save mode.")
      .def(py::init<>())
      .def_readwrite("save_steps", &SaverOptions::save_steps,
                     "TensorFlow's rule: the first step seen, then N steps after the last save.")
      .def_readwrite("save_secs", &SaverOptions::save_secs,
                     "The first step seen, then the first step N seconds after the last save.")
      .def_readwrite("max_to_keep", &SaverOptions::max_to_keep,
                     "Keep the newest N checkpoints; 0 keeps all.")
      .def_readwrite("keep_checkpoint_every_n_hours", &SaverOptions::keep_checkpoint_every_n_hours,
                     "Of those past max_to_keep, keep one every N hours (0: none).")
      .def_readwrite("keep_period", &SaverOptions::keep_period,
                     "Never delete a checkpoint whose step % keep_period == 0 (0: none).")
      .def_property(
          "best_mode", [](const SaverOptions& o) { return BestModeName(o.best_mode); },
          [](SaverOptions& o, const std::string& value) { o.best_mode = ParseBestMode(value); },
          "'none' (keep the newest max_to_keep), or 'max' / 'min': keep the max_to_keep best "
          "by each save's RETENTION_SCORE_KEY metadata (the manager's best_fn sets it).")
      .def_property(
          "compression",
          [](const SaverOptions& o) {
            return std::string(CompressionKindName(o.compression.kind));
          },
          [](SaverOptions& o, const std::string& value) {
            o.compression.kind = ParseCompression(value);
          },
          "'none', 'zstd' or 'shuffle+zstd' (a chunk that does not shrink is stored raw).")
      .def_property(
          "compression_level", [](const SaverOptions& o) { return o.compression.level; },
          [](SaverOptions& o, int level) { o.compression.level = level; }, "zstd's level.")
      .def_readwrite("staging_bytes", &SaverOptions::staging_bytes,
                     "Pinned staging budget; 0 sizes it for one snapshot of the state.")
      .def_property(
          "on_busy",
          [](const SaverOptions& o) { return o.on_busy == OnBusy::kWait ? "wait" : "skip"; },
          [](SaverOptions& o, const std::string& value) { o.on_busy = ParseOnBusy(value); },
          "'wait' or 'skip' when a save is due while staging is busy.")
      .def_property(
          "on_error",
          [](const SaverOptions& o) { return o.on_error == OnError::kStop ? "stop" : "continue"; },
          [](SaverOptions& o, const std::string& value) { o.on_error = ParseOnError(value); },
          "'stop' (raise at the next call, save nothing more) or 'continue' (warn).")
      .def_readwrite("basename", &SaverOptions::basename,
                     "Checkpoints are named <basename>-<step>.")
      .def_readwrite("chunk_bytes", &SaverOptions::chunk_bytes,
                     "Tensors are cut into chunks of at most this many bytes.")
      .def_readwrite("num_data_files", &SaverOptions::num_data_files,
                     "Data files a checkpoint is spread over, written concurrently.")
      .def_readwrite("background_threads", &SaverOptions::background_threads,
                     "Threads that copy and encode (0: the machine's cores).")
      .def_readwrite("queue_depth", &SaverOptions::queue_depth, "Most writes in flight at once.")
      .def_readwrite("use_o_direct", &SaverOptions::use_o_direct,
                     "Write with O_DIRECT where the file system allows it.")
      .def_readwrite("force_posix_io", &SaverOptions::force_posix_io,
                     "The POSIX backend even where io_uring works.")
      .def_readwrite("metadata", &SaverOptions::user_metadata,
                     "Key/values stored in every checkpoint's metadata.")
      .def_readwrite("allow_fresh_start", &SaverOptions::allow_fresh_start,
                     "Start although the directory holds only damaged checkpoints.")
      .def_readwrite("cuda_stream_ordered", &SaverOptions::cuda_stream_ordered,
                     "Return from a save once the GPU copies are enqueued.");
}

// A torch stream handle as the CUDA device takes it: torch's default stream is the legacy
// default stream, handle 0, which SetCudaComputeStream would read as "off"; CUDA names it
// cudaStreamLegacy, 0x1 (driver_types.h), for explicit use.
void* CudaStreamOf(uintptr_t torch_stream) {
  constexpr uintptr_t kCudaStreamLegacy = 0x1;
  return reinterpret_cast<void*>(torch_stream == 0 ? kCudaStreamLegacy : torch_stream);
}

// Stream-ordered mode: the snapshot copies on GPU `ordinal` are ordered after the work queued on
// `stream` (torch's Stream.cuda_stream) so far; None turns the ordering off.
void SetComputeStream(int ordinal, std::optional<uintptr_t> stream) {
  std::shared_ptr<Device> device = CudaDevice(ordinal);
  Check(WithoutGil(
      [&] { return SetCudaComputeStream(*device, stream ? CudaStreamOf(*stream) : nullptr); }));
}

// Makes `stream` wait, on the GPU, for every snapshot copy started on GPU `ordinal`, and turns
// the ordering off again, so that no stream outlives its use in the device.
void WaitForCopiesOnStream(int ordinal, uintptr_t stream) {
  std::shared_ptr<Device> device = CudaDevice(ordinal);
  Check(WithoutGil([&] {
    Status status = SetCudaComputeStream(*device, CudaStreamOf(stream));
    if (status.ok()) status = WaitForCopiesOnComputeStream(*device);
    Status cleared = SetCudaComputeStream(*device, nullptr);
    return status.ok() ? cleared : status;
  }));
}

// ExportSafetensors: (the files written, tensors, bytes).
std::tuple<std::vector<std::string>, uint64_t, uint64_t> ExportToSafetensors(
    const std::string& checkpoint, const std::string& out_dir, const std::string& select,
    uint64_t max_shard_bytes, bool keep_names) {
  SafetensorsExportOptions options;
  options.select = select;
  options.max_shard_bytes = max_shard_bytes;
  options.keep_names = keep_names;
  SafetensorsExportReport report =
      Take(WithoutGil([&] { return ExportSafetensors(checkpoint, out_dir, options); }));
  return {std::move(report.files), report.tensors, report.bytes};
}

// ImportSafetensors: the checkpoint's path.
std::string ImportFromSafetensors(const std::string& input, const std::string& checkpoint_dir,
                                  int64_t step, const std::string& basename,
                                  const std::string& prefix, const std::string& compression) {
  SafetensorsImportOptions options;
  options.step = step;
  options.basename = basename;
  options.prefix = prefix;
  options.compression.kind = ParseCompression(compression);
  return Take(WithoutGil([&] { return ImportSafetensors(input, checkpoint_dir, options); }));
}

std::unique_ptr<PyReader> OpenReader(const std::string& path, bool force_posix_io) {
  ReaderOptions options;
  options.force_posix_io = force_posix_io;
  return std::make_unique<PyReader>(
      Take(WithoutGil([&] { return CheckpointReader::Open(path, options); })), py::none());
}

}  // namespace
}  // namespace asyncckpt::python

PYBIND11_MODULE(_core, m) {
  using namespace asyncckpt;
  using namespace asyncckpt::python;
  m.doc() = "asyncckpt's C++ engine; use the `asyncckpt` package, not this module.";
  // chunk_bytes' range, defined in asyncckpt/limits.h (the defaults are SaverOptions()'s).
  m.attr("MIN_CHUNK_BYTES") = kMinChunkBytes;
  m.attr("MAX_CHUNK_BYTES") = kMaxChunkBytes;
  // The metadata key of a save's score for best-N retention (asyncckpt/state.h).
  m.attr("RETENTION_SCORE_KEY") = kRetentionScoreKey;

  checkpoint_error = PyErr_NewExceptionWithDoc(
      "asyncckpt.CheckpointError",
      "A checkpoint could not be saved or read (I/O, corruption, a failed background save).",
      PyExc_RuntimeError, nullptr);
  m.add_object("CheckpointError", py::handle(checkpoint_error));
  py::register_exception_translator(&TranslateStatusError);

  py::class_<PyReader>(m, "Reader")
      .def_property_readonly("path", &PyReader::path)
      .def_property_readonly("step", &PyReader::step)
      .def_property_readonly("wall_time", &PyReader::wall_time)
      .def("metadata", &PyReader::metadata)
      .def("tensors", &PyReader::tensors)
      .def("read_into", &PyReader::read_into, py::arg("specs"), py::arg("boxes") = ShardBoxes{})
      .def("read_stats", &PyReader::read_stats)
      .def("verify", &PyReader::verify);

  py::class_<PyCoordinator, std::shared_ptr<PyCoordinator>>(
      m, "Coordinator",
      "A job's processes for the C++ Checkpointer: this rank, the number of ranks, and the two "
      "collectives as callables (broadcast(bytes, root) -> bytes, all_gather(bytes) -> list of "
      "bytes in rank order).")
      .def(py::init<int, int, py::function, py::function>(), py::arg("rank"), py::arg("size"),
           py::arg("broadcast"), py::arg("all_gather"))
      .def_property_readonly("rank", &PyCoordinator::rank)
      .def_property_readonly("size", &PyCoordinator::size);
  BindSaverOptions(m);
  py::class_<PyCheckpointer>(m, "Checkpointer")
      .def(py::init(&MakeCheckpointer), py::arg("directory"), py::arg("options"),
           py::arg("asynchronous"), py::arg("coordinator") = std::nullopt)
      .def("check_due", &PyCheckpointer::check_due, py::arg("step"))
      .def("due", &PyCheckpointer::due, py::arg("step"))
      .def("save", &PyCheckpointer::save, py::arg("step"), py::arg("specs"), py::arg("metadata"),
           py::arg("boxes") = ShardBoxes{})
      .def("prepare", &PyCheckpointer::prepare, py::arg("specs"), py::arg("reserve_bytes") = 0,
           py::arg("boxes") = ShardBoxes{})
      .def("prepare_like_latest", &PyCheckpointer::prepare_like_latest)
      .def("maybe_save", &PyCheckpointer::maybe_save, py::arg("step"), py::arg("specs"),
           py::arg("metadata"), py::arg("boxes") = ShardBoxes{})
      .def("wait_until_finished", &PyCheckpointer::wait_until_finished)
      .def("wait_for_finished_saves", &PyCheckpointer::wait_for_finished_saves, py::arg("finished"),
           py::arg("timeout_seconds"))
      .def("close", &PyCheckpointer::close)
      .def("totals", &PyCheckpointer::totals)
      .def("all_steps", &PyCheckpointer::all_steps)
      .def("latest_step", &PyCheckpointer::latest_step)
      .def("checkpoint_path", &PyCheckpointer::checkpoint_path, py::arg("step"))
      .def("damaged", &PyCheckpointer::damaged)
      .def("quarantine", &PyCheckpointer::quarantine, py::arg("step"), py::arg("why"))
      .def(
          "open",
          [](py::object self, std::optional<int64_t> step) {
            auto reader = self.cast<PyCheckpointer&>().open(step);
            return std::make_unique<PyReader>(std::move(reader), self);
          },
          py::arg("step"));

  // Issue 31: what a resume in a directory would use (FindResumeCheckpoints).
  m.def(
      "find_resume_checkpoints",
      [](const std::string& directory, const std::string& basename) {
        ResumeCheckpoints r =
            Take(WithoutGil([&] { return FindResumeCheckpoints(directory, basename); }));
        return py::dict(py::arg("basename") = r.basename, py::arg("steps") = r.steps,
                        py::arg("latest_path") = r.latest_path, py::arg("skipped") = r.skipped,
                        py::arg("state_file_problem") = r.state_file_problem);
      },
      py::arg("directory"), py::arg("basename") = "",
      "The checkpoints a resume in `directory` may use, in save order (FileNotFoundError when "
      "there is none to resume, CheckpointError when only damaged ones).");
  m.def(
      "latest_checkpoint",
      [](const std::string& directory) -> std::optional<std::string> {
        Result<ResumeCheckpoints> resume =
            WithoutGil([&] { return FindResumeCheckpoints(directory); });
        if (!resume.ok() && resume.status().code() == StatusCode::kNotFound) return std::nullopt;
        return Take(std::move(resume)).latest_path;
      },
      py::arg("directory"),
      "The path of the checkpoint a resume in `directory` would use, or None when there is none "
      "(CheckpointError when there are only damaged ones).");
  m.def("open_reader", &OpenReader, py::arg("path"), py::arg("force_posix_io") = false,
        "Opens the checkpoint directory at `path`.");
  m.def("export_safetensors", &ExportToSafetensors, py::arg("checkpoint"), py::arg("out_dir"),
        py::arg("select"), py::arg("max_shard_bytes"), py::arg("keep_names"),
        "The tensors of a checkpoint as safetensors files: (files, tensors, bytes).");
  m.def("import_safetensors", &ImportFromSafetensors, py::arg("input"), py::arg("checkpoint_dir"),
        py::arg("step"), py::arg("basename"), py::arg("prefix"), py::arg("compression"),
        "A checkpoint made from safetensors files: its path.");
  m.def("capture_log", &CaptureLog, py::arg("capture"),
        "True: queue the library's log lines for take_log_lines; False: print them on stderr.");
  m.def(
      "take_log_lines", [] { return Log().Take(); },
      "([(Python logging level, line)] logged since the last call, oldest first; lines "
      "dropped because the queue was full).");
  m.def("cuda_available", &CudaAvailable,
        "True when this build has the CUDA device and a GPU is visible.");
  m.def("set_cuda_compute_stream", &SetComputeStream, py::arg("ordinal"), py::arg("stream"),
        "Stream-ordered mode: GPU `ordinal`'s snapshot copies follow the work queued on "
        "`stream` (torch's Stream.cuda_stream); None turns that off.");
  m.def("wait_for_copies_on_stream", &WaitForCopiesOnStream, py::arg("ordinal"), py::arg("stream"),
        "Makes `stream` wait (on the GPU, not the host) for GPU `ordinal`'s snapshot copies.");
  m.def(
      "dtype_size",
      [](const std::string& name) {
        std::optional<DType> dtype = ParseDType(name);
        if (!dtype) Check(Status::InvalidArgument("unknown dtype '" + name + "'"));
        return DTypeSize(*dtype);
      },
      py::arg("name"), "Bytes per element of a dtype short name ('f32', 'bf16', ...).");
}
