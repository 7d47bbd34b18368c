// RecordDatasetIterator and WriteRecordDataset: the file round trip, the multiset of a finite
// dataset, the seeded shuffle, exact save/restore at many positions (inside the first fill of
// the shuffle buffer, across epochs, at the end), restores that must be refused, files that must
// be refused, and a prefetch thread that never keeps a destroyed iterator alive.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "asyncckpt/input_pipeline.h"
#include "tests/support/files.h"
#include "tests/support/watchdog.h"

namespace asyncckpt {
namespace {

namespace fs = std::filesystem;
using Record = std::vector<uint8_t>;

// A record as a map key. std::map<Record, int> compares vectors with operator<=>, for which GCC
// 12 at -O3 reports a memcmp of up to 2^64 bytes (-Wstringop-overread, a false positive) and
// fails the Release build; strings compare with a bounded memcmp.
std::string Key(const Record& record) { return std::string(record.begin(), record.end()); }
using testing_support::ReadFile;
using testing_support::WriteFile;

constexpr size_t kHeaderBytes = 32;
// A read loop that runs past this many records has lost its end: a test failure, not a hang.
constexpr size_t kReadCap = 1 << 20;

// The header WriteRecordDataset writes, built independently from the documented layout.
std::string EncodeHeader(uint64_t num_records, uint32_t record_bytes, const char* magic) {
  std::string header(kHeaderBytes, '\0');
  std::memcpy(header.data(), magic, 8);
  std::memcpy(header.data() + 8, &num_records, 8);
  std::memcpy(header.data() + 16, &record_bytes, 4);
  const uint64_t sum = XXH3_64bits(header.data(), 24);
  std::memcpy(header.data() + 24, &sum, 8);
  return header;
}

// Reads until OutOfRange; any other failure is a test failure.
std::vector<Record> ReadToEnd(RecordDatasetIterator& it) {
  std::vector<Record> records;
  Record record;
  while (records.size() < kReadCap) {
    Status status = it.next(&record);
    if (status.code() == StatusCode::kOutOfRange) return records;
    EXPECT_TRUE(status.ok()) << status.ToString();
    if (!status.ok()) return records;
    records.push_back(record);
  }
  ADD_FAILURE() << "the iterator did not end after " << kReadCap << " records";
  return records;
}

std::vector<Record> ReadN(RecordDatasetIterator& it, size_t n) {
  std::vector<Record> records;
  Record record;
  for (size_t i = 0; i < n; ++i) {
    Status status = it.next(&record);
    EXPECT_TRUE(status.ok()) << "record " << i << ": " << status.ToString();
    if (!status.ok()) break;
    records.push_back(record);
  }
  return records;
}

class RecordDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/record_dataset_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/data.bin";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Writes a dataset at path_ and returns its records in file order, read straight from the file.
  std::vector<Record> Write(uint64_t num_records, uint32_t record_bytes, uint64_t seed = 7,
                            const std::string& path = "") {
    const std::string target = path.empty() ? path_ : path;
    Status written = WriteRecordDataset(target, num_records, record_bytes, seed);
    EXPECT_TRUE(written.ok()) << written.ToString();
    const std::string bytes = ReadFile(target);
    EXPECT_EQ(bytes.size(), kHeaderBytes + num_records * record_bytes);
    std::vector<Record> records;
    for (uint64_t i = 0; i < num_records && bytes.size() >= kHeaderBytes + (i + 1) * record_bytes;
         ++i) {
      const char* first = bytes.data() + kHeaderBytes + i * record_bytes;
      records.emplace_back(first, first + record_bytes);
    }
    return records;
  }

  RecordDatasetOptions Options(size_t shuffle_buffer, int64_t epochs, uint64_t seed = 1,
                               size_t prefetch = 8) const {
    RecordDatasetOptions options;
    options.path = path_;
    options.shuffle_buffer = shuffle_buffer;
    options.prefetch = prefetch;
    options.seed = seed;
    options.epochs = epochs;
    return options;
  }

  std::unique_ptr<RecordDatasetIterator> Open(const RecordDatasetOptions& options) {
    auto it = RecordDatasetIterator::Open(options);
    EXPECT_TRUE(it.ok()) << it.status().ToString();
    return it.ok() ? std::move(it).value() : nullptr;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(RecordDatasetTest, WrittenFileOpensAndYieldsItsRecordsInFileOrder) {
  // 24-byte records: the generator's last word per record is partial.
  const std::vector<Record> file = Write(100, 24);
  const std::string bytes = ReadFile(path_);
  ASSERT_GE(bytes.size(), kHeaderBytes);
  EXPECT_EQ(bytes.substr(0, 8), "ACKPTDS1");
  EXPECT_EQ(bytes.substr(0, kHeaderBytes), EncodeHeader(100, 24, "ACKPTDS1"));

  auto it = Open(Options(/*shuffle_buffer=*/1, /*epochs=*/1));
  ASSERT_NE(it, nullptr);
  EXPECT_EQ(it->record_bytes(), 24u);
  EXPECT_EQ(it->num_records(), 100u);
  EXPECT_EQ(ReadToEnd(*it), file);
  EXPECT_EQ(it->records_emitted(), 100);
  Record record;
  EXPECT_EQ(it->next(&record).code(), StatusCode::kOutOfRange);
}

TEST_F(RecordDatasetTest, RecordsDependOnTheSeedAndDifferFromEachOther) {
  const std::vector<Record> a = Write(64, 16, /*seed=*/3, dir_ + "/a.bin");
  const std::vector<Record> same = Write(64, 16, /*seed=*/3, dir_ + "/same.bin");
  const std::vector<Record> other = Write(64, 16, /*seed=*/4, dir_ + "/other.bin");
  EXPECT_EQ(ReadFile(dir_ + "/a.bin"), ReadFile(dir_ + "/same.bin"));
  EXPECT_NE(a, other);
  std::map<std::string, int> distinct;
  for (const Record& record : a) ++distinct[Key(record)];
  EXPECT_EQ(distinct.size(), a.size()) << "records must be distinguishable for the tests below";
}

TEST_F(RecordDatasetTest, WriteRejectsZeroRecordBytes) {
  EXPECT_EQ(WriteRecordDataset(path_, 10, 0, 1).code(), StatusCode::kInvalidArgument);
}

TEST_F(RecordDatasetTest, WriteReplacesTheFileWholeAndLeavesNoTemporary) {
  Write(10, 8, /*seed=*/1);
  const std::vector<Record> second = Write(30, 8, /*seed=*/2);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"data.bin"});
  auto it = Open(Options(1, 1));
  ASSERT_NE(it, nullptr);
  EXPECT_EQ(ReadToEnd(*it), second);

  const std::string missing = dir_ + "/no-such-dir/data.bin";
  Status status = WriteRecordDataset(missing, 10, 8, 1);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find(missing), std::string::npos) << status.message();
}

TEST_F(RecordDatasetTest, FiniteDatasetYieldsEveryRecordOncePerEpochThenOutOfRange) {
  const std::vector<Record> file = Write(150, 32);
  auto it = Open(Options(/*shuffle_buffer=*/40, /*epochs=*/2));
  ASSERT_NE(it, nullptr);
  const std::vector<Record> got = ReadToEnd(*it);
  ASSERT_EQ(got.size(), 300u);
  std::map<std::string, int> count;
  for (const Record& record : got) ++count[Key(record)];
  ASSERT_EQ(count.size(), file.size());
  for (const Record& record : file) EXPECT_EQ(count[Key(record)], 2);
  EXPECT_NE(std::vector<Record>(got.begin(), got.begin() + 150), file) << "not shuffled";
  Record record;
  EXPECT_EQ(it->next(&record).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(it->next(&record).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(it->records_emitted(), 300);
}

TEST_F(RecordDatasetTest, ShuffleBufferOfOneKeepsFileOrderEveryEpoch) {
  const std::vector<Record> file = Write(50, 8);
  auto it = Open(Options(/*shuffle_buffer=*/1, /*epochs=*/3, /*seed=*/99));
  ASSERT_NE(it, nullptr);
  std::vector<Record> expected;
  for (int epoch = 0; epoch < 3; ++epoch) expected.insert(expected.end(), file.begin(), file.end());
  EXPECT_EQ(ReadToEnd(*it), expected);
}

TEST_F(RecordDatasetTest, SameSeedGivesSameOrderAndAnotherSeedAnother) {
  Write(200, 16);
  auto first = Open(Options(50, 2, /*seed=*/11));
  auto again = Open(Options(50, 2, /*seed=*/11));
  auto other = Open(Options(50, 2, /*seed=*/12));
  ASSERT_TRUE(first && again && other);
  const std::vector<Record> a = ReadToEnd(*first);
  EXPECT_EQ(a.size(), 400u);
  EXPECT_EQ(ReadToEnd(*again), a);
  EXPECT_NE(ReadToEnd(*other), a);
}

TEST_F(RecordDatasetTest, EmptyDatasetAndZeroEpochsEndAtOnce) {
  Write(0, 16);
  auto empty = Open(Options(10, -1));
  ASSERT_NE(empty, nullptr);
  Record record;
  EXPECT_EQ(empty->next(&record).code(), StatusCode::kOutOfRange);
  Write(10, 16);
  auto none = Open(Options(10, 0));
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->next(&record).code(), StatusCode::kOutOfRange);
}

TEST_F(RecordDatasetTest, NextBatchConcatenatesAndTheLastBatchMayBeShort) {
  const std::vector<Record> file = Write(10, 4);
  auto it = Open(Options(1, 1));
  ASSERT_NE(it, nullptr);
  std::vector<uint8_t> batch, all;
  std::vector<size_t> sizes;
  Status status;
  while ((status = it->next_batch(4, &batch)).ok()) {
    sizes.push_back(batch.size());
    all.insert(all.end(), batch.begin(), batch.end());
  }
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(sizes, (std::vector<size_t>{16, 16, 8}));
  std::vector<uint8_t> expected;
  for (const Record& record : file) expected.insert(expected.end(), record.begin(), record.end());
  EXPECT_EQ(all, expected);
}

// Save after k records, read on to the end (A); restore into a new iterator and read to the end
// (B): A == B. N = 100 records, shuffle buffer 32, prefetch 8, 3 epochs (300 records).
class SaveRestoreTest : public RecordDatasetTest, public ::testing::WithParamInterface<size_t> {};

TEST_P(SaveRestoreTest, RestoredIteratorContinuesExactlyWhereTheSavedOneWent) {
  const size_t k = GetParam();
  Write(100, 16);
  const RecordDatasetOptions options = Options(/*shuffle_buffer=*/32, /*epochs=*/3, /*seed=*/5);
  auto original = Open(options);
  ASSERT_NE(original, nullptr);
  ASSERT_EQ(ReadN(*original, k).size(), k);
  IteratorState state;
  ASSERT_TRUE(original->save(&state).ok());
  EXPECT_LE(state.total_bytes(), original->max_state_bytes());
  const std::vector<Record> a = ReadToEnd(*original);
  EXPECT_EQ(a.size(), 300 - k);

  auto restored = Open(options);
  ASSERT_NE(restored, nullptr);
  Status status = restored->restore(state);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(restored->records_emitted(), static_cast<int64_t>(k));
  EXPECT_EQ(ReadToEnd(*restored), a);
  EXPECT_EQ(restored->records_emitted(), 300);
}

// 0: before anything was read; 1, 5, 31: while the shuffle buffer still holds its first fill;
// 60..140: the producer and then the consumer cross the first epoch boundary; 299, 300: the
// end, with one record and with none left.
INSTANTIATE_TEST_SUITE_P(Positions, SaveRestoreTest,
                         ::testing::Values(0, 1, 5, 31, 60, 99, 100, 101, 140, 250, 299, 300));

TEST_F(RecordDatasetTest, RestoreWorksIntoAnIteratorThatAlreadyReadAndIntoOneWithAnotherSeed) {
  Write(80, 16);
  auto original = Open(Options(20, -1, /*seed=*/3));
  ASSERT_NE(original, nullptr);
  ReadN(*original, 37);
  IteratorState state;
  ASSERT_TRUE(original->save(&state).ok());
  const std::vector<Record> a = ReadN(*original, 200);

  // The generator's state travels with the checkpoint: the target's own seed does not matter.
  auto busy = Open(Options(20, -1, /*seed=*/1234));
  ASSERT_NE(busy, nullptr);
  ReadN(*busy, 55);
  ASSERT_TRUE(busy->restore(state).ok());
  EXPECT_EQ(ReadN(*busy, 200), a);
}

TEST_F(RecordDatasetTest, ChainedSaveAndRestoreStaysExact) {
  Write(60, 8);
  const RecordDatasetOptions options = Options(25, 4, /*seed=*/8);
  auto straight = Open(options);
  ASSERT_NE(straight, nullptr);
  const std::vector<Record> expected = ReadToEnd(*straight);
  ASSERT_EQ(expected.size(), 240u);

  std::vector<Record> got;
  IteratorState state;
  for (size_t leg : {13u, 47u, 90u}) {
    auto it = Open(options);
    ASSERT_NE(it, nullptr);
    if (!state.entries().empty()) {
      ASSERT_TRUE(it->restore(state).ok());
    }
    for (Record& record : ReadN(*it, leg)) got.push_back(std::move(record));
    state.clear();
    ASSERT_TRUE(it->save(&state).ok());
  }
  auto last = Open(options);
  ASSERT_NE(last, nullptr);
  ASSERT_TRUE(last->restore(state).ok());
  for (Record& record : ReadToEnd(*last)) got.push_back(std::move(record));
  EXPECT_EQ(got, expected);
}

// The saved state is a function of what was consumed, not of how far the prefetch thread got:
// two iterators at the same position save the same bytes (train-sim digests it).
TEST_F(RecordDatasetTest, SavedStateDoesNotDependOnPrefetchTiming) {
  Write(300, 32);
  for (size_t k : {0u, 3u, 170u}) {
    for (int trial = 0; trial < 20; ++trial) {
      auto a = Open(Options(50, -1, 2, /*prefetch=*/64));
      auto b = Open(Options(50, -1, 2, /*prefetch=*/64));
      ASSERT_TRUE(a && b);
      ReadN(*a, k);
      ReadN(*b, k);
      IteratorState sa, sb;
      ASSERT_TRUE(a->save(&sa).ok());
      ASSERT_TRUE(b->save(&sb).ok());
      ASSERT_EQ(sa.entries().size(), sb.entries().size());
      for (size_t i = 0; i < sa.entries().size(); ++i) {
        EXPECT_EQ(sa.entries()[i].name, sb.entries()[i].name);
        ASSERT_EQ(sa.entries()[i].bytes, sb.entries()[i].bytes)
            << "entry " << sa.entries()[i].name << " after " << k << " records, trial " << trial;
      }
    }
  }
}

TEST_F(RecordDatasetTest, RestoreIntoASmallerShuffleBufferIsCorruptionAndChangesNothing) {
  const std::vector<Record> file = Write(100, 16);
  auto big = Open(Options(64, -1));
  ASSERT_NE(big, nullptr);
  ReadN(*big, 3);
  IteratorState state;
  ASSERT_TRUE(big->save(&state).ok());

  auto small = Open(Options(/*shuffle_buffer=*/1, /*epochs=*/1));
  ASSERT_NE(small, nullptr);
  Status status = small->restore(state);
  EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
  EXPECT_NE(status.message().find("shuffle_buffer"), std::string::npos) << status.message();
  // A refused restore leaves the iterator as it was.
  EXPECT_EQ(ReadToEnd(*small), file);
}

TEST_F(RecordDatasetTest, RestoreOfAStateThatDoesNotFitIsCorruptionNamingTheEntry) {
  Write(100, 16);
  auto source = Open(Options(10, -1));
  ASSERT_NE(source, nullptr);
  ReadN(*source, 4);
  IteratorState good;
  ASSERT_TRUE(source->save(&good).ok());

  auto target = Open(Options(10, -1));
  ASSERT_NE(target, nullptr);
  auto expect_refused = [&](const IteratorState& state, const std::string& entry) {
    Status status = target->restore(state);
    EXPECT_EQ(status.code(), StatusCode::kCorruption) << status.ToString();
    EXPECT_NE(status.message().find(entry), std::string::npos) << status.message();
  };
  // Copies `good`, replacing one entry (or dropping it when `bytes` is null).
  auto with = [&](const std::string& name, const std::vector<uint8_t>* bytes, DType dtype,
                  std::vector<int64_t> shape) {
    IteratorState state;
    for (const auto& entry : good.entries()) {
      if (entry.name != name) {
        EXPECT_TRUE(state.put(entry.name, entry.dtype, entry.shape, entry.bytes).ok());
      } else if (bytes != nullptr) {
        EXPECT_TRUE(state.put(name, dtype, shape, *bytes).ok());
      }
    }
    return state;
  };
  for (const char* name : {"position", "rng", "shuffle_buffer", "prefetch_buffer"}) {
    expect_refused(with(name, nullptr, DType::kU8, {}), name);
  }
  const std::vector<uint8_t> odd(17, 0);
  expect_refused(with("shuffle_buffer", &odd, DType::kU8, {17}), "shuffle_buffer");
  expect_refused(with("prefetch_buffer", &odd, DType::kU8, {17}), "prefetch_buffer");
  expect_refused(with("rng", &odd, DType::kU8, {17}), "rng");
  // Positions: another record size, a negative epoch, an index at or past the end of the file.
  auto position = [&](int64_t epoch, int64_t index, int64_t emitted, int64_t record_bytes) {
    const int64_t values[4] = {epoch, index, emitted, record_bytes};
    std::vector<uint8_t> bytes(sizeof(values));
    std::memcpy(bytes.data(), values, sizeof(values));
    return with("position", &bytes, DType::kI64, {4});
  };
  expect_refused(position(0, 5, 4, 32), "position");
  expect_refused(position(-1, 5, 4, 16), "position");
  expect_refused(position(0, 100, 4, 16), "position");
  expect_refused(position(0, -1, 4, 16), "position");
  expect_refused(position(0, 5, -4, 16), "position");

  // After all of that the good state still restores.
  ASSERT_TRUE(target->restore(good).ok());
  IteratorState again;
  ASSERT_TRUE(target->save(&again).ok());
  ASSERT_EQ(again.entries().size(), good.entries().size());
  for (size_t i = 0; i < good.entries().size(); ++i) {
    EXPECT_EQ(again.entries()[i].bytes, good.entries()[i].bytes) << good.entries()[i].name;
  }
}

TEST_F(RecordDatasetTest, OpenRefusesBadFilesNamingThem) {
  auto expect_refused = [&](StatusCode code, const std::string& what) {
    auto it = RecordDatasetIterator::Open(Options(4, 1));
    ASSERT_FALSE(it.ok()) << what;
    EXPECT_EQ(it.status().code(), code) << what << ": " << it.status().ToString();
    EXPECT_NE(it.status().message().find(path_), std::string::npos)
        << what << ": " << it.status().message();
    EXPECT_NE(it.status().message().find(what), std::string::npos)
        << "expected '" << what << "' in: " << it.status().message();
  };
  // Missing.
  expect_refused(StatusCode::kNotFound, "data.bin");
  // Shorter than a header.
  WriteFile(path_, std::string(10, 'x'));
  expect_refused(StatusCode::kCorruption, "too short");
  // Another magic, its checksum right.
  WriteFile(path_, EncodeHeader(0, 8, "NOTADSET"));
  expect_refused(StatusCode::kCorruption, "magic");
  // A record count changed after the checksum was computed.
  Write(20, 8);
  std::string bytes = ReadFile(path_);
  bytes[8] ^= 1;
  WriteFile(path_, bytes);
  expect_refused(StatusCode::kCorruption, "checksum");
  // The checksum itself damaged.
  Write(20, 8);
  bytes = ReadFile(path_);
  bytes[30] ^= 0x40;
  WriteFile(path_, bytes);
  expect_refused(StatusCode::kCorruption, "checksum");
  // A consistent header that promises more records than follow it.
  Write(20, 8);
  bytes = ReadFile(path_);
  bytes.resize(bytes.size() - 1);
  WriteFile(path_, bytes);
  expect_refused(StatusCode::kCorruption, "promises");
  WriteFile(path_, EncodeHeader(~uint64_t{0} / 2, 8, "ACKPTDS1") + std::string(64, '\0'));
  expect_refused(StatusCode::kCorruption, "promises");
  // A zero record size with a valid checksum.
  WriteFile(path_, EncodeHeader(5, 0, "ACKPTDS1"));
  expect_refused(StatusCode::kCorruption, "promises");
}

TEST_F(RecordDatasetTest, OpenOfAFifoOrADirectoryFailsAtOnceNamingIt) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0644), 0) << std::strerror(errno);
  // In a child under a watchdog: an open() that blocked on the FIFO would never return.
  const testing_support::ChildOutcome outcome = testing_support::RunInChild(
      [&](std::string* message) {
        auto it = RecordDatasetIterator::Open(Options(4, 1));
        *message = it.ok() ? "opened" : it.status().ToString();
        return it.ok() ? 1 : 0;
      },
      std::chrono::seconds(60));
  ASSERT_TRUE(outcome.ended_on_its_own) << "opening a FIFO as the dataset blocked";
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_EQ(outcome.message,
            "IOError: opening the dataset: " + path_ + " is a FIFO, not a regular file");

  fs::remove(path_);
  fs::create_directory(path_);
  auto it = RecordDatasetIterator::Open(Options(4, 1));
  ASSERT_FALSE(it.ok());
  EXPECT_NE(it.status().message().find(path_ + " is a directory, not a regular file"),
            std::string::npos)
      << it.status().ToString();
}

// The prefetch thread blocks on a full queue; destruction must wake and join it wherever it is.
TEST_F(RecordDatasetTest, DestroyingAnIteratorAnywhereDoesNotHang) {
  Write(500, 64);
  for (int round = 0; round < 40; ++round) {
    auto it = Open(Options(16, -1, round, /*prefetch=*/1 + round % 5));
    ASSERT_NE(it, nullptr);
    if (round % 4 == 0) continue;  // before the first record
    ReadN(*it, static_cast<size_t>(round * 7));
    if (round % 4 == 1) continue;  // mid-epoch
    IteratorState state;
    ASSERT_TRUE(it->save(&state).ok());
    if (round % 4 == 2) continue;          // right after a save
    ASSERT_TRUE(it->restore(state).ok());  // right after a restore restarted the thread
  }
  // And a finite iterator whose thread already finished.
  auto done = Open(Options(4, 1));
  ASSERT_NE(done, nullptr);
  EXPECT_EQ(ReadToEnd(*done).size(), 500u);
}

TEST_F(RecordDatasetTest, OpenRefusesUnreasonableOptions) {
  Write(10, 8);
  RecordDatasetOptions options = Options(1, 1);
  options.shuffle_buffer = size_t{1} << 40;
  EXPECT_EQ(RecordDatasetIterator::Open(options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncckpt
