// Many kill points: label "soak", run with `ctest --test-dir build -L soak`.

#include "tests/e2e/input_resume_fixture.h"

namespace asyncckpt {
namespace {
class InputResumeSoakTest : public InputResumeTest {};

TEST_F(InputResumeSoakTest, SoakManyKillPointsResumeExactly) {
  ExpectResumesMatchTheStraightRun(Config("soak300", "300", 5), 12);
  ExpectResumesMatchTheStraightRun(Config("soak1000", "1000", 16), 12);
}

}  // namespace
}  // namespace asyncckpt
