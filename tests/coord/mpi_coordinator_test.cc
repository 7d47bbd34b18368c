// NewMpiCoordinator in a process that never initialised MPI (an ordinary test, no mpirun): the
// caller owns MPI's life, and a coordinator made too early says so.

#include "asyncckpt/mpi_coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace asyncckpt {
namespace {

using ::testing::HasSubstr;

TEST(NewMpiCoordinatorTest, WithoutMpiInitFailsSayingSo) {
  const Result<std::unique_ptr<Coordinator>> made = NewMpiCoordinator(MPI_COMM_WORLD);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(made.status().message(), HasSubstr("MPI is not initialised"));
  EXPECT_THAT(made.status().message(), HasSubstr("MPI_Init_thread"));
}

}  // namespace
}  // namespace asyncckpt
