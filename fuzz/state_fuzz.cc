// libFuzzer target: ParseCheckpointState, the parser of the `checkpoint` state file, which a
// crash, a full disk or another program may have left in any shape. Besides "no crash, no hang,
// no allocation beyond the bounds", it checks that a state that parses is valid and survives
// SerializeCheckpointState and a second parse unchanged: what the saver writes back after
// reading it means the same.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_support.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt::fuzz {
namespace {

constexpr char kSource[] = "fuzz/checkpoint";

bool SameState(const CheckpointState& a, const CheckpointState& b) {
  return a.model_checkpoint_path == b.model_checkpoint_path &&
         a.all_model_checkpoint_paths == b.all_model_checkpoint_paths &&
         a.all_model_checkpoint_timestamps == b.all_model_checkpoint_timestamps &&
         a.last_preserved_timestamp == b.last_preserved_timestamp;
}

}  // namespace
}  // namespace asyncckpt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace asyncckpt;
  using namespace asyncckpt::fuzz;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<CheckpointState> state = ParseCheckpointState(text, kSource);
  if (!state.ok()) {
    Require(state.status().code() == StatusCode::kCorruption,
            "ParseCheckpointState failed with something other than Corruption");
    return 0;
  }
  Require(ValidateCheckpointState(*state).ok(), "a parsed state fails ValidateCheckpointState");
  const std::string serialized = SerializeCheckpointState(*state);
  Result<CheckpointState> again = ParseCheckpointState(serialized, kSource);
  Require(again.ok(), "SerializeCheckpointState wrote a state that does not parse");
  Require(SameState(*state, *again), "a state changed through Serialize and Parse");
  return 0;
}
