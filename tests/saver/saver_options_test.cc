// Tests of src/saver/saver_options.cc: ValidateSaverOptions, the one check of every range of
// SaverOptions (asyncckpt/saver_options.h, asyncckpt/limits.h).

#include "asyncckpt/saver_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "asyncckpt/coordinator.h"
#include "asyncckpt/limits.h"

namespace asyncckpt {
namespace {

using ::testing::HasSubstr;

// Options that pass, for each test to break one field of.
SaverOptions Valid() {
  SaverOptions options;
  options.checkpoint_dir = "/tmp/x";
  options.save_steps = 1;
  return options;
}

TEST(ValidateSaverOptionsTest, TheDefaultsWithADirectoryAndAScheduleAreValid) {
  EXPECT_TRUE(ValidateSaverOptions(Valid()).ok()) << ValidateSaverOptions(Valid()).ToString();
  EXPECT_EQ(Valid().queue_depth, kDefaultQueueDepth);
}

TEST(ValidateSaverOptionsTest, QueueDepthIsHeldToItsRangeNamingIt) {
  SaverOptions options = Valid();
  for (unsigned refused : {0u, kMaxQueueDepth + 1}) {
    options.queue_depth = refused;
    const Status status = ValidateSaverOptions(options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(status.message(), HasSubstr("queue_depth must be in [1, 4096]")) << refused;
  }
  options.queue_depth = kMaxQueueDepth;
  EXPECT_TRUE(ValidateSaverOptions(options).ok());
}

TEST(ValidateSaverOptionsTest, ExactlyOneOfSaveStepsAndSaveSecs) {
  SaverOptions options = Valid();
  options.save_secs = 3;
  EXPECT_THAT(ValidateSaverOptions(options).message(), HasSubstr("Exactly one of save_steps"));
  options.save_steps.reset();
  EXPECT_TRUE(ValidateSaverOptions(options).ok());
  options.save_secs.reset();
  EXPECT_THAT(ValidateSaverOptions(options).message(), HasSubstr("Exactly one of save_steps"));
}

TEST(ValidateSaverOptionsTest, PairedInputBasenameIsAPlainNameOtherThanTheBasename) {
  SaverOptions options = Valid();
  options.paired_input_basename = "a/b";
  EXPECT_THAT(ValidateSaverOptions(options).message(), HasSubstr("paired_input_basename 'a/b'"));
  options.paired_input_basename = "model.ckpt";
  EXPECT_THAT(ValidateSaverOptions(options).message(), HasSubstr("must differ from basename"));
  options.paired_input_basename = "input.ckpt";
  EXPECT_TRUE(ValidateSaverOptions(options).ok());
}

// The library, the command-line tool and Python share one floor: a chunk below one 4 KiB page
// would be padded to a page in staging and, under O_DIRECT, in its data file.
TEST(ValidateSaverOptionsTest, ChunkBytesBelowOnePageIsRefusedWithTheFieldNamed) {
  SaverOptions options = Valid();
  for (uint64_t refused : {uint64_t{4095}, uint64_t{0}}) {
    options.chunk_bytes = refused;
    const Status status = ValidateSaverOptions(options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(status.message(), HasSubstr("chunk_bytes")) << refused;
  }
  options.chunk_bytes = 4096;
  EXPECT_TRUE(ValidateSaverOptions(options).ok()) << ValidateSaverOptions(options).ToString();
}

// A coordinator that claims a job of two processes; the options checks never call it.
class TwoRanks final : public Coordinator {
 public:
  int rank() const override { return 1; }
  int size() const override { return 2; }
  Status broadcast(std::vector<uint8_t>&, int) override { return Status::Internal("unused"); }
  Result<std::vector<std::vector<uint8_t>>> all_gather(std::span<const uint8_t>) override {
    return Status::Internal("unused");
  }
};

TEST(ValidateSaverOptionsTest, RetentionRulesAreRefusedNamingWhatIsWrong) {
  SaverOptions negative_period = Valid();
  negative_period.keep_period = -4;
  SaverOptions best_of_all = Valid();
  best_of_all.best_mode = BestMode::kMin;
  best_of_all.max_to_keep = 0;
  SaverOptions one_score_for_all = Valid();
  // emplace, not operator[] and =: GCC 12 at -O3 flags that assignment with a false -Wrestrict.
  one_score_for_all.user_metadata.emplace(kRetentionScoreKey, "1");
  for (const auto& [options, says] :
       {std::pair{negative_period, "keep_period must be >= 0"},
        std::pair{best_of_all, "best_mode needs max_to_keep > 0"},
        std::pair{one_score_for_all, "user_metadata must not hold asyncckpt.retention_score"}}) {
    const Status status = ValidateSaverOptions(options);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << says;
    EXPECT_THAT(status.message(), HasSubstr(says));
  }
  SaverOptions fine = Valid();
  fine.keep_period = 4;
  fine.best_mode = BestMode::kMax;
  EXPECT_TRUE(ValidateSaverOptions(fine).ok()) << ValidateSaverOptions(fine).ToString();
}

TEST(ValidateSaverOptionsTest, CoordinationTimeoutMustBePositive) {
  SaverOptions options = Valid();
  options.coordination_timeout_secs = 0;
  const Status status = ValidateSaverOptions(options);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("coordination_timeout_secs"));
}

TEST(ValidateSaverOptionsTest, SkippingSavesIsRejectedInAMultiProcessJob) {
  TwoRanks two;
  SaverOptions options = Valid();
  options.coordinator = &two;
  EXPECT_TRUE(ValidateSaverOptions(options).ok());
  options.on_busy = OnBusy::kSkip;
  const Status status = ValidateSaverOptions(options);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("on_busy kSkip"));
}

}  // namespace
}  // namespace asyncckpt
