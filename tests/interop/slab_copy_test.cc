// Tests of PlanSlabs and CopySlabs (src/interop/slab_copy.cc): slabs cover every byte once and
// never exceed their size, the copy is bit-exact through O_DIRECT and buffered files, the reads
// run ahead of the writes, and an error on either side stops both and names the tensor.

#include "src/interop/slab_copy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/file_system.h"
#include "asyncckpt/reader.h"
#include "src/format/format.h"
#include "src/format/index_file.h"
#include "tests/support/checkpoint_files.h"

namespace asyncckpt::interop {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TensorInfo Info(std::string name, DType dtype, std::vector<int64_t> shape, uint64_t num_chunks) {
  TensorInfo info;
  info.name = std::move(name);
  info.dtype = dtype;
  info.shape = std::move(shape);
  info.bytes = DTypeSize(dtype);
  for (int64_t d : info.shape) info.bytes *= uint64_t(d);
  info.num_chunks = num_chunks;
  return info;
}

// Every slab fits, follows the one before, names a tensor at most once, and its pieces add up;
// together they cover [offset, offset + total).
void ExpectCovers(const std::vector<Slab>& slabs, uint64_t offset, uint64_t total,
                  uint64_t slab_bytes) {
  uint64_t at = offset;
  for (const Slab& slab : slabs) {
    EXPECT_EQ(slab.file_offset, at);
    EXPECT_LE(slab.bytes, slab_bytes);
    uint64_t sum = 0;
    std::set<std::string> names;
    for (const TensorPiece& p : slab.pieces) {
      sum += p.bytes;
      EXPECT_TRUE(names.insert(p.tensor->name).second) << p.tensor->name;
    }
    EXPECT_EQ(sum, slab.bytes);
    at += slab.bytes;
  }
  EXPECT_EQ(at, offset + total);
}

TEST(PlanSlabsTest, ManyTinyTensorsShareSlabsAndEmptyOnesTakeNone) {
  std::vector<TensorInfo> infos;
  for (int i = 0; i < 100; ++i) infos.push_back(Info("t" + std::to_string(i), DType::kF32, {3}, 1));
  infos.push_back(Info("empty", DType::kF32, {0, 3}, 0));
  infos.push_back(Info("scalar", DType::kF64, {}, 1));
  std::vector<const TensorInfo*> tensors;
  for (const TensorInfo& info : infos) tensors.push_back(&info);
  const std::vector<Slab> slabs = PlanSlabs(tensors, 4096, 100);
  ExpectCovers(slabs, 4096, 100 * 12 + 8, 100);
  EXPECT_EQ(slabs.size(), 13u);  // 8 tensors of 12 bytes a slab
  for (const Slab& slab : slabs) {
    for (const TensorPiece& p : slab.pieces) EXPECT_EQ(p.shape, p.tensor->shape);
  }
}

TEST(PlanSlabsTest, ATensorLargerThanASlabIsCutIntoRowsOfWholeChunks) {
  // 1024 rows of 1 KiB in chunks of 4 KiB; a slab of 64 KiB and a bit holds 64 rows.
  const TensorInfo info = Info("w", DType::kF32, {1024, 256}, 256);
  const TensorInfo* tensors[] = {&info};
  const std::vector<Slab> slabs = PlanSlabs(tensors, 0, (64 << 10) + 100);
  ExpectCovers(slabs, 0, info.bytes, (64 << 10) + 100);
  ASSERT_EQ(slabs.size(), 16u);
  EXPECT_EQ(slabs[3].pieces[0].first, (std::vector<int64_t>{192, 0}));
  EXPECT_EQ(slabs[3].pieces[0].shape, (std::vector<int64_t>{64, 256}));
}

TEST(PlanSlabsTest, ARowLargerThanASlabIsCutWithinTheRow) {
  // Rows of 20000 bytes, each of five sub-rows of 4000 bytes; a slab of 8192 holds two.
  const TensorInfo info = Info("w", DType::kF32, {3, 5, 1000}, 15);
  const TensorInfo* tensors[] = {&info};
  const std::vector<Slab> slabs = PlanSlabs(tensors, 8, 8192);
  ExpectCovers(slabs, 8, info.bytes, 8192);
  ASSERT_EQ(slabs.size(), 9u);
  EXPECT_EQ(slabs[5].pieces[0].first, (std::vector<int64_t>{1, 4, 0}));
  EXPECT_EQ(slabs[5].pieces[0].shape, (std::vector<int64_t>{1, 1, 1000}));
}

// A reader that counts the restore calls (one per slab) and lets a test wait for the n-th.
class CountingReader final : public CheckpointReader {
 public:
  explicit CountingReader(std::unique_ptr<CheckpointReader> base) : base_(std::move(base)) {}
  const std::string& path() const override { return base_->path(); }
  const CheckpointMetadata& metadata() const override { return base_->metadata(); }
  const std::vector<TensorInfo>& tensors() const override { return base_->tensors(); }
  const TensorInfo* find(const std::string& name) const override { return base_->find(name); }
  uint32_t num_data_files() const override { return base_->num_data_files(); }
  bool sharded() const override { return base_->sharded(); }
  uint32_t world_size() const override { return base_->world_size(); }
  ReadStats read_stats() const override { return base_->read_stats(); }
  Status read(const std::string& name, void* dst, size_t dst_bytes) override {
    return base_->read(name, dst, dst_bytes);
  }
  Status read_box(const std::string& name, const std::vector<int64_t>& offset,
                  const std::vector<int64_t>& shape, void* dst, size_t dst_bytes) override {
    return base_->read_box(name, offset, shape, dst, dst_bytes);
  }
  Status restore(const TensorRegistry& registry) override {
    Status status = base_->restore(registry);
    std::lock_guard lock(mu_);
    ++restored_;
    changed_.notify_all();
    return status;
  }
  VerifyReport verify() override { return base_->verify(); }

  // Whether `n` slabs were read within a minute (a bound against a hang, never a timing).
  bool WaitRestored(int n) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, std::chrono::minutes(1), [&] { return restored_ >= n; });
  }
  int restored() {
    std::lock_guard lock(mu_);
    return restored_;
  }

 private:
  std::unique_ptr<CheckpointReader> base_;
  std::mutex mu_;
  std::condition_variable changed_;
  int restored_ = 0;
};

// Forwards to a real file; before the write numbered `gate_at` (from 0) runs `gate`, and fails
// the write numbered `fail_at`.
class ScriptedFile final : public io::File {
 public:
  explicit ScriptedFile(std::unique_ptr<io::File> base) : base_(std::move(base)) {}
  const std::string& path() const override { return base_->path(); }
  bool is_direct() const override { return base_->is_direct(); }
  io::IoStatus write_at(uint64_t offset, const void* data, size_t n) override {
    const int index = writes_++;
    if (index == gate_at) gate();
    if (index == fail_at) return io::IoStatus(EIO, "write " + path() + ": Input/output error");
    return base_->write_at(offset, data, n);
  }
  io::IoStatus read_at(uint64_t offset, void* data, size_t n) override {
    return base_->read_at(offset, data, n);
  }
  io::IoStatus sync() override { return base_->sync(); }
  io::IoStatus size(uint64_t* bytes) override { return base_->size(bytes); }
  io::IoStatus truncate(uint64_t bytes) override { return base_->truncate(bytes); }
  int fd() const override { return base_->fd(); }

  int writes() const { return writes_; }
  int gate_at = -1;
  std::function<void()> gate;
  int fail_at = -1;

 private:
  std::unique_ptr<io::File> base_;
  int writes_ = 0;
};

class SlabCopyTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/slab_copy_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    fs_ = io::NewPosixFileSystem();
  }
  void TearDown() override { fs::remove_all(root_); }

  // Saves `specs` in chunks of 4 KiB, bytes of no pattern a codec shrinks much, and opens it.
  void Save(const std::vector<std::tuple<std::string, DType, std::vector<int64_t>>>& specs) {
    TensorRegistry registry;
    uint32_t state = 12345;
    for (const auto& [name, dtype, shape] : specs) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<uint8_t>& bytes = data_[name];
      bytes.resize(size_t(n) * DTypeSize(dtype));
      for (uint8_t& b : bytes) b = uint8_t((state = state * 1103515245 + 12345) >> 24);
      ASSERT_TRUE(
          registry.add({name, dtype, shape, bytes.data(), bytes.size(), nullptr, {}, {}}).ok());
      names_.push_back(name);
    }
    SaverOptions options;
    options.checkpoint_dir = root_ + "/ckpt";
    options.save_steps = 1;
    options.chunk_bytes = 4096;
    auto checkpointer = Checkpointer::Create(options, SaveMode::kSynchronous);
    ASSERT_TRUE(checkpointer.ok());
    ASSERT_TRUE((*checkpointer)->save(1, registry).ok());
    ASSERT_TRUE((*checkpointer)->close().ok());
    checkpoint_ = options.checkpoint_dir + "/model.ckpt-1";
    auto reader = CheckpointReader::Open(checkpoint_);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    reader_ = std::make_unique<CountingReader>(std::move(*reader));
  }

  // The output file, direct or buffered as the test's parameter says (skipped where the file
  // system refuses O_DIRECT).
  std::unique_ptr<ScriptedFile> Open() {
    std::unique_ptr<io::File> file;
    EXPECT_TRUE(
        fs_->open(root_ + "/out", {.write = true, .create = true, .direct = GetParam()}, &file)
            .ok());
    return std::make_unique<ScriptedFile>(std::move(file));
  }

  std::vector<Slab> Plan(uint64_t offset, uint64_t slab_bytes) {
    tensors_.clear();
    for (const std::string& name : names_) tensors_.push_back(reader_->find(name));
    return PlanSlabs(tensors_, offset, slab_bytes);
  }

  std::string Expected(uint64_t offset) {
    std::string out(offset, '\0');
    for (const std::string& name : names_) out.append(data_[name].begin(), data_[name].end());
    return out;
  }

  std::string Written() {
    std::ifstream in(root_ + "/out", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  std::string root_;
  std::string checkpoint_;
  std::unique_ptr<io::FileSystem> fs_;
  std::unique_ptr<CountingReader> reader_;
  std::vector<std::string> names_;
  std::vector<const TensorInfo*> tensors_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, SlabCopyTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Direct" : "Buffered"; });

TEST_P(SlabCopyTest, RoundTripsBitExactWithSeveralSlabsInFlight) {
  std::vector<std::tuple<std::string, DType, std::vector<int64_t>>> specs = {
      {"a_big", DType::kU8, {300, 1001}},  // 18 slabs, rows not a multiple of a page
      {"b_wide", DType::kF32, {2, 3, 3000}},
      {"c_scalar", DType::kF64, {}},
      {"d_empty", DType::kF32, {0, 3}}};
  for (int i = 0; i < 200; ++i)
    specs.emplace_back("e_tiny" + std::to_string(i), DType::kU8, std::vector<int64_t>{7});
  Save(specs);
  std::unique_ptr<ScriptedFile> out = Open();
  if (GetParam() && !out->is_direct()) GTEST_SKIP() << "no O_DIRECT under /tmp";
  const std::vector<Slab> slabs = Plan(4096, 16 << 10);
  ASSERT_GT(slabs.size(), 20u);
  ASSERT_TRUE(CopySlabs(*reader_, slabs, *out, {.slabs = 3}).ok());
  const std::string want = Expected(4096);
  const std::string got = Written();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got.compare(4096, std::string::npos, want, 4096) == 0);
  EXPECT_EQ(reader_->restored(), int(slabs.size()));
}

TEST_P(SlabCopyTest, TheReaderRunsAheadWhileASlabIsBeingWritten) {
  Save({{"w", DType::kU8, {64, 4096}}});
  std::unique_ptr<ScriptedFile> out = Open();
  const std::vector<Slab> slabs = Plan(0, 4 << 10);
  ASSERT_EQ(slabs.size(), 64u);
  // The first write waits until the reader has filled the two other slots: the reads went on
  // while the writer held slab 0.
  bool ran_ahead = false;
  out->gate_at = 0;
  out->gate = [&] { ran_ahead = reader_->WaitRestored(3); };
  ASSERT_TRUE(CopySlabs(*reader_, slabs, *out, {.slabs = 3}).ok());
  EXPECT_TRUE(ran_ahead);
  EXPECT_EQ(Written(), Expected(0));
}

TEST_P(SlabCopyTest, ADamagedChunkFailsNamingTheTensorAndNothingAfterItIsWritten) {
  Save({{"a", DType::kU8, {16, 4096}}, {"b", DType::kU8, {16, 4096}}});
  ASSERT_TRUE(testing_support::DamageChunk(*fs_, checkpoint_, "b", 5).ok());
  std::unique_ptr<ScriptedFile> out = Open();
  const std::vector<Slab> slabs = Plan(0, 8 << 10);  // b's chunk 5 is in slab 10
  const Status status = CopySlabs(*reader_, slabs, *out, {.slabs = 3});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("reading tensor \"b\" box [4:6, 0:4096]"));
  EXPECT_THAT(status.message(), HasSubstr("data-0000"));
  EXPECT_EQ(out->writes(), 10);
  EXPECT_LE(reader_->restored(), 11);
}

TEST_P(SlabCopyTest, AFailedWriteStopsTheReaderAndNamesTheFile) {
  Save({{"w", DType::kU8, {64, 4096}}});
  std::unique_ptr<ScriptedFile> out = Open();
  out->fail_at = 1;
  const Status status = CopySlabs(*reader_, Plan(0, 4 << 10), *out, {.slabs = 3});
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kIOError) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("writing tensor \"w\" box [1:2, 0:4096]"));
  EXPECT_THAT(status.message(), HasSubstr(root_ + "/out"));
  EXPECT_EQ(out->writes(), 2);
  EXPECT_LE(reader_->restored(), 1 + 3);  // the slab written, and at most the others' slots
}

}  // namespace
}  // namespace asyncckpt::interop
