// Tests of src/state/state_claims.cc: the basenames a directory's state files claim.

#include "src/state/state_claims.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "asyncckpt/state.h"
#include "tests/state/checkpoint_state_fixture.h"

namespace asyncckpt {
namespace {

using namespace state_testing;  // NOLINT(build/namespaces): the shared fixture
using ::testing::HasSubstr;

class StateClaimsTest : public StateDirTest {
 protected:
  void WriteList(const std::string& state_file, const std::vector<std::string>& names) {
    CheckpointState state;
    state.all_model_checkpoint_paths = names;
    if (!names.empty()) state.model_checkpoint_path = names.back();
    ASSERT_TRUE(WriteCheckpointState(*posix_, dir_, state, state_file).ok());
  }
};

TEST_F(StateClaimsTest, EachStateFileClaimsTheBasenamesItLists) {
  WriteList("checkpoint", {"model.ckpt-1", "model.ckpt-2", "other.ckpt-9"});
  WriteList("checkpoint_input", {"input.ckpt-1", "input.ckpt-2"});
  WriteText("checkpoint_input.lock", "model_checkpoint_path: \"stale.ckpt-1\"\n");
  WriteText("checkpoint.tmp-0123456789abcdef", "model_checkpoint_path: \"stale.ckpt-1\"\n");
  WriteText("notes.txt", "all_model_checkpoint_paths: \"notes.ckpt-1\"\ngarbage\n");  // no parse
  WriteText("dataset.bin", std::string(1 << 20, '\0'));  // a binary file beside them
  MakeCheckpointDir("model.ckpt-2");
  Result<std::map<std::string, std::vector<StateFileClaim>>> claims =
      FindStateFileClaims(*faulty_, dir_);
  ASSERT_TRUE(claims.ok()) << claims.status().ToString();
  ASSERT_EQ(claims->size(), 3u);
  EXPECT_EQ(claims->at("model.ckpt").size(), 1u);
  EXPECT_EQ(claims->at("model.ckpt")[0].state_file, "checkpoint");
  EXPECT_EQ(claims->at("model.ckpt")[0].checkpoint, "model.ckpt-2");
  EXPECT_EQ(claims->at("other.ckpt")[0].state_file, "checkpoint");
  EXPECT_EQ(claims->at("input.ckpt")[0].state_file, "checkpoint_input");
  EXPECT_TRUE(FindStateFileClaims(*posix_, dir_ + "/missing").value().empty());
}

TEST_F(StateClaimsTest, ABasenameOfAnotherStateFileIsRefusedNamingBoth) {
  WriteList("checkpoint", {"model.ckpt-1"});
  WriteList("checkpoint_input", {"input.ckpt-4", "input.ckpt-5"});
  EXPECT_TRUE(CheckBasenameUnclaimed(*posix_, dir_, "model.ckpt", "checkpoint").ok());
  EXPECT_TRUE(CheckBasenameUnclaimed(*posix_, dir_, "input.ckpt", "checkpoint_input").ok());
  EXPECT_TRUE(CheckBasenameUnclaimed(*posix_, dir_, "fresh.ckpt", "checkpoint").ok());
  const Status refused = CheckBasenameUnclaimed(*posix_, dir_, "input.ckpt", "checkpoint");
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_THAT(refused.message(),
              HasSubstr("basename 'input.ckpt' of state file " + Path("checkpoint") +
                        " belongs to state file " + Path("checkpoint_input") +
                        ", which lists input.ckpt-5"));
}

}  // namespace
}  // namespace asyncckpt
