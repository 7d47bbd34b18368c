#pragma once

// The Coordinator of a job run by MPI (Open MPI, or any MPI-3 library). Built into the separate
// library asyncckpt::mpi (CMake option ASYNCCKPT_MPI), so that asyncckpt itself never depends on
// MPI. The caller keeps MPI's life: it calls MPI_Init or MPI_Init_thread before creating an
// MpiCoordinator and MPI_Finalize after destroying every one.

#include <mpi.h>

#include <memory>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// Options of NewMpiCoordinator.
struct MpiCoordinatorOptions {
  /// Longest wait, in seconds, of one collective for the other ranks (a rank that never comes,
  /// or one stuck in a long step). Past it the call fails with Unavailable and the coordinator
  /// is unusable: MPI cannot cancel a collective. 0 waits for ever.
  double timeout_seconds = 600;
};

/// A Coordinator over a private duplicate (MPI_Comm_dup) of `comm`, so that its collectives
/// never match the caller's. Collective: every rank of `comm` calls it. Its calls come from one
/// thread at a time (the hooks' training thread); under MPI_THREAD_FUNNELED or
/// MPI_THREAD_SINGLE that must be the thread that initialised MPI, which each call checks.
/// FailedPrecondition when MPI is not initialised or already finalised, InvalidArgument for
/// MPI_COMM_NULL or an intercommunicator. Destroy it before MPI_Finalize: its destructor frees
/// the duplicate (collectively, on every rank).
Result<std::unique_ptr<Coordinator>> NewMpiCoordinator(MPI_Comm comm,
                                                       MpiCoordinatorOptions options = {});

}  // namespace asyncckpt
