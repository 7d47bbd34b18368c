#include "src/cli/shard_job.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "asyncckpt/reader.h"
#include "asyncckpt/state.h"
#include "src/cli/shard_resume.h"
#include "src/format/format.h"
#include "src/saver/coordination.h"
#include "src/util/log.h"
#include "src/util/status_macros.h"

#if ASYNCCKPT_CLI_MPI
#include <mpi.h>

#include "asyncckpt/mpi_coordinator.h"
#endif

namespace asyncckpt::cli {

namespace {

template <typename T>
void Append(std::vector<uint8_t>& bytes, const T& value) {
  const auto* p = reinterpret_cast<const uint8_t*>(&value);
  bytes.insert(bytes.end(), p, p + sizeof(T));
}

template <typename T>
bool Take(const std::vector<uint8_t>& bytes, size_t* at, T* value) {
  if (*at > bytes.size() || bytes.size() - *at < sizeof(T)) return false;
  std::memcpy(value, bytes.data() + *at, sizeof(T));
  *at += sizeof(T);
  return true;
}

// One rank's slice of one tensor, as it travels through all_gather: the slice's first global
// index along dimension 0, its name, then its bytes. All ranks run the same binary on machines
// of one byte order, so integers travel in host order.
std::vector<uint8_t> EncodeSlice(const TensorRef& tensor) {
  std::vector<uint8_t> bytes;
  Append(bytes, static_cast<int64_t>(tensor.global_offset[0]));
  Append(bytes, static_cast<uint64_t>(tensor.name.size()));
  bytes.insert(bytes.end(), tensor.name.begin(), tensor.name.end());
  const auto* data = static_cast<const uint8_t*>(tensor.data);
  bytes.insert(bytes.end(), data, data + tensor.bytes);
  return bytes;
}

struct Slice {
  int64_t begin = 0;
  std::string name;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

Result<Slice> DecodeSlice(const std::vector<uint8_t>& bytes, int rank) {
  Slice slice;
  size_t at = 0;
  uint64_t name_size = 0;
  if (!Take(bytes, &at, &slice.begin) || !Take(bytes, &at, &name_size) ||
      name_size > bytes.size() - at) {
    return Status::Corruption("rank " + std::to_string(rank) + " sent a truncated tensor slice");
  }
  slice.name.assign(reinterpret_cast<const char*>(bytes.data() + at), name_size);
  at += name_size;
  slice.data = bytes.data() + at;
  slice.bytes = bytes.size() - at;
  return slice;
}

// InvalidArgument unless `tensor` is a host slice of its global tensor along dimension 0.
Status CheckDim0Slice(const TensorRef& tensor) {
  const bool sliced = IsShard(tensor) && tensor.global_shape.size() == tensor.shape.size() &&
                      tensor.global_offset.size() == tensor.shape.size() && !tensor.shape.empty();
  bool rest_whole = sliced;
  for (size_t d = 1; sliced && d < tensor.shape.size(); ++d) {
    rest_whole =
        rest_whole && tensor.global_offset[d] == 0 && tensor.shape[d] == tensor.global_shape[d];
  }
  if (!rest_whole || tensor.device != nullptr) {
    return Status::InvalidArgument(
        "the global digest needs host tensors sliced along dimension "
        "0 only; '" +
        tensor.name + "' is not one");
  }
  return Status::OK();
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

#if ASYNCCKPT_CLI_MPI

namespace {

// Open MPI reads a boolean MCA value in any of these spellings.
bool McaTrue(const char* value) {
  std::string lower(value);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower == "1" || lower == "true" || lower == "t" || lower == "yes" || lower == "y" ||
         lower == "enabled";
}

// The launcher's own name, so that a rank started by anything else (a shell, a debugger) is
// never the one signalled.
bool IsOpenMpiLauncher(pid_t pid) {
  std::FILE* comm = std::fopen(("/proc/" + std::to_string(pid) + "/comm").c_str(), "r");
  if (comm == nullptr) return false;
  char name[32] = {};
  const bool read = std::fgets(name, sizeof(name), comm) != nullptr;
  std::fclose(comm);
  if (!read) return false;
  const std::string_view launcher(name, std::strcspn(name, "\n"));
  return launcher == "mpirun" || launcher == "mpiexec" || launcher == "orterun" ||
         launcher == "orted" || launcher == "prterun" || launcher == "prted";
}

// What this rank printed reaches the job's output only once the launcher has read it from the
// rank's stderr pipe and written it out; a launcher ended before that drops it (CI lost a usage
// error so). Bounded, since a launcher that stopped reading must still be ended.
void WaitForStderrToBeRead(std::chrono::milliseconds limit) {
  struct stat status {};
  if (::fstat(STDERR_FILENO, &status) != 0 || !S_ISFIFO(status.st_mode)) return;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int pending = 0;
  while (::ioctl(STDERR_FILENO, FIONREAD, &pending) == 0 && pending > 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Read is not yet written: the launcher writes it out on its event loop's next turn.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// Whether `launcher` is still this process's parent and alive, so that ending it is still needed.
bool LauncherStillThere(pid_t launcher) {
  return ::getppid() == launcher && ::kill(launcher, 0) == 0;
}

}  // namespace

bool ShardJobsSupported() { return true; }

// Under orte_enable_recovery, Open MPI 4.1's mpirun exits 0 whatever its processes return or
// however they abort (measured: `mpirun --mca orte_enable_recovery 1 -np 2 sh -c 'exit 3'`
// exits 0), so a scheduler would record a failed job as done. mpirun ended by SIGTERM exits 1
// and takes the job's processes with it; a remote rank's parent is its node's orted, whose loss
// mpirun counts as a failure of the job. This process then ends without MPI_Finalize: a rank in
// MPI_Finalize while mpirun aborts left mpirun deadlocked in PMIx_server_finalize, its ranks
// reaped and SIGTERM no longer heard (seen under ASan, about one run in eight on a loaded
// machine).
void MpiSession::FailTheLaunch(int exit_code, std::chrono::milliseconds after_others) {
  const char* recovery = std::getenv("OMPI_MCA_orte_enable_recovery");
  if (recovery == nullptr || !McaTrue(recovery)) return;
  const pid_t launcher = ::getppid();
  if (!IsOpenMpiLauncher(launcher)) return;
  std::fflush(stdout);
  std::fflush(stderr);
  WaitForStderrToBeRead(std::chrono::seconds(2));
  // The rank that printed the job's error ends the launcher; the others wait for it to, so that
  // their SIGTERM cannot cut that rank's line off, and end it themselves only if it does not.
  const auto deadline = std::chrono::steady_clock::now() + after_others;
  while (LauncherStillThere(launcher) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (LauncherStillThere(launcher)) {
    std::fprintf(stderr,
                 "asyncckpt train-sim: the job failed under orte_enable_recovery, whose mpirun "
                 "would exit 0; ending the launcher (pid %d) so that it exits non-zero\n",
                 static_cast<int>(launcher));
    std::fflush(stderr);
    WaitForStderrToBeRead(std::chrono::seconds(2));
    ::kill(launcher, SIGTERM);
  }
  std::_Exit(exit_code);
}

Result<std::unique_ptr<MpiSession>> MpiSession::Start(double timeout_seconds) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    // The hooks call the Coordinator from the training thread only, and the commit's
    // rendezvous is the file system: no background thread ever calls MPI.
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      return Status::Unavailable("MPI_Init_thread failed");
    }
  }
  std::unique_ptr<MpiSession> session(new MpiSession());
  MpiCoordinatorOptions options;
  options.timeout_seconds = timeout_seconds;
  auto coordinator = NewMpiCoordinator(MPI_COMM_WORLD, options);
  if (!coordinator.ok()) return coordinator.status().WithContext("starting the MPI coordinator");
  session->coordinator_ = std::move(coordinator).value();
  return session;
}

MpiSession::~MpiSession() {
  coordinator_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiSession::Abort(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  FailTheLaunch(exit_code);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

#else

bool ShardJobsSupported() { return false; }

Result<std::unique_ptr<MpiSession>> MpiSession::Start(double /*timeout_seconds*/) {
  return Status::FailedPrecondition(
      "--shard runs under mpirun and needs asyncckpt built with MPI (CMake option "
      "ASYNCCKPT_MPI, on when Open MPI's libopenmpi-dev is found); this build has none");
}

MpiSession::~MpiSession() = default;

void MpiSession::Abort(int exit_code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(exit_code);
}

void MpiSession::FailTheLaunch(int /*exit_code*/, std::chrono::milliseconds /*after_others*/) {}

#endif

Result<uint64_t> GlobalDigest(Coordinator& coordinator, const TensorRegistry& registry) {
  for (const TensorRef& tensor : registry.tensors()) RETURN_IF_ERROR(CheckDim0Slice(tensor));
  // Every rank must walk the same names, or the all_gathers below would pair different tensors.
  std::vector<uint8_t> count;
  Append(count, static_cast<uint64_t>(registry.size()));
  ASSIGN_OR_RETURN(auto counts, coordinator.all_gather(count));
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] != count) {
      return Status::FailedPrecondition("rank " + std::to_string(r) +
                                        " holds another number of tensors than rank " +
                                        std::to_string(coordinator.rank()));
    }
  }
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  Status status;
  for (const TensorRef& tensor : registry.tensors()) {
    auto gathered = coordinator.all_gather(EncodeSlice(tensor));
    if (!gathered.ok()) {
      status = gathered.status();
      break;
    }
    std::vector<Slice> slices;
    for (size_t r = 0; r < gathered->size() && status.ok(); ++r) {
      auto slice = DecodeSlice((*gathered)[r], static_cast<int>(r));
      if (!slice.ok()) {
        status = slice.status();
      } else if (slice->name != tensor.name) {
        status = Status::FailedPrecondition("rank " + std::to_string(r) + " holds '" + slice->name +
                                            "' where this rank holds '" + tensor.name + "'");
      } else {
        slices.push_back(std::move(slice).value());
      }
    }
    if (!status.ok()) break;
    std::stable_sort(slices.begin(), slices.end(),
                     [](const Slice& a, const Slice& b) { return a.begin < b.begin; });
    // Replicas of one slice (same first index) are hashed once; anything else must tile.
    const uint64_t row_bytes =
        tensor.shape[0] > 0 ? tensor.bytes / static_cast<uint64_t>(tensor.shape[0]) : 0;
    int64_t next = 0;
    for (const Slice& slice : slices) {
      if (slice.begin < next) continue;
      if (slice.begin != next) {
        status = Status::FailedPrecondition("the ranks' slices of '" + tensor.name +
                                            "' leave rows " + std::to_string(next) + " to " +
                                            std::to_string(slice.begin - 1) + " uncovered");
        break;
      }
      XXH3_64bits_update(state, slice.data, slice.bytes);
      next = slice.begin + (row_bytes ? static_cast<int64_t>(slice.bytes / row_bytes) : 0);
    }
    if (status.ok() && next != tensor.global_shape[0]) {
      status = Status::FailedPrecondition("the ranks' slices of '" + tensor.name + "' cover " +
                                          std::to_string(next) + " of its " +
                                          std::to_string(tensor.global_shape[0]) + " rows");
    }
    if (!status.ok()) break;
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  RETURN_IF_ERROR(status);
  return digest;
}

Result<double> RankZeroValue(Coordinator& coordinator, double value) {
  std::vector<uint8_t> bytes;
  Append(bytes, value);
  RETURN_IF_ERROR(coordinator.broadcast(bytes, 0));
  double agreed = 0;
  size_t at = 0;
  if (!Take(bytes, &at, &agreed)) return Status::Corruption("rank 0 broadcast a short value");
  return agreed;
}

// Rank 0's end (AgreeOnEnd) may come in place of its time: the broadcast is checked for it.
Result<double> StepClock(Coordinator& coordinator, double now, int64_t step) {
  std::vector<uint8_t> bytes;
  Append(bytes, now);
  RETURN_IF_ERROR(coordinator.broadcast(bytes, 0));
  RETURN_IF_ERROR(CheckNotRankZerosEnd(coordinator, bytes, step));
  double agreed = 0;
  size_t at = 0;
  if (!Take(bytes, &at, &agreed)) return Status::Corruption("rank 0 broadcast a short value");
  return agreed;
}

Result<std::vector<uint64_t>> GatherValues(Coordinator& coordinator, uint64_t value) {
  std::vector<uint8_t> bytes;
  Append(bytes, value);
  ASSIGN_OR_RETURN(auto gathered, coordinator.all_gather(bytes));
  std::vector<uint64_t> values;
  for (size_t r = 0; r < gathered.size(); ++r) {
    uint64_t v = 0;
    size_t at = 0;
    if (!Take(gathered[r], &at, &v)) {
      return Status::Corruption("rank " + std::to_string(r) + " sent a short value");
    }
    values.push_back(v);
  }
  return values;
}

Result<std::unique_ptr<ShardedSessionCreator>> ShardedSessionCreator::Create(
    ShardedSessionCreatorOptions options, Coordinator* coordinator,
    const TensorRegistry* registry) {
  if (options.checkpoint_dir.empty()) {
    return Status::InvalidArgument("ShardedSessionCreator needs a checkpoint_dir");
  }
  if (coordinator == nullptr || registry == nullptr) {
    return Status::InvalidArgument("ShardedSessionCreator needs a coordinator and a registry");
  }
  return std::unique_ptr<ShardedSessionCreator>(
      new ShardedSessionCreator(std::move(options), coordinator, registry));
}

Status ShardedSessionCreator::Restore(int64_t step) {
  const std::string path =
      options_.checkpoint_dir + "/" + format::CheckpointDirName(options_.model_basename, step);
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(path));
  if (reader->metadata().step != step) {
    return Status::Corruption(path + " holds the state of step " +
                              std::to_string(reader->metadata().step) + ", not of step " +
                              std::to_string(step) + " as its name says");
  }
  RETURN_IF_ERROR(reader->restore(*registry_).WithContext("restoring " + path));
  restore_bytes_read_ = reader->read_stats().bytes_read;
  restore_seconds_ = Seconds(std::chrono::steady_clock::now() - start);
  restored_from_ = path;
  restored_step_ = step;
  return Status::OK();
}

namespace {

// Rank 0's decision, as it travels: ok, a step found, a checkpoint past step 0 exists, the
// step and the world size that saved it, then rank 0's error message when not ok, or why no
// step can be resumed.
std::vector<uint8_t> EncodeDecision(const Result<std::optional<ResumePoint>>& point, bool any_found,
                                    const std::string& why_none) {
  std::vector<uint8_t> bytes;
  const bool found = point.ok() && point->has_value();
  Append(bytes, static_cast<uint8_t>(point.ok() ? 1 : 0));
  Append(bytes, static_cast<uint8_t>(found ? 1 : 0));
  Append(bytes, static_cast<uint8_t>(any_found ? 1 : 0));
  Append(bytes, found ? (*point)->step : int64_t{0});
  Append(bytes, found ? (*point)->saved_world_size : uint32_t{0});
  const std::string message = point.ok() ? why_none : point.status().ToString();
  bytes.insert(bytes.end(), message.begin(), message.end());
  return bytes;
}

}  // namespace

// Rank 0 alone reads the directory, so that every rank resumes the same step even while files
// change under them. Collective.
Result<ShardedSessionCreator::Decision> ShardedSessionCreator::Decide() {
  std::vector<uint8_t> bytes;
  if (coordinator_->rank() == 0) {
    const bool with_input = !options_.input_basename.empty();
    auto point = NewestResumePoint(options_.checkpoint_dir, options_.model_basename, with_input);
    bool any_found = false;
    if (point.ok() && !point->has_value()) {
      auto any = CommittedCheckpointSteps(options_.checkpoint_dir, options_.model_basename);
      if (any.ok()) {
        any_found = !any->empty() && any->back() > 0;
      } else {
        point = any.status();
      }
    }
    const bool none = point.ok() && !point->has_value() && any_found;
    if (point.ok() && point->has_value()) {
      // Said once, by the rank that looked: a resume that passes over newer checkpoints.
      for (const std::string& why : SkippedNewerCheckpoints(
               options_.checkpoint_dir, options_.model_basename, (*point)->step)) {
        LogWarning("resuming at step " + std::to_string((*point)->step) +
                   ", not at a newer step: " + why);
      }
    }
    bytes = EncodeDecision(
        point, any_found,
        none ? WhyNoResumePoint(options_.checkpoint_dir, options_.model_basename) : "");
  }
  RETURN_IF_ERROR(coordinator_->broadcast(bytes, 0));
  Decision decision;
  uint8_t ok = 0, found = 0, any = 0;
  size_t at = 0;
  if (!Take(bytes, &at, &ok) || !Take(bytes, &at, &found) || !Take(bytes, &at, &any) ||
      !Take(bytes, &at, &decision.point.step) ||
      !Take(bytes, &at, &decision.point.saved_world_size)) {
    return Status::Corruption("rank 0 sent a malformed resume decision");
  }
  const std::string text(bytes.begin() + static_cast<std::ptrdiff_t>(at), bytes.end());
  if (!ok) return Status::Unavailable("rank 0 could not choose the step to resume: " + text);
  decision.why_none = text;
  decision.found = found != 0;
  decision.any_found = any != 0;
  return decision;
}

Status ShardedSessionCreator::SetAsideForFreshStart() {
  std::string outcome;
  if (coordinator_->rank() == 0) {
    std::unique_ptr<io::FileSystem> own;
    io::FileSystem* fs = options_.file_system;
    if (fs == nullptr) {
      own = io::NewPosixFileSystem();
      fs = own.get();
    }
    auto moved = SetAsideCheckpoints(*fs, options_.checkpoint_dir, options_.model_basename);
    if (!moved.ok()) {
      outcome = "rank 0 could not move the checkpoints aside for a fresh start: " +
                moved.status().ToString();
    } else if (!moved->names.empty()) {
      std::string names;
      for (const std::string& name : moved->names) names += (names.empty() ? "" : ", ") + name;
      LogWarning("starting from step 0 as allowed (--allow_fresh_start): moved " + names +
                 " into " + options_.checkpoint_dir + "/" + moved->subdir +
                 ", whole; nothing was deleted");
    }
  }
  // Every rank waits here: none may save into the directory while rank 0 moves checkpoints.
  std::vector<uint8_t> bytes(outcome.begin(), outcome.end());
  RETURN_IF_ERROR(coordinator_->broadcast(bytes, 0));
  if (bytes.empty()) return Status::OK();
  return Status::Unavailable(std::string(bytes.begin(), bytes.end()));
}

Result<int64_t> ShardedSessionCreator::create_session() {
  const bool first = sessions_++ == 0;
  restored_from_.clear();
  restored_step_ = -1;
  input_source_.clear();
  restore_bytes_read_ = 0;
  restore_seconds_ = 0;
  ASSIGN_OR_RETURN(const Decision decision, Decide());
  const bool with_input = !options_.input_basename.empty();
  if (decision.found) {
    const ResumePoint& point = decision.point;
    const uint32_t rank = static_cast<uint32_t>(coordinator_->rank());
    const uint32_t size = static_cast<uint32_t>(coordinator_->size());
    saved_world_size_ = point.saved_world_size;
    if (with_input) input_source_ = InputSourceBasename(point.saved_world_size, rank);
    if (rank == 0) {
      for (const ChangeLine& line : DescribeWorldSizeChange(point, size, with_input)) {
        if (line.warning) {
          LogWarning(line.text);
        } else {
          std::fprintf(stderr, "train-sim: %s\n", line.text.c_str());
        }
      }
    }
    // A failed restore fails every rank: the job cannot go on with some ranks restored.
    Status restored = Restore(point.step);
    ASSIGN_OR_RETURN(auto outcomes, GatherValues(*coordinator_, restored.ok() ? 0 : 1));
    RETURN_IF_ERROR(restored);
    for (size_t r = 0; r < outcomes.size(); ++r) {
      if (outcomes[r] != 0) {
        return Status::Unavailable("rank " + std::to_string(r) + " failed to restore step " +
                                   std::to_string(point.step));
      }
    }
    ++restores_;
    return point.step;
  }
  // Nothing to resume. A fresh start is fine when nothing past step 0 exists, when allowed, or
  // when every session so far started afresh (what exists is this job's own).
  if (decision.any_found && (first || restores_ > 0)) {
    if (!options_.allow_fresh_start) {
      return Status::FailedPrecondition(
          options_.checkpoint_dir + " holds checkpoints past step 0 but no step whose model " +
          "checkpoint and the input checkpoints of every rank of the job that saved it are all " +
          "committed: " + decision.why_none +
          "; starting from step 0 would train over them. Restore without training (--saver " +
          "none) works on any number of ranks; or start from step 0 with --allow_fresh_start, " +
          "which first moves every model and input checkpoint there, whole, into a new " +
          "set-aside-<hex> subdirectory: it deletes none");
    }
    RETURN_IF_ERROR(SetAsideForFreshStart());
  }
  if (options_.init_fn) {
    RETURN_IF_ERROR(options_.init_fn().WithContext("initialising the state (init_fn)"));
  }
  return int64_t{0};
}

}  // namespace asyncckpt::cli
