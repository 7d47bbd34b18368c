// Writes the seed corpora of the fuzz targets from real checkpoints, made by the library's own
// writers: `make_fuzz_seeds OUT` fills OUT/index (index files), OUT/state (state files),
// OUT/safetensors (safetensors headers) and
// OUT/reader (whole checkpoints framed as fuzz/fuzz_support.h says). The build runs it, so no
// binary seed is committed. Every checkpoint is small (reader inputs stay under 4 KiB, the
// -max_len scripts/fuzz gives) and has several chunks, codecs, dtypes and data files.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "fuzz/fuzz_support.h"
#include "src/format/format.h"
#include "src/format/writer.h"
#include "src/interop/safetensors_format.h"
#include "src/state/checkpoint_state.h"
#include "tests/support/checkpoint_files.h"

namespace asyncckpt::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  Require(out.good(), "cannot write a seed file");
}

// Tensors of several dtypes and shapes: smooth floats (shuffle+zstd shrinks them), zeros (zstd
// shrinks them to almost nothing), a counter, a scalar and an empty tensor.
struct SeedTensors {
  std::vector<float> smooth = std::vector<float>(96);
  std::vector<double> zeros = std::vector<double>(64, 0.0);
  std::vector<int32_t> counter = std::vector<int32_t>(40);
  int64_t scalar = 1234567;
  std::vector<uint16_t> empty;

  SeedTensors() {
    for (size_t i = 0; i < smooth.size(); ++i) smooth[i] = std::sin(0.05f * static_cast<float>(i));
    for (size_t i = 0; i < counter.size(); ++i) counter[i] = static_cast<int32_t>(i * 7);
  }

  std::vector<format::HostTensor> All() const {
    return {{"model/w", DType::kF32, {8, 12}, smooth.data(), smooth.size() * sizeof(float)},
            {"optimizer/m", DType::kF64, {64}, zeros.data(), zeros.size() * sizeof(double)},
            {"step_counts", DType::kI32, {5, 8}, counter.data(), counter.size() * sizeof(int32_t)},
            {"global_step", DType::kI64, {}, &scalar, sizeof(scalar)},
            {"empty", DType::kU16, {0, 3}, nullptr, 0}};
  }
};

struct Variant {
  CompressionKind kind;
  uint64_t chunk_bytes;
  uint32_t num_data_files;
};

int WriteCheckpointSeeds(io::FileSystem& file_system, const fs::path& work, const fs::path& out) {
  const SeedTensors data;
  const std::vector<format::HostTensor> tensors = data.All();
  const Variant variants[] = {{CompressionKind::kShuffleZstd, 128, 2},
                              {CompressionKind::kZstd, 256, 1},
                              {CompressionKind::kNone, 64, 3},
                              {CompressionKind::kShuffleZstd, 4096, 1}};
  int written = 0;
  for (const Variant& variant : variants) {
    const fs::path dir = work / ("model.ckpt-" + std::to_string(written));
    fs::create_directories(dir);
    testing_support::WriterOptions options;
    options.chunk_bytes = variant.chunk_bytes;
    options.num_data_files = variant.num_data_files;
    options.compression.kind = variant.kind;
    CheckpointMetadata metadata{
        100 * written, 1.7e9 + written, {{"lr", "0.001"}, {"note", "seed"}}};
    Result<testing_support::WriteStats> stats = testing_support::WriteCheckpointFiles(
        file_system, dir.string(), tensors, metadata, options);
    if (!stats.ok()) {
      std::fprintf(stderr, "make_fuzz_seeds: %s\n", stats.status().ToString().c_str());
      return -1;
    }
    std::vector<std::vector<uint8_t>> files{ReadBytes(dir / format::kIndexFileName)};
    for (uint32_t i = 0; i < variant.num_data_files; ++i) {
      files.push_back(ReadBytes(dir / format::DataFileName(i, variant.num_data_files)));
    }
    const std::string name = "seed-" + std::to_string(written);
    WriteBytes(out / "index" / name, files[0]);
    WriteBytes(out / "reader" / name, JoinFiles(files));
    ++written;
  }
  // A sharded checkpoint (flag 1): two ranks, "model/w" cut 5/3 rows, "global_step" whole.
  const fs::path dir = work / "model.ckpt-sharded";
  fs::create_directories(dir);
  const float* w = data.smooth.data();
  const std::vector<std::vector<testing_support::HostSlice>> ranks = {
      {{{"model/w", DType::kF32, {5, 12}, w, 5 * 12 * sizeof(float)}, {8, 12}, {0, 0}},
       {{"global_step", DType::kI64, {}, &data.scalar, sizeof(data.scalar)}, {}, {}}},
      {{{"model/w", DType::kF32, {3, 12}, w + 5 * 12, 3 * 12 * sizeof(float)}, {8, 12}, {5, 0}}}};
  testing_support::WriterOptions options;
  options.chunk_bytes = 96;
  options.num_data_files = 1;
  Result<format::Index> index = testing_support::WriteShardedCheckpointFiles(
      file_system, dir.string(), ranks, CheckpointMetadata{7, 1.7e9, {}}, options);
  if (!index.ok()) {
    std::fprintf(stderr, "make_fuzz_seeds: %s\n", index.status().ToString().c_str());
    return -1;
  }
  std::vector<std::vector<uint8_t>> files{ReadBytes(dir / format::kIndexFileName)};
  for (uint32_t i = 0; i < index->num_data_files; ++i) {
    files.push_back(ReadBytes(dir / format::DataFileName(i, index->num_data_files)));
  }
  WriteBytes(out / "index" / "seed-sharded", files[0]);
  WriteBytes(out / "reader" / "seed-sharded", JoinFiles(files));
  return written + 1;
}

int WriteStateSeeds(io::FileSystem& file_system, const fs::path& work, const fs::path& out) {
  std::vector<CheckpointState> states(3);
  states[0].model_checkpoint_path = "model.ckpt-0";
  states[0].all_model_checkpoint_paths = {"model.ckpt-0"};
  states[0].all_model_checkpoint_timestamps = {1.7e9};
  states[1].model_checkpoint_path = "model.ckpt-300";
  states[1].all_model_checkpoint_paths = {"model.ckpt-100", "model.ckpt-200", "model.ckpt-300"};
  states[1].all_model_checkpoint_timestamps = {1700000000.125, 1700000060.5, 1700000120.75};
  states[1].last_preserved_timestamp = 1700000000.125;
  states[2].model_checkpoint_path = "input_worker_3.ckpt-42";
  states[2].all_model_checkpoint_paths = {"input_worker_3.ckpt-42"};
  states[2].all_model_checkpoint_timestamps = {0.0};
  int written = 0;
  for (const CheckpointState& state : states) {
    const Status status = WriteCheckpointState(file_system, work.string(), state);
    if (!status.ok()) {
      std::fprintf(stderr, "make_fuzz_seeds: %s\n", status.ToString().c_str());
      return -1;
    }
    WriteBytes(out / "state" / ("seed-" + std::to_string(written++)),
               ReadBytes(work / kCheckpointStateFileName));
  }
  return written;
}

// Safetensors headers as the encoder writes them, each after its data part's length (the
// input safetensors_fuzz reads).
int WriteSafetensorsSeeds(const fs::path& out) {
  const std::vector<std::vector<interop::SafetensorsTensor>> headers = {
      {{"model.embed.weight", DType::kBF16, {4, 2}, 0, 16},
       {"model.norm", DType::kF32, {2}, 16, 24}},
      {{"scalar", DType::kF64, {}, 0, 8},
       {"empty", DType::kI32, {0}, 8, 8},
       {"m\u00e9", DType::kBool, {3}, 8, 11}},
  };
  int written = 0;
  for (const auto& tensors : headers) {
    const std::string json = interop::EncodeSafetensorsHeader(tensors, {{"format", "pt"}});
    std::vector<uint8_t> input(8);
    StoreU64(input.data(), tensors.back().end);
    input.insert(input.end(), json.begin(), json.end());
    WriteBytes(out / "safetensors" / ("seed-" + std::to_string(written++)), input);
  }
  return written;
}

}  // namespace
}  // namespace asyncckpt::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  using namespace asyncckpt::fuzz;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path work = out / "work";
  fs::remove_all(out);
  for (const char* sub : {"index", "state", "reader", "safetensors", "work"}) {
    fs::create_directories(out / sub);
  }
  const std::unique_ptr<asyncckpt::io::FileSystem> file_system =
      asyncckpt::io::NewPosixFileSystem();
  const int checkpoints = WriteCheckpointSeeds(*file_system, work, out);
  const int states = WriteStateSeeds(*file_system, work, out);
  WriteSafetensorsSeeds(out);
  fs::remove_all(work);
  if (checkpoints < 0 || states < 0) return 1;
  std::printf("make_fuzz_seeds: %d checkpoints and %d state files in %s\n", checkpoints, states,
              out.c_str());
  return 0;
}
