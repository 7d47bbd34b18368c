// MpiCoordinator: the hooks' few collectives over a private duplicate of the user's
// communicator. Every collective is non-blocking and polled, so that a rank that never comes
// costs at most options.timeout_seconds instead of a hang.

#include "asyncckpt/mpi_coordinator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>
#include <thread>

namespace asyncckpt {
namespace {

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

Status MpiStatus(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return Status::OK();
  return Status::IOError("MpiCoordinator: " + what + " failed: " + MpiErrorText(code));
}

// Leaves the function with a Status when an MPI call fails.
#define RETURN_IF_MPI(call, what)                                                           \
  do {                                                                                      \
    if (Status mpi_status = MpiStatus((call), (what)); !mpi_status.ok()) return mpi_status; \
  } while (false)

// Small payloads (a save decision, a job token) travel in one broadcast of this header; larger
// ones follow it in a second broadcast.
constexpr size_t kHeaderBytes = 64;
constexpr size_t kInlineBytes = kHeaderBytes - sizeof(uint64_t);

class MpiCoordinator final : public Coordinator {
 public:
  MpiCoordinator(MPI_Comm comm, int rank, int size, MpiCoordinatorOptions options)
      : comm_(comm), rank_(rank), size_(size), options_(options) {}

  ~MpiCoordinator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // After MPI_Finalize nothing may be called; the duplicate went with MPI.
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status broadcast(std::vector<uint8_t>& bytes, int root) override {
    if (root < 0 || root >= size_) {
      return Status::InvalidArgument("MpiCoordinator::broadcast: root " + std::to_string(root) +
                                     " is not a rank of a job of " + std::to_string(size_));
    }
    if (Status usable = Usable(); !usable.ok()) return usable;
    uint8_t header[kHeaderBytes] = {};
    if (rank_ == root) {
      const uint64_t length = bytes.size();
      std::memcpy(header, &length, sizeof(length));
      // Guarded: memcpy from the null data() of an empty vector is undefined, even of 0 bytes.
      if (!bytes.empty()) {
        std::memcpy(header + sizeof(length), bytes.data(), std::min(bytes.size(), kInlineBytes));
      }
    }
    MPI_Request request = MPI_REQUEST_NULL;
    if (Status s = MpiStatus(MPI_Ibcast(header, kHeaderBytes, MPI_BYTE, root, comm_, &request),
                             "MPI_Ibcast");
        !s.ok()) {
      return s;
    }
    if (Status s = Wait(&request, "broadcast"); !s.ok()) return s;
    uint64_t length = 0;
    std::memcpy(&length, header, sizeof(length));
    if (rank_ != root) {
      bytes.resize(length);
      if (length > 0) {
        std::memcpy(bytes.data(), header + sizeof(length),
                    std::min<uint64_t>(length, kInlineBytes));
      }
    }
    // The rest, in pieces an int can count.
    for (uint64_t done = kInlineBytes; done < length;) {
      const int piece = static_cast<int>(std::min<uint64_t>(length - done, INT_MAX));
      if (Status s =
              MpiStatus(MPI_Ibcast(bytes.data() + done, piece, MPI_BYTE, root, comm_, &request),
                        "MPI_Ibcast");
          !s.ok()) {
        return s;
      }
      if (Status s = Wait(&request, "broadcast"); !s.ok()) return s;
      done += static_cast<uint64_t>(piece);
    }
    return Status::OK();
  }

  Result<std::vector<std::vector<uint8_t>>> all_gather(std::span<const uint8_t> bytes) override {
    if (Status usable = Usable(); !usable.ok()) return usable;
    const uint64_t mine = bytes.size();
    std::vector<uint64_t> lengths(static_cast<size_t>(size_));
    MPI_Request request = MPI_REQUEST_NULL;
    RETURN_IF_MPI(
        MPI_Iallgather(&mine, 1, MPI_UINT64_T, lengths.data(), 1, MPI_UINT64_T, comm_, &request),
        "MPI_Iallgather");
    if (Status s = Wait(&request, "all_gather"); !s.ok()) return s;
    std::vector<int> counts(lengths.size());
    std::vector<int> displacements(lengths.size());
    uint64_t total = 0;
    for (size_t r = 0; r < lengths.size(); ++r) {
      if (lengths[r] > INT_MAX - total) {
        return Status::ResourceExhausted("MpiCoordinator::all_gather: more than " +
                                         std::to_string(INT_MAX) + " bytes in all (rank " +
                                         std::to_string(r) + " sends " +
                                         std::to_string(lengths[r]) + ")");
      }
      counts[r] = static_cast<int>(lengths[r]);
      displacements[r] = static_cast<int>(total);
      total += lengths[r];
    }
    std::vector<uint8_t> all(total);
    // MPI takes a non-const send buffer in older bindings; it only reads it.
    RETURN_IF_MPI(
        MPI_Iallgatherv(const_cast<uint8_t*>(bytes.data()), static_cast<int>(mine), MPI_BYTE,
                        all.data(), counts.data(), displacements.data(), MPI_BYTE, comm_, &request),
        "MPI_Iallgatherv");
    if (Status s = Wait(&request, "all_gather"); !s.ok()) return s;
    std::vector<std::vector<uint8_t>> gathered(lengths.size());
    for (size_t r = 0; r < lengths.size(); ++r) {
      gathered[r].assign(all.begin() + displacements[r],
                         all.begin() + displacements[r] + counts[r]);
    }
    return gathered;
  }

 private:
  // OK when a collective may start now: no earlier one timed out, and this thread may call MPI.
  Status Usable() const {
    if (!broken_.empty()) return Status::FailedPrecondition(broken_);
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED) {
      int is_main = 0;
      MPI_Is_thread_main(&is_main);
      if (!is_main) {
        return Status::FailedPrecondition(
            "MpiCoordinator: called from a thread other than the one that initialised MPI, whose "
            "thread level is below MPI_THREAD_SERIALIZED; initialise MPI with MPI_Init_thread "
            "and MPI_THREAD_SERIALIZED or higher, or run the training loop on the main thread");
      }
    }
    return Status::OK();
  }

  // Polls `request` until it completes or the timeout passes. Spins at first (a per-step save
  // decision is answered in microseconds when the ranks are in step), then sleeps briefly so
  // that a rank waiting for a slow one leaves its core to the job.
  Status Wait(MPI_Request* request, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      RETURN_IF_MPI(MPI_Test(request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return Status::OK();
      if (polls < 1000) continue;
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (options_.timeout_seconds > 0 && waited > options_.timeout_seconds) {
        broken_ = std::string("MpiCoordinator: rank ") + std::to_string(rank_) + "'s " + what +
                  " waited more than " + std::to_string(options_.timeout_seconds) +
                  " s for the other ranks of " + std::to_string(size_) +
                  "; this coordinator is unusable from now on";
        return Status::Unavailable(broken_);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 10000 ? 10 : 200));
    }
  }

  MPI_Comm comm_;
  int rank_;
  int size_;
  MpiCoordinatorOptions options_;
  std::string broken_;  // why the coordinator is unusable, once a collective timed out
};

}  // namespace

Result<std::unique_ptr<Coordinator>> NewMpiCoordinator(MPI_Comm comm,
                                                       MpiCoordinatorOptions options) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return Status::FailedPrecondition(
        std::string("NewMpiCoordinator: MPI is ") +
        (finalized ? "already finalised" : "not initialised") +
        "; the caller owns MPI's life: call MPI_Init_thread (or MPI_Init) before creating the "
        "coordinator and MPI_Finalize after destroying it");
  }
  if (comm == MPI_COMM_NULL) {
    return Status::InvalidArgument("NewMpiCoordinator: the communicator is MPI_COMM_NULL");
  }
  if (!(options.timeout_seconds >= 0)) {
    return Status::InvalidArgument(
        "NewMpiCoordinator: timeout_seconds must be >= 0 (0 waits for ever)");
  }
  int inter = 0;
  if (Status s = MpiStatus(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter"); !s.ok()) {
    return s;
  }
  if (inter) {
    return Status::InvalidArgument("NewMpiCoordinator: an intercommunicator is not supported");
  }
  MPI_Comm dup = MPI_COMM_NULL;
  if (Status s = MpiStatus(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup"); !s.ok()) return s;
  // Errors come back as codes turned into a Status, instead of aborting the job.
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  return std::unique_ptr<Coordinator>(new MpiCoordinator(dup, rank, size, options));
}

}  // namespace asyncckpt
