// Saves one tensor through the installed public API and reads it back: what a user's first
// program does. Exits 0 only when the bytes read equal the bytes saved.

#include <asyncckpt/reader.h>
#include <asyncckpt/saver_hook.h>
#include <asyncckpt/session.h>
#include <asyncckpt/session_creator.h>
#include <asyncckpt/state.h>
#include <asyncckpt/xtensor.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <xtensor/xarray.hpp>

namespace {

int Fail(const std::string& what, const asyncckpt::Status& status) {
  std::fprintf(stderr, "consumer: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer CHECKPOINT_DIR\n");
    return 2;
  }
  xt::xarray<float> weights = xt::xarray<float>::from_shape({4, 8});
  for (size_t i = 0; i < weights.size(); ++i) weights.data()[i] = 0.5f * static_cast<float>(i);

  asyncckpt::TensorRegistry registry;
  asyncckpt::Status added = registry.add({"dense/weights",
                                          asyncckpt::DType::kF32,
                                          {4, 8},
                                          weights.data(),
                                          weights.size() * sizeof(float),
                                          nullptr,
                                          {},
                                          {}});
  if (!added.ok()) return Fail("registering the tensor", added);

  asyncckpt::SaverOptions options;
  options.checkpoint_dir = argv[1];
  options.save_steps = 1000;  // one save: the one at the start of the session
  auto hook = asyncckpt::CheckpointSaverHook::Create(options, &registry);
  if (!hook.ok()) return Fail("creating the saver hook", hook.status());
  // A fresh directory: the creator restores nothing and the session starts at step 0.
  asyncckpt::CheckpointSessionCreatorOptions restore;
  restore.checkpoint_dir = argv[1];
  auto creator = asyncckpt::CheckpointSessionCreator::Create(restore, &registry);
  if (!creator.ok()) return Fail("creating the session creator", creator.status());
  auto session = asyncckpt::MonitoredSession::Create({hook->get()}, creator->get());
  if (!session.ok()) return Fail("creating the session", session.status());
  asyncckpt::Status closed = (*session)->close();
  if (!closed.ok()) return Fail("closing the session", closed);

  auto state = asyncckpt::GetCheckpointState(argv[1]);
  if (!state.ok()) return Fail("reading the state file", state.status());
  if (state->all_model_checkpoint_paths.size() != 1) {
    std::fprintf(stderr, "consumer: expected one checkpoint, the state file lists %zu\n",
                 state->all_model_checkpoint_paths.size());
    return 1;
  }
  auto latest = asyncckpt::LatestCheckpoint(argv[1]);
  if (!latest.ok()) return Fail("finding the checkpoint", latest.status());
  auto reader = asyncckpt::CheckpointReader::Open(*latest);
  if (!reader.ok()) return Fail("opening " + *latest, reader.status());
  auto restored = asyncckpt::ReadXarray<float>(**reader, "dense/weights");
  if (!restored.ok()) return Fail("reading dense/weights", restored.status());
  if (*restored != weights) {
    std::fprintf(stderr, "consumer: dense/weights read back differs from what was saved\n");
    return 1;
  }
  std::printf("consumer: saved and read back %s\n", latest->c_str());
  return 0;
}
