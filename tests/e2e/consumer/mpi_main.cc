// Uses the installed asyncckpt::mpi: a coordinator made before MPI_Init says what is missing;
// one made after it is the process's own job of one (no mpirun).

#include <mpi.h>

#include <cstdio>

#include "asyncckpt/mpi_coordinator.h"

int main(int argc, char** argv) {
  auto early = asyncckpt::NewMpiCoordinator(MPI_COMM_WORLD);
  if (early.ok()) {
    std::fprintf(stderr, "a coordinator before MPI_Init should fail\n");
    return 1;
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int code = 0;
  {
    auto coordinator = asyncckpt::NewMpiCoordinator(MPI_COMM_WORLD);
    if (!coordinator.ok() || (*coordinator)->size() != 1) {
      std::fprintf(stderr, "NewMpiCoordinator: %s\n", coordinator.status().ToString().c_str());
      code = 1;
    }
  }
  MPI_Finalize();
  if (code == 0) std::printf("mpi consumer ok\n");
  return code;
}
