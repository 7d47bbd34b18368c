#include "tests/e2e/input_resume_fixture.h"

namespace asyncckpt {
namespace {
TEST_F(InputResumeTest, KilledRunsResumeToTheModelAndInputStateOfAStraightRun) {
  ExpectResumesMatchTheStraightRun(Config("shuffle300", "300", 5), 3);
}

// A shuffle buffer of 1000 records: larger than the dataset (it holds records of several
// epochs) and 16 chunks of 4 KiB.
TEST_F(InputResumeTest, KilledRunsResumeExactlyWithAShuffleBufferSpanningManyChunks) {
  ExpectResumesMatchTheStraightRun(Config("shuffle1000", "1000", 16), 3);
}

// More kill points: too slow for the default suite, run under the ctest label "soak".

}  // namespace
}  // namespace asyncckpt
