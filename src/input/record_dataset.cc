// RecordDatasetIterator: fixed-size records from a file, read ahead by a background thread,
// shuffled through a seeded buffer, epoch after epoch; its whole state saves and restores.

#include <xxhash.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/file_system.h"
#include "asyncckpt/input_pipeline.h"
#include "src/state/checkpoint_state.h"
#include "src/util/io_status.h"
#include "src/util/status_macros.h"

namespace asyncckpt {

namespace {

constexpr char kDatasetMagic[8] = {'A', 'C', 'K', 'P', 'T', 'D', 'S', '1'};
constexpr size_t kHeaderBytes = 32;
constexpr uint32_t kMaxRecordBytes = 64u << 20;

struct Header {
  uint64_t num_records = 0;
  uint32_t record_bytes = 0;
};

void EncodeHeader(const Header& header, uint8_t* out) {
  std::memcpy(out, kDatasetMagic, 8);
  std::memcpy(out + 8, &header.num_records, 8);
  std::memcpy(out + 16, &header.record_bytes, 4);
  std::memset(out + 20, 0, 4);
  const uint64_t sum = XXH3_64bits(out, 24);
  std::memcpy(out + 24, &sum, 8);
}

// xoshiro256**: small, fast, and its whole state is four words we can save.
struct Rng {
  uint64_t s[4];
  static uint64_t SplitMix(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  explicit Rng(uint64_t seed = 0) {
    for (auto& word : s) word = SplitMix(seed);
  }
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t Next() {
    const uint64_t result = Rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = Rotl(s[3], 45);
    return result;
  }
};

}  // namespace

namespace {

// Writes the header and every record into `file`, then syncs it.
Status WriteRecords(io::File& file, uint64_t num_records, uint32_t record_bytes, uint64_t seed) {
  uint8_t header[kHeaderBytes];
  EncodeHeader(Header{num_records, record_bytes}, header);
  RETURN_IF_ERROR(ToStatus(file.write_at(0, header, kHeaderBytes)));
  // Records are written in blocks; each record's bytes come from its index and the seed.
  const uint64_t per_block = std::max<uint64_t>(1, (1u << 20) / record_bytes);
  std::vector<uint8_t> block;
  for (uint64_t first = 0; first < num_records; first += per_block) {
    const uint64_t count = std::min(per_block, num_records - first);
    block.resize(count * record_bytes);
    for (uint64_t r = 0; r < count; ++r) {
      Rng rng(seed ^ ((first + r) * 0x9E3779B97F4A7C15ull));
      for (uint32_t b = 0; b < record_bytes; b += 8) {
        const uint64_t word = rng.Next();
        std::memcpy(block.data() + r * record_bytes + b, &word,
                    std::min<uint32_t>(8, record_bytes - b));
      }
    }
    RETURN_IF_ERROR(
        ToStatus(file.write_at(kHeaderBytes + first * record_bytes, block.data(), block.size())));
  }
  return ToStatus(file.sync());
}

std::string ParentDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

Status WriteRecordDataset(const std::string& path, uint64_t num_records, uint32_t record_bytes,
                          uint64_t seed) {
  if (record_bytes == 0 || record_bytes > kMaxRecordBytes) {
    return Status::InvalidArgument("record_bytes must be in [1, 64 MiB], got " +
                                   std::to_string(record_bytes));
  }
  if (num_records > (uint64_t{1} << 62) / record_bytes) {
    return Status::InvalidArgument("a dataset of " + std::to_string(num_records) + " records of " +
                                   std::to_string(record_bytes) + " bytes is too large");
  }
  // Written under a temporary name and renamed into place, so a writer killed midway never
  // leaves a truncated dataset at `path` that every later run would refuse.
  auto fs = io::NewPosixFileSystem();
  const std::string tmp = TempDirName(path);
  Status status;
  {
    std::unique_ptr<io::File> file;
    status = ToStatus(fs->open(tmp, {.write = true, .create = true, .truncate = true}, &file));
    if (status.ok()) status = WriteRecords(*file, num_records, record_bytes, seed);
  }
  if (status.ok()) status = ToStatus(fs->rename(tmp, path));
  if (!status.ok()) {
    (void)fs->remove_file(tmp);  // best effort: the failure above is what matters
    return status.WithContext("writing the dataset " + path);
  }
  return ToStatus(fs->sync_dir(ParentDir(path)));
}

class RecordDatasetIterator::Impl {
 public:
  Impl(RecordDatasetOptions options, std::unique_ptr<io::FileSystem> fs,
       std::unique_ptr<io::File> file, Header header)
      : options_(std::move(options)),
        fs_(std::move(fs)),
        file_(std::move(file)),
        header_(header),
        rng_(options_.seed) {
    shuffle_.reserve(options_.shuffle_buffer * header_.record_bytes);
    StartProducer();
  }
  ~Impl() { StopProducer(); }

  Status Next(std::vector<uint8_t>* record) {
    RETURN_IF_ERROR(Fill());
    const size_t held = shuffle_.size() / header_.record_bytes;
    if (held == 0) return Status::OutOfRange("end of " + options_.path);
    const size_t pick = options_.shuffle_buffer <= 1 ? 0 : rng_.Next() % held;
    const size_t rb = header_.record_bytes;
    record->assign(shuffle_.begin() + pick * rb, shuffle_.begin() + (pick + 1) * rb);
    // The last record takes the picked one's place (tf.data's shuffle does the same).
    if (pick != held - 1) {
      std::memcpy(shuffle_.data() + pick * rb, shuffle_.data() + (held - 1) * rb, rb);
    }
    shuffle_.resize((held - 1) * rb);
    ++emitted_;
    return Status::OK();
  }

  Status Save(IteratorState* state) {
    std::unique_lock lock(mu_);
    // The prefetch queue is saved only once it is settled (full, or the file exhausted): then
    // the state is a function of what was consumed, not of how far the thread happened to read,
    // and equal positions save equal bytes.
    produced_.wait(lock, [&] {
      return producer_done_ || queue_.size() >= std::max<size_t>(1, options_.prefetch);
    });
    RETURN_IF_ERROR(producer_status_);
    const int64_t position[4] = {epoch_, index_, emitted_,
                                 static_cast<int64_t>(header_.record_bytes)};
    RETURN_IF_ERROR(state->put_i64("position", position));
    RETURN_IF_ERROR(state->put("rng", DType::kU64, {4},
                               {reinterpret_cast<const uint8_t*>(rng_.s), sizeof(rng_.s)}));
    const int64_t rb = header_.record_bytes;
    RETURN_IF_ERROR(state->put("shuffle_buffer", DType::kU8,
                               {static_cast<int64_t>(shuffle_.size()) / rb, rb}, shuffle_));
    std::vector<uint8_t> prefetched;
    for (const auto& record : queue_)
      prefetched.insert(prefetched.end(), record.begin(), record.end());
    return state->put("prefetch_buffer", DType::kU8, {static_cast<int64_t>(queue_.size()), rb},
                      prefetched);
  }

  Status Restore(const IteratorState& state) {
    RETURN_IF_ERROR(Find(state, "position").status());
    ASSIGN_OR_RETURN(const IteratorState::Entry* rng, Find(state, "rng"));
    ASSIGN_OR_RETURN(const IteratorState::Entry* shuffle, Find(state, "shuffle_buffer"));
    ASSIGN_OR_RETURN(const IteratorState::Entry* prefetch, Find(state, "prefetch_buffer"));
    ASSIGN_OR_RETURN(std::vector<int64_t> position, state.get_i64("position", 4));
    const uint64_t n = header_.num_records;
    // The producer's index is always inside the file (it wraps to 0 at the end of an epoch).
    const bool index_fits = position[1] >= 0 && (static_cast<uint64_t>(position[1]) < n ||
                                                 (n == 0 && position[1] == 0));
    if (position[3] != header_.record_bytes || position[0] < 0 || !index_fits || position[2] < 0) {
      return Status::Corruption("the saved input position (epoch " + std::to_string(position[0]) +
                                ", index " + std::to_string(position[1]) + ", emitted " +
                                std::to_string(position[2]) + ", record_bytes " +
                                std::to_string(position[3]) + ") does not fit " + options_.path +
                                " (" + std::to_string(n) + " records of " +
                                std::to_string(header_.record_bytes) + " bytes)");
    }
    const size_t rb = header_.record_bytes;
    if (rng->bytes.size() != sizeof(rng_.s)) {
      return Status::Corruption("the saved input entry 'rng' has " +
                                std::to_string(rng->bytes.size()) + " bytes, not " +
                                std::to_string(sizeof(rng_.s)));
    }
    for (const IteratorState::Entry* buffer : {shuffle, prefetch}) {
      if (buffer->bytes.size() % rb != 0) {
        return Status::Corruption("the saved input entry '" + buffer->name + "' has " +
                                  std::to_string(buffer->bytes.size()) +
                                  " bytes, not whole records of " + std::to_string(rb) +
                                  " bytes (" + options_.path + ")");
      }
    }
    if (shuffle->bytes.size() / rb > std::max<size_t>(1, options_.shuffle_buffer)) {
      return Status::Corruption("the saved input entry 'shuffle_buffer' holds " +
                                std::to_string(shuffle->bytes.size() / rb) +
                                " records, more than this iterator's shuffle_buffer of " +
                                std::to_string(options_.shuffle_buffer));
    }
    StopProducer();
    std::memcpy(rng_.s, rng->bytes.data(), sizeof(rng_.s));
    shuffle_.assign(shuffle->bytes.begin(), shuffle->bytes.end());
    queue_.clear();
    for (size_t off = 0; off < prefetch->bytes.size(); off += rb) {
      queue_.emplace_back(prefetch->bytes.begin() + off, prefetch->bytes.begin() + off + rb);
    }
    epoch_ = position[0];
    index_ = position[1];
    emitted_ = position[2];
    producer_done_ = false;
    producer_status_ = Status::OK();
    StartProducer();
    return Status::OK();
  }

  const RecordDatasetOptions& options() const { return options_; }
  const Header& header() const { return header_; }
  int64_t emitted() const { return emitted_; }

 private:
  // A missing entry means the state is not this iterator's: Corruption naming it.
  static Result<const IteratorState::Entry*> Find(const IteratorState& state,
                                                  const std::string& name) {
    auto entry = state.get(name);
    if (!entry.ok()) {
      return Status::Corruption("the saved input state has no entry '" + name + "'");
    }
    return *entry;
  }

  // Tops the shuffle buffer up from the prefetch queue.
  Status Fill() {
    const size_t rb = header_.record_bytes;
    const size_t want = std::max<size_t>(1, options_.shuffle_buffer);
    std::unique_lock lock(mu_);
    while (shuffle_.size() / rb < want) {
      produced_.wait(lock, [&] { return !queue_.empty() || producer_done_; });
      if (queue_.empty()) break;
      shuffle_.insert(shuffle_.end(), queue_.front().begin(), queue_.front().end());
      queue_.pop_front();
      consumed_.notify_one();
    }
    return producer_status_;
  }

  bool Exhausted() const { return options_.epochs >= 0 && epoch_ >= options_.epochs; }

  // The producer: reads the record at (epoch_, index_), queues it, advances. The position only
  // moves under the lock together with the queue, so Save sees a consistent pair.
  void Produce() {
    std::vector<uint8_t> record(header_.record_bytes);
    std::unique_lock lock(mu_);
    while (!stop_) {
      if (header_.num_records == 0 || Exhausted()) break;
      consumed_.wait(
          lock, [&] { return stop_ || queue_.size() < std::max<size_t>(1, options_.prefetch); });
      if (stop_) break;
      const uint64_t offset = kHeaderBytes + static_cast<uint64_t>(index_) * header_.record_bytes;
      lock.unlock();
      io::IoStatus read = file_->read_at(offset, record.data(), record.size());
      lock.lock();
      if (stop_) break;
      if (!read.ok()) {
        producer_status_ = ToStatus(read);
        break;
      }
      queue_.push_back(record);
      if (static_cast<uint64_t>(++index_) == header_.num_records) {
        index_ = 0;
        ++epoch_;
      }
      produced_.notify_one();
    }
    if (!stop_) producer_done_ = true;
    produced_.notify_all();
  }

  void StartProducer() {
    stop_ = false;
    producer_ = std::thread([this] { Produce(); });
  }

  void StopProducer() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    consumed_.notify_all();
    if (producer_.joinable()) producer_.join();
  }

  const RecordDatasetOptions options_;
  std::unique_ptr<io::FileSystem> fs_;
  std::unique_ptr<io::File> file_;
  const Header header_;

  // Consumer side.
  Rng rng_;
  std::vector<uint8_t> shuffle_;
  int64_t emitted_ = 0;

  // Shared with the producer, under mu_.
  std::mutex mu_;
  std::condition_variable produced_;
  std::condition_variable consumed_;
  std::deque<std::vector<uint8_t>> queue_;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  bool producer_done_ = false;
  bool stop_ = false;
  Status producer_status_;
  std::thread producer_;
};

Result<std::unique_ptr<RecordDatasetIterator>> RecordDatasetIterator::Open(
    const RecordDatasetOptions& options) {
  auto fs = io::NewPosixFileSystem();
  std::unique_ptr<io::File> file;
  RETURN_IF_ERROR(ToStatus(fs->open(options.path, {}, &file)).WithContext("opening the dataset"));
  uint64_t size = 0;
  RETURN_IF_ERROR(ToStatus(file->size(&size)));
  uint8_t raw[kHeaderBytes];
  if (size < kHeaderBytes) {
    return Status::Corruption(options.path + " is too short to be a dataset (" +
                              std::to_string(size) + " bytes)");
  }
  RETURN_IF_ERROR(ToStatus(file->read_at(0, raw, kHeaderBytes)));
  Header header;
  std::memcpy(&header.num_records, raw + 8, 8);
  std::memcpy(&header.record_bytes, raw + 16, 4);
  uint8_t expected[kHeaderBytes];
  EncodeHeader(header, expected);
  if (std::memcmp(raw, kDatasetMagic, 8) != 0) {
    return Status::Corruption(options.path + " is not a dataset file (bad magic)");
  }
  if (std::memcmp(raw, expected, kHeaderBytes) != 0) {
    return Status::Corruption(options.path + ": dataset header checksum mismatch");
  }
  if (header.record_bytes == 0 || header.record_bytes > kMaxRecordBytes ||
      header.num_records > (size - kHeaderBytes) / header.record_bytes) {
    return Status::Corruption(options.path + ": header promises " +
                              std::to_string(header.num_records) + " records of " +
                              std::to_string(header.record_bytes) + " bytes, the file holds " +
                              std::to_string(size) + " bytes");
  }
  if (options.shuffle_buffer > (1u << 24) || options.prefetch > (1u << 20)) {
    return Status::InvalidArgument("shuffle_buffer or prefetch is unreasonably large");
  }
  return std::unique_ptr<RecordDatasetIterator>(new RecordDatasetIterator(
      std::make_unique<Impl>(options, std::move(fs), std::move(file), header)));
}

RecordDatasetIterator::RecordDatasetIterator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RecordDatasetIterator::~RecordDatasetIterator() = default;

Status RecordDatasetIterator::next(std::vector<uint8_t>* record) { return impl_->Next(record); }

Status RecordDatasetIterator::next_batch(size_t count, std::vector<uint8_t>* batch) {
  batch->clear();
  std::vector<uint8_t> record;
  for (size_t i = 0; i < count; ++i) {
    Status status = impl_->Next(&record);
    if (status.code() == StatusCode::kOutOfRange && !batch->empty()) break;
    RETURN_IF_ERROR(status);
    batch->insert(batch->end(), record.begin(), record.end());
  }
  return Status::OK();
}

uint32_t RecordDatasetIterator::record_bytes() const { return impl_->header().record_bytes; }
uint64_t RecordDatasetIterator::num_records() const { return impl_->header().num_records; }
int64_t RecordDatasetIterator::records_emitted() const { return impl_->emitted(); }
Status RecordDatasetIterator::save(IteratorState* state) { return impl_->Save(state); }
Status RecordDatasetIterator::restore(const IteratorState& state) { return impl_->Restore(state); }

uint64_t RecordDatasetIterator::max_state_bytes() const {
  const auto& options = impl_->options();
  return (options.shuffle_buffer + options.prefetch + 1) * uint64_t{impl_->header().record_bytes} +
         4096;
}

}  // namespace asyncckpt
