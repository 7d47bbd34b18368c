// What the savers of a multi-process job agree on (src/saver/coordination): who writes which
// tensor or box, the checks across ranks, and the collectives over a single-process coordinator.
// The same collectives across real processes: tests/coord/coordinator_mpi_test.cc.

#include "src/saver/coordination.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/saver_hook.h"
#include "tests/support/tensor_ref.h"

namespace asyncckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

using testing_support::Ref;

TensorPlacement Whole(std::string name, std::vector<int64_t> shape, DType dtype = DType::kF32) {
  return {.name = std::move(name),
          .dtype = dtype,
          .shard = false,
          .global_shape = shape,
          .offset = std::vector<int64_t>(shape.size(), 0),
          .extent = shape};
}

TensorPlacement Box(std::string name, std::vector<int64_t> global, std::vector<int64_t> offset,
                    std::vector<int64_t> extent, DType dtype = DType::kF32) {
  return {.name = std::move(name),
          .dtype = dtype,
          .shard = true,
          .global_shape = std::move(global),
          .offset = std::move(offset),
          .extent = std::move(extent)};
}

TEST(WrittenByRankTest, ReplicatedWholeTensorIsWrittenByRankZeroOnly) {
  const std::vector<std::vector<TensorPlacement>> all = {
      {Whole("bias", {4})}, {Whole("bias", {4})}, {Whole("bias", {4})}};
  EXPECT_THAT(*WrittenByRank(all, 0), ElementsAre(true));
  EXPECT_THAT(*WrittenByRank(all, 1), ElementsAre(false));
  EXPECT_THAT(*WrittenByRank(all, 2), ElementsAre(false));
}

TEST(WrittenByRankTest, WholeTensorHeldOnlyByAHigherRankIsWrittenByIt) {
  const std::vector<std::vector<TensorPlacement>> all = {{}, {Whole("step", {})}};
  EXPECT_THAT(*WrittenByRank(all, 1), ElementsAre(true));
}

TEST(WrittenByRankTest, IdenticalBoxesAreWrittenByTheLowestRankHoldingThem) {
  // Rows 0-1 on ranks 1 and 3, rows 2-3 on ranks 0 and 2.
  const std::vector<std::vector<TensorPlacement>> all = {{Box("w", {4, 2}, {2, 0}, {2, 2})},
                                                         {Box("w", {4, 2}, {0, 0}, {2, 2})},
                                                         {Box("w", {4, 2}, {2, 0}, {2, 2})},
                                                         {Box("w", {4, 2}, {0, 0}, {2, 2})}};
  EXPECT_THAT(*WrittenByRank(all, 0), ElementsAre(true));
  EXPECT_THAT(*WrittenByRank(all, 1), ElementsAre(true));
  EXPECT_THAT(*WrittenByRank(all, 2), ElementsAre(false));
  EXPECT_THAT(*WrittenByRank(all, 3), ElementsAre(false));
}

TEST(WrittenByRankTest, UnevenDisjointBoxesAreEachWrittenByTheirRank) {
  const std::vector<std::vector<TensorPlacement>> all = {
      {Box("w", {5, 3}, {0, 0}, {3, 3}), Whole("b", {3})},
      {Box("w", {5, 3}, {3, 0}, {2, 3}), Whole("b", {3})}};
  // Placements are in each rank's (name) order as given.
  EXPECT_THAT(*WrittenByRank(all, 0), ElementsAre(true, true));
  EXPECT_THAT(*WrittenByRank(all, 1), ElementsAre(true, false));
}

TEST(WrittenByRankTest, DtypeMismatchNamesTheTensorAndBothRanks) {
  const std::vector<std::vector<TensorPlacement>> all = {{Whole("emb", {8}, DType::kF32)},
                                                         {Whole("emb", {8}, DType::kF32)},
                                                         {Whole("emb", {8}, DType::kBF16)}};
  const Result<std::vector<bool>> result = WrittenByRank(all, 1);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("tensor 'emb'"));
  EXPECT_THAT(result.status().message(), HasSubstr("on rank 0"));
  EXPECT_THAT(result.status().message(), HasSubstr("on rank 2"));
}

TEST(WrittenByRankTest, GlobalShapeMismatchNamesTheTensorAndBothRanks) {
  const std::vector<std::vector<TensorPlacement>> all = {{Box("w", {4, 2}, {0, 0}, {2, 2})},
                                                         {Box("w", {4, 3}, {2, 0}, {2, 3})}};
  const Result<std::vector<bool>> result = WrittenByRank(all, 0);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(),
              HasSubstr("tensor 'w' has global shape [4, 2] on rank 0 but [4, 3] on rank 1"));
}

TEST(WrittenByRankTest, ShardOnOneRankAndWholeOnAnotherIsRejected) {
  const std::vector<std::vector<TensorPlacement>> all = {{Whole("w", {4})},
                                                         {Box("w", {4}, {0}, {4})}};
  const Result<std::vector<bool>> result = WrittenByRank(all, 0);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(),
              HasSubstr("tensor 'w' is whole on rank 0 but a shard on rank 1"));
}

TEST(WrittenByRankTest, PartlyOverlappingBoxesAreRejected) {
  const std::vector<std::vector<TensorPlacement>> all = {{Box("w", {4}, {0}, {3})},
                                                         {Box("w", {4}, {2}, {2})}};
  const Result<std::vector<bool>> result = WrittenByRank(all, 0);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("overlaps"));
  EXPECT_THAT(result.status().message(), HasSubstr("on rank 1"));
}

TEST(WrittenByRankTest, BoxesThatLeaveAHoleAreRejected) {
  const std::vector<std::vector<TensorPlacement>> all = {{Box("w", {6}, {0}, {2})},
                                                         {Box("w", {6}, {4}, {2})}};
  const Result<std::vector<bool>> result = WrittenByRank(all, 1);
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(),
              HasSubstr("the boxes of ranks 0, 1 cover 4 of the 6 elements"));
}

TEST(WrittenByRankTest, EmptyBoxesNeverOverlap) {
  const std::vector<std::vector<TensorPlacement>> all = {{Box("w", {4}, {0}, {4})},
                                                         {Box("w", {4}, {2}, {0})}};
  EXPECT_THAT(*WrittenByRank(all, 1), ElementsAre(true));
}

TEST(PlacementsOfTest, WholeTensorsAreTheirOwnGlobalTensorAtOffsetZero) {
  std::vector<float> w(6);
  std::vector<float> s(2);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("w", DType::kF32, {2, 3}, w.data(), 24)).ok());
  ASSERT_TRUE(registry.add(Ref("s", DType::kF32, {2}, s.data(), 8, {5}, {3})).ok());
  const std::vector<TensorPlacement> placements = PlacementsOf(registry);
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].name, "s");
  EXPECT_TRUE(placements[0].shard);
  EXPECT_THAT(placements[0].offset, ElementsAre(3));
  EXPECT_THAT(placements[0].global_shape, ElementsAre(5));
  EXPECT_FALSE(placements[1].shard);
  EXPECT_THAT(placements[1].global_shape, ElementsAre(2, 3));
  EXPECT_THAT(placements[1].offset, ElementsAre(0, 0));
}

TEST(SingleProcessCoordinatorTest, IsRankZeroOfOneAndItsCollectivesAreCopies) {
  std::unique_ptr<Coordinator> c = NewSingleProcessCoordinator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<uint8_t> bytes{1, 2, 3};
  EXPECT_TRUE(c->broadcast(bytes, 0).ok());
  EXPECT_THAT(bytes, ElementsAre(1, 2, 3));
  EXPECT_EQ(c->broadcast(bytes, 1).code(), StatusCode::kInvalidArgument);
  const std::vector<uint8_t> mine{7, 8};
  const auto gathered = c->all_gather(mine);
  ASSERT_TRUE(gathered.ok());
  EXPECT_THAT(*gathered, ElementsAre(ElementsAre(7, 8)));
}

TEST(AgreeOnJobTokenTest, RankZeroStartsThenEveryRankGetsSixteenHexDigits) {
  std::unique_ptr<Coordinator> c = NewSingleProcessCoordinator();
  int started = 0;
  const Result<std::string> token = AgreeOnJobToken(*c, [&] {
    ++started;
    return Status::OK();
  });
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(started, 1);
  EXPECT_THAT(*token, MatchesRegex("[0-9a-f]{16}"));
}

TEST(AgreeOnJobTokenTest, RankZerosFailureIsEveryonesNamingRankZero) {
  std::unique_ptr<Coordinator> c = NewSingleProcessCoordinator();
  const Result<std::string> token =
      AgreeOnJobToken(*c, [] { return Status::FailedPrecondition("dir is locked"); });
  ASSERT_FALSE(token.ok());
  EXPECT_EQ(token.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(token.status().message(), HasSubstr("rank 0 could not start: dir is locked"));
}

TEST(AgreeOnWritersTest, OneProcessWritesItsWholeRegistry) {
  std::unique_ptr<Coordinator> c = NewSingleProcessCoordinator();
  std::vector<float> w(4);
  TensorRegistry registry;
  ASSERT_TRUE(registry.add(Ref("w", DType::kF32, {4}, w.data(), 16)).ok());
  const Result<TensorRegistry> written = AgreeOnWriters(*c, registry, Status::OK());
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_EQ(written->size(), 1u);
  EXPECT_EQ(written->tensors()[0].data, w.data());
}

TEST(AgreeOnWritersTest, ALocalFailureIsReportedWithItsRank) {
  std::unique_ptr<Coordinator> c = NewSingleProcessCoordinator();
  const Result<TensorRegistry> written =
      AgreeOnWriters(*c, TensorRegistry{}, Status::IOError("disk gone"));
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), StatusCode::kIOError);
  EXPECT_THAT(written.status().message(), HasSubstr("rank 0 could not start: disk gone"));
}

TEST(AgreeOnStatusTest, OkOnlyWhenEveryRankIsOk) {
  std::unique_ptr<Coordinator> c = NewSingleProcessCoordinator();
  EXPECT_TRUE(AgreeOnStatus(*c, Status::OK()).ok());
  const Status failed = AgreeOnStatus(*c, Status::Internal("no engine"));
  EXPECT_EQ(failed.code(), StatusCode::kInternal);
  EXPECT_THAT(failed.message(), HasSubstr("rank 0: no engine"));
}

TEST(AgreeOnSaveDueTest, OneProcessKeepsItsOwnDecision) {
  std::unique_ptr<Coordinator> c = NewSingleProcessCoordinator();
  EXPECT_TRUE(*AgreeOnSaveDue(*c, true, 1));
  EXPECT_FALSE(*AgreeOnSaveDue(*c, false, 2));
}

TEST(AgreeOnEndTest, OneProcessAlwaysAgreesWithItself) {
  std::unique_ptr<Coordinator> c = NewSingleProcessCoordinator();
  EXPECT_TRUE(AgreeOnEnd(*c, 40).ok());
}

}  // namespace
}  // namespace asyncckpt
