// MpiCoordinator's collectives across real processes (run by mpirun -np 2 and -np 4), and the
// savers' agreements over it: who writes which tensor (replicas), the errors every rank gets,
// and the job token.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "asyncckpt/mpi_coordinator.h"
#include "src/saver/coordination.h"
#include "tests/support/tensor_ref.h"

namespace asyncckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing_support::Ref;

class MpiCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Coordinator>> made =
        NewMpiCoordinator(MPI_COMM_WORLD, {.timeout_seconds = 60});
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    coordinator_ = std::move(made).value();
  }
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(MpiCoordinatorTest, RankAndSizeAreTheCommunicators) {
  int rank = -1;
  int size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(coordinator_->rank(), rank);
  EXPECT_EQ(coordinator_->size(), size);
  EXPECT_GE(size, 2);
}

TEST_F(MpiCoordinatorTest, BroadcastFromEveryRootSmallAndLarge) {
  for (int root = 0; root < coordinator_->size(); ++root) {
    for (const size_t length : {size_t{0}, size_t{1}, size_t{56}, size_t{57}, size_t{300000}}) {
      std::vector<uint8_t> bytes;
      if (coordinator_->rank() == root) {
        bytes.resize(length);
        for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + root);
      } else {
        bytes.assign(3, 0xee);  // whatever a rank held before is replaced
      }
      ASSERT_TRUE(coordinator_->broadcast(bytes, root).ok());
      ASSERT_EQ(bytes.size(), length) << "root " << root;
      for (size_t i = 0; i < length; ++i) {
        ASSERT_EQ(bytes[i], static_cast<uint8_t>(i * 7 + root)) << "root " << root << " byte " << i;
      }
    }
  }
}

TEST_F(MpiCoordinatorTest, BroadcastFromARootOutsideTheJobIsInvalid) {
  std::vector<uint8_t> bytes;
  EXPECT_EQ(coordinator_->broadcast(bytes, coordinator_->size()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->broadcast(bytes, -1).code(), StatusCode::kInvalidArgument);
}

TEST_F(MpiCoordinatorTest, AllGatherReturnsEveryRanksBytesInRankOrder) {
  // Rank r sends r * 1000 bytes of value r (rank 0 sends nothing).
  const int rank = coordinator_->rank();
  const std::vector<uint8_t> mine(static_cast<size_t>(rank) * 1000, static_cast<uint8_t>(rank));
  const Result<std::vector<std::vector<uint8_t>>> gathered = coordinator_->all_gather(mine);
  ASSERT_TRUE(gathered.ok()) << gathered.status().ToString();
  ASSERT_EQ(gathered->size(), static_cast<size_t>(coordinator_->size()));
  for (size_t r = 0; r < gathered->size(); ++r) {
    EXPECT_EQ((*gathered)[r], std::vector<uint8_t>(r * 1000, static_cast<uint8_t>(r)));
  }
}

TEST_F(MpiCoordinatorTest, ItsCollectivesNeverMatchTheCallersOwn) {
  // A user's broadcast on MPI_COMM_WORLD posted first, completed last: the coordinator's
  // private duplicate keeps the two apart.
  int user_value = coordinator_->rank() == 0 ? 42 : 0;
  MPI_Request request;
  MPI_Ibcast(&user_value, 1, MPI_INT, 0, MPI_COMM_WORLD, &request);
  std::vector<uint8_t> bytes;
  if (coordinator_->rank() == 0) bytes = {9, 9};
  ASSERT_TRUE(coordinator_->broadcast(bytes, 0).ok());
  MPI_Wait(&request, MPI_STATUS_IGNORE);
  EXPECT_EQ(user_value, 42);
  EXPECT_THAT(bytes, ElementsAre(9, 9));
}

TEST(NewMpiCoordinatorTest, NullCommunicatorIsInvalid) {
  const Result<std::unique_ptr<Coordinator>> made = NewMpiCoordinator(MPI_COMM_NULL);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(made.status().message(), HasSubstr("MPI_COMM_NULL"));
}

TEST_F(MpiCoordinatorTest, JobTokenIsRankZerosOnEveryRankAndOnlyRankZeroStarts) {
  int started = 0;
  const Result<std::string> token = AgreeOnJobToken(*coordinator_, [&] {
    ++started;
    return Status::OK();
  });
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(started, coordinator_->rank() == 0 ? 1 : 0);
  const auto gathered =
      coordinator_->all_gather(std::vector<uint8_t>(token->begin(), token->end()));
  ASSERT_TRUE(gathered.ok());
  for (const auto& other : *gathered) EXPECT_EQ(std::string(other.begin(), other.end()), *token);
}

TEST_F(MpiCoordinatorTest, RankZerosStartFailureReachesEveryRank) {
  const Result<std::string> token = AgreeOnJobToken(
      *coordinator_, [] { return Status::FailedPrecondition("checkpoint_dir is in use"); });
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(token.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(token.status().message(),
              HasSubstr("rank 0 could not start: checkpoint_dir is in use"));
}

// Every rank holds a replica of "bias", its own uneven row block of "w" (global [2R+1, 3]:
// rank 0 has 3 rows, the others 2), and "emb" split in two halves, each replicated on every
// other rank (even ranks hold rows 0-1, odd ranks rows 2-3).
TEST_F(MpiCoordinatorTest, ReplicasAreWrittenOnceByTheLowestRankHoldingThem) {
  const int rank = coordinator_->rank();
  const int size = coordinator_->size();
  std::vector<float> bias(4, 1.0f);
  const int64_t rows = rank == 0 ? 3 : 2;
  const int64_t first_row = rank == 0 ? 0 : 1 + 2 * rank;
  std::vector<float> w(static_cast<size_t>(rows * 3));
  std::vector<float> emb(2 * 5);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("bias", DType::kF32, {4}, bias.data(), 16)).ok());
  ASSERT_TRUE(registry
                  .add(Ref("w", DType::kF32, {rows, 3}, w.data(), w.size() * 4, {2 * size + 1, 3},
                           {first_row, 0}))
                  .ok());
  ASSERT_TRUE(registry
                  .add(Ref("emb", DType::kF32, {2, 5}, emb.data(), emb.size() * 4, {4, 5},
                           {rank % 2 == 0 ? 0 : 2, 0}))
                  .ok());
  const Result<TensorRegistry> written = AgreeOnWriters(*coordinator_, registry, Status::OK());
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  std::vector<std::string> names;
  for (const TensorRef& t : written->tensors()) names.push_back(t.name);
  if (rank == 0) {
    EXPECT_THAT(names, ElementsAre("bias", "emb", "w"));
  } else if (rank == 1) {
    EXPECT_THAT(names, ElementsAre("emb", "w"));
  } else {
    EXPECT_THAT(names, ElementsAre("w"));
  }
  // The buffers are the caller's, not copies.
  EXPECT_EQ(written->find("w")->data, w.data());
}

TEST_F(MpiCoordinatorTest, InconsistentDtypeFailsOnEveryRankNamingTensorAndRanks) {
  const int rank = coordinator_->rank();
  const int last = coordinator_->size() - 1;
  std::vector<uint16_t> bias(4);
  TensorRegistry registry;
  ASSERT_TRUE(
      registry.add(Ref("bias", rank == last ? DType::kBF16 : DType::kF16, {4}, bias.data(), 8))
          .ok());
  const Result<TensorRegistry> written = AgreeOnWriters(*coordinator_, registry, Status::OK());
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(written.status().message(),
              HasSubstr("tensor 'bias' is f16 on rank 0 but bf16 on rank " + std::to_string(last)));
}

TEST_F(MpiCoordinatorTest, OneRanksStartFailureReachesEveryRankNamingIt) {
  const int last = coordinator_->size() - 1;
  const Status local =
      coordinator_->rank() == last ? Status::IOError("no space left") : Status::OK();
  const Result<TensorRegistry> written = AgreeOnWriters(*coordinator_, TensorRegistry{}, local);
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), StatusCode::kIOError);
  EXPECT_THAT(written.status().message(),
              HasSubstr("rank " + std::to_string(last) + " could not start: no space left"));
  const Status agreed = AgreeOnStatus(*coordinator_, local);
  EXPECT_THAT(agreed.message(), HasSubstr("rank " + std::to_string(last) + ": no space left"));
}

TEST_F(MpiCoordinatorTest, SaveDecisionIsRankZeros) {
  for (const bool zero_says : {true, false}) {
    const bool mine = coordinator_->rank() == 0 ? zero_says : !zero_says;
    const Result<bool> due = AgreeOnSaveDue(*coordinator_, mine, /*step=*/3);
    ASSERT_TRUE(due.ok());
    EXPECT_EQ(*due, zero_says);
  }
}

TEST_F(MpiCoordinatorTest, RanksThatEndAtTheSameStepAgree) {
  EXPECT_TRUE(AgreeOnEnd(*coordinator_, 7).ok());
}

// Under save_secs a rank still training calls AgreeOnSaveDue where rank 0, ended, calls
// AgreeOnEnd: the rank learns it at once instead of waiting out the coordinator's timeout.
TEST_F(MpiCoordinatorTest, RankZerosEndFailsARankStillTrainingNamingBothSteps) {
  if (coordinator_->rank() == 0) {
    EXPECT_TRUE(AgreeOnEnd(*coordinator_, 5).ok());
    return;
  }
  const Result<bool> due = AgreeOnSaveDue(*coordinator_, false, 6);
  ASSERT_FALSE(due.ok());
  EXPECT_EQ(due.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(due.status().message(),
              HasSubstr("rank 0 ended its training at step 5, while rank " +
                        std::to_string(coordinator_->rank()) + " is at step 6"));
}

TEST_F(MpiCoordinatorTest, ARankThatEndsWhileRankZeroTrainsIsToldSo) {
  if (coordinator_->rank() == 0) {
    const Result<bool> due = AgreeOnSaveDue(*coordinator_, true, 8);
    ASSERT_TRUE(due.ok());
    EXPECT_TRUE(*due);
    return;
  }
  const Status ended = AgreeOnEnd(*coordinator_, 7);
  EXPECT_EQ(ended.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(ended.message(), HasSubstr("ended its training at step 7, but rank 0 still trains"));
}

}  // namespace
}  // namespace asyncckpt
