// The CUDA device. Every test that needs a GPU skips when none is visible; the rest check that
// a build or a machine without CUDA fails cleanly, with a status.

#include "device/cuda_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/device.h"
#include "asyncckpt/reader.h"
#include "asyncckpt/saver_hook.h"
#include "asyncckpt/session.h"
#include "asyncckpt/state.h"
#include "asyncckpt/tensor.h"

// The GPU tests call the CUDA runtime themselves (cudaMalloc, streams). The test target gets
// ASYNCCKPT_WITH_CUDA when the library has the CUDA device, and the runtime's headers when it
// links CUDA::cudart itself; a target that has the first but not the second fails the GPU
// tests on a GPU machine instead of passing them silently.
#if defined(ASYNCCKPT_WITH_CUDA) && __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define ASYNCCKPT_TEST_HAS_CUDA_RUNTIME 1
#endif

namespace asyncckpt {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

TEST(CudaDeviceAvailabilityTest, WithoutGpuNewCudaDeviceIsUnavailable) {
  if (CudaAvailable()) GTEST_SKIP() << "a GPU is visible";
  for (int ordinal : {0, 1, -1}) {
    Result<std::shared_ptr<Device>> device = NewCudaDevice(ordinal);
    ASSERT_FALSE(device.ok()) << "cuda:" << ordinal;
    EXPECT_EQ(device.status().code(), StatusCode::kUnavailable) << device.status().ToString();
    EXPECT_NE(Lower(device.status().message()).find("cuda"), std::string::npos)
        << device.status().message();
  }
}

TEST(CudaDeviceAvailabilityTest, CudaAvailableAgreesWithNewCudaDevice) {
  EXPECT_EQ(CudaAvailable(), NewCudaDevice(0).ok());
#ifndef ASYNCCKPT_WITH_CUDA
  EXPECT_FALSE(CudaAvailable()) << "a build without the CUDA device cannot see a GPU";
#endif
}

#ifdef ASYNCCKPT_TEST_HAS_CUDA_RUNTIME

#define ASSERT_CUDA_OK(expr)                                                                     \
  do {                                                                                           \
    const cudaError_t cuda_err_ = (expr);                                                        \
    ASSERT_EQ(cuda_err_, cudaSuccess)                                                            \
        << #expr << ": " << cudaGetErrorName(cuda_err_) << " " << cudaGetErrorString(cuda_err_); \
  } while (0)

// cudaMalloc'd memory, freed by the destructor.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes) : bytes_(bytes) { error_ = cudaMalloc(&data_, bytes); }
  ~DeviceMemory() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  uint8_t* get() const { return static_cast<uint8_t*>(data_); }
  size_t bytes() const { return bytes_; }
  cudaError_t error() const { return error_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
  cudaError_t error_;
};

// A non-blocking stream standing in for a training framework's compute stream.
class ComputeStream {
 public:
  ComputeStream() { error_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~ComputeStream() {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  ComputeStream(const ComputeStream&) = delete;
  ComputeStream& operator=(const ComputeStream&) = delete;

  cudaStream_t get() const { return stream_; }
  cudaError_t error() const { return error_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaError_t error_;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// Index of the first byte that is not `value`, or n.
size_t FirstNotEqual(const uint8_t* bytes, size_t n, uint8_t value) {
  return static_cast<size_t>(
      std::find_if(bytes, bytes + n, [value](uint8_t b) { return b != value; }) - bytes);
}

#endif  // ASYNCCKPT_TEST_HAS_CUDA_RUNTIME

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaAvailable()) GTEST_SKIP() << "no CUDA GPU is visible";
#ifndef ASYNCCKPT_TEST_HAS_CUDA_RUNTIME
    FAIL() << "a GPU is visible but this test was built without the CUDA runtime's headers: "
              "link the test target with CUDA::cudart";
#else
    Result<std::shared_ptr<Device>> device = NewCudaDevice(0);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = *device;
#endif
  }
  void TearDown() override {
    if (device_ == nullptr) return;
    EXPECT_TRUE(SetCudaComputeStream(*device_, nullptr).ok());
#ifdef ASYNCCKPT_TEST_HAS_CUDA_RUNTIME
    cudaSetDevice(0);  // whatever a failed test left current
#endif
  }

  std::shared_ptr<Device> device_;
};

TEST_F(CudaDeviceTest, OpensTheFirstGpu) {
  EXPECT_EQ(device_->kind(), DeviceKind::kCuda);
  EXPECT_EQ(device_->name(), "cuda:0");
}

#ifdef ASYNCCKPT_TEST_HAS_CUDA_RUNTIME

TEST_F(CudaDeviceTest, OrdinalOutOfRangeIsInvalidArgument) {
  int count = 0;
  ASSERT_CUDA_OK(cudaGetDeviceCount(&count));
  for (int ordinal : {count, -1}) {
    Result<std::shared_ptr<Device>> device = NewCudaDevice(ordinal);
    ASSERT_FALSE(device.ok());
    EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument) << device.status().ToString();
  }
}

TEST_F(CudaDeviceTest, PinnedMemoryIsPageAlignedAndCoversWholePages) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{5000}, size_t{3} << 20}) {
    SCOPED_TRACE("bytes " + std::to_string(bytes));
    Result<PinnedBuffer> buffer = device_->allocate_pinned(bytes);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % 4096, 0u);
    EXPECT_EQ(buffer->size(), bytes);
    const size_t whole_pages = std::max<size_t>(1, (bytes + 4095) / 4096) * 4096;
    std::memset(buffer->data(), 0x3C, whole_pages);
    // Pinned: the runtime knows it as host memory it allocated.
    cudaPointerAttributes attributes{};
    ASSERT_CUDA_OK(cudaPointerGetAttributes(&attributes, buffer->data()));
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  }
}

TEST_F(CudaDeviceTest, CopyToHostAsyncCopiesDeviceMemory) {
  const std::vector<uint8_t> pattern = RandomBytes((8u << 20) + 13, 1);
  DeviceMemory memory(pattern.size());
  ASSERT_CUDA_OK(memory.error());
  ASSERT_CUDA_OK(cudaMemcpy(memory.get(), pattern.data(), pattern.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  Result<PinnedBuffer> pinned = device_->allocate_pinned(pattern.size());
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();

  auto fence = device_->copy_to_host_async(memory.get(), pinned->data(), pattern.size());
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  Status waited = (*fence)->wait();
  ASSERT_TRUE(waited.ok()) << waited.ToString();
  EXPECT_TRUE((*fence)->ready());
  EXPECT_TRUE((*fence)->wait().ok());  // waiting twice is allowed
  EXPECT_EQ(std::memcmp(pinned->data(), pattern.data(), pattern.size()), 0);

  std::vector<uint8_t> pageable(pattern.size(), 0);  // the synchronous form, into pageable memory
  ASSERT_TRUE(device_->copy_to_host(memory.get(), pageable.data(), pageable.size()).ok());
  EXPECT_EQ(pageable, pattern);
}

TEST_F(CudaDeviceTest, CopyFromHostWritesDeviceMemory) {
  const std::vector<uint8_t> pattern = RandomBytes((4u << 20) + 7, 2);
  DeviceMemory memory(pattern.size());
  ASSERT_CUDA_OK(memory.error());
  Result<PinnedBuffer> pinned = device_->allocate_pinned(pattern.size());
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  std::memcpy(pinned->data(), pattern.data(), pattern.size());

  std::vector<uint8_t> back(pattern.size());
  ASSERT_TRUE(device_->copy_from_host(pinned->data(), memory.get(), pattern.size()).ok());
  ASSERT_CUDA_OK(cudaMemcpy(back.data(), memory.get(), back.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, pattern);

  // From pageable memory too (the reader restores through pinned memory, users may not).
  std::vector<uint8_t> reversed(pattern.rbegin(), pattern.rend());
  ASSERT_TRUE(device_->copy_from_host(reversed.data(), memory.get(), reversed.size()).ok());
  ASSERT_CUDA_OK(cudaMemcpy(back.data(), memory.get(), back.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, reversed);
}

TEST_F(CudaDeviceTest, ConcurrentCopiesFromManyThreadsAreAllCorrect) {
  // The engine copies a snapshot's chunks from a thread pool.
  constexpr size_t kSlice = 1u << 20;
  constexpr int kThreads = 8;
  const std::vector<uint8_t> pattern = RandomBytes(kSlice * kThreads, 3);
  DeviceMemory memory(pattern.size());
  ASSERT_CUDA_OK(memory.error());
  ASSERT_CUDA_OK(cudaMemcpy(memory.get(), pattern.data(), pattern.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  Result<PinnedBuffer> pinned = device_->allocate_pinned(pattern.size());
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const size_t offset = t * kSlice;
      auto fence = device_->copy_to_host_async(
          memory.get() + offset, static_cast<uint8_t*>(pinned->data()) + offset, kSlice);
      results[t] = fence.ok() ? (*fence)->wait() : fence.status();
    });
  }
  for (auto& thread : threads) thread.join();
  for (const Status& status : results) EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(std::memcmp(pinned->data(), pattern.data(), pattern.size()), 0);
}

TEST_F(CudaDeviceTest, CopiesWaitForWorkOnTheLegacyDefaultStream) {
  // Without a compute stream, a job computing on stream 0 must still get a whole step: the copy
  // stream is a blocking stream, ordered after stream 0's work.
  constexpr size_t kBytes = 128u << 20;
  DeviceMemory memory(kBytes);
  ASSERT_CUDA_OK(memory.error());
  Result<PinnedBuffer> pinned = device_->allocate_pinned(kBytes);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  for (int value = 1; value <= 8; ++value) {
    ASSERT_CUDA_OK(cudaMemsetAsync(memory.get(), value, kBytes, /*stream=*/0));
  }
  auto fence = device_->copy_to_host_async(memory.get(), pinned->data(), kBytes);
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  ASSERT_TRUE((*fence)->wait().ok());
  EXPECT_EQ(FirstNotEqual(static_cast<uint8_t*>(pinned->data()), kBytes, 8), kBytes);
}

TEST_F(CudaDeviceTest, StreamOrderedCopySeesQueuedComputeAndComputeWaitsForTheCopy) {
  constexpr size_t kBytes = 256u << 20;  // long enough that an unordered copy would race
  DeviceMemory memory(kBytes);
  ASSERT_CUDA_OK(memory.error());
  ComputeStream compute;
  ASSERT_CUDA_OK(compute.error());
  Result<PinnedBuffer> pinned = device_->allocate_pinned(kBytes);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  ASSERT_CUDA_OK(cudaMemset(memory.get(), 0, kBytes));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(SetCudaComputeStream(*device_, compute.get()).ok());

  // The "step": queued, not finished, when the snapshot copy is started. The copy must see its
  // last write (0x10, 0x2B, ... 0x97).
  uint8_t step_value = 0;
  for (int value = 0x10; value <= 0xAB; value += 0x1B) {
    ASSERT_CUDA_OK(cudaMemsetAsync(memory.get(), value, kBytes, compute.get()));
    step_value = static_cast<uint8_t>(value);
  }
  ASSERT_EQ(step_value, 0x97);
  auto fence = device_->copy_to_host_async(memory.get(), pinned->data(), kBytes);
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  Status ordered = WaitForCopiesOnComputeStream(*device_);
  ASSERT_TRUE(ordered.ok()) << ordered.ToString();
  // The next "step" overwrites the state; it must wait for the copy on the GPU.
  ASSERT_CUDA_OK(cudaMemsetAsync(memory.get(), 0xCD, kBytes, compute.get()));

  ASSERT_TRUE((*fence)->wait().ok());
  EXPECT_EQ(FirstNotEqual(static_cast<uint8_t*>(pinned->data()), kBytes, step_value), kBytes);
  ASSERT_CUDA_OK(cudaStreamSynchronize(compute.get()));
  std::vector<uint8_t> tail(4096);
  ASSERT_CUDA_OK(cudaMemcpy(tail.data(), memory.get() + kBytes - tail.size(), tail.size(),
                            cudaMemcpyDeviceToHost));
  EXPECT_EQ(FirstNotEqual(tail.data(), tail.size(), 0xCD), tail.size());

  ASSERT_TRUE(SetCudaComputeStream(*device_, nullptr).ok());
  EXPECT_EQ(WaitForCopiesOnComputeStream(*device_).code(), StatusCode::kFailedPrecondition);
}

TEST_F(CudaDeviceTest, StreamOrderedBatchIsTakenAfterEveryQueuedWrite) {
  // Two regions, one enqueue: each must hold the compute stream's last queued write, which
  // cannot have finished when the batch is enqueued (64 passes over 512 MiB). A copy taken
  // before the queued work would find the zeros or an earlier pass.
  constexpr size_t kBytes = 256u << 20;
  DeviceMemory first(kBytes);
  DeviceMemory second(kBytes);
  ASSERT_CUDA_OK(first.error());
  ASSERT_CUDA_OK(second.error());
  ComputeStream compute;
  ASSERT_CUDA_OK(compute.error());
  Result<PinnedBuffer> pinned = device_->allocate_pinned(2 * kBytes);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  auto* host = static_cast<uint8_t*>(pinned->data());
  std::memset(host, 0xEE, 2 * kBytes);
  ASSERT_CUDA_OK(cudaMemset(first.get(), 0, kBytes));
  ASSERT_CUDA_OK(cudaMemset(second.get(), 0, kBytes));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(SetCudaComputeStream(*device_, compute.get()).ok());
  for (int pass = 1; pass <= 64; ++pass) {
    ASSERT_CUDA_OK(cudaMemsetAsync(first.get(), pass, kBytes, compute.get()));
    ASSERT_CUDA_OK(cudaMemsetAsync(second.get(), pass + 100, kBytes, compute.get()));
  }
  auto fence = device_->copy_regions_to_host_async(
      {CopyRegion{first.get(), host, kBytes}, CopyRegion{second.get(), host + kBytes, kBytes}});
  ASSERT_TRUE(fence.ok()) << fence.status().ToString();
  ASSERT_TRUE((*fence)->wait().ok());
  EXPECT_EQ(FirstNotEqual(host, kBytes, 64), kBytes);
  EXPECT_EQ(FirstNotEqual(host + kBytes, kBytes, 164), kBytes);
  ASSERT_CUDA_OK(cudaStreamSynchronize(compute.get()));
}

TEST_F(CudaDeviceTest, ParallelPinnedBufferCopiesAcrossItsPieces) {
  // A region that spans several registered pieces is split at their edges and still lands whole.
  auto* cuda = dynamic_cast<CudaDeviceImpl*>(device_.get());
  ASSERT_NE(cuda, nullptr);
  constexpr size_t kBytes = 600u << 20;  // three pieces of at least 256 MiB
  Result<PinnedBuffer> pinned =
      cuda->allocate_pinned_with(kBytes, CudaDeviceImpl::PinnedAllocation::kParallelRegister);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  DeviceMemory memory(kBytes);
  ASSERT_CUDA_OK(memory.error());
  ASSERT_CUDA_OK(cudaMemset(memory.get(), 0x5A, kBytes));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_TRUE(device_->copy_to_host(memory.get(), pinned->data(), kBytes).ok());
  EXPECT_EQ(FirstNotEqual(static_cast<uint8_t*>(pinned->data()), kBytes, 0x5A), kBytes);
}

TEST_F(CudaDeviceTest, LeavesTheCallersCurrentDeviceAlone) {
  int count = 0;
  ASSERT_CUDA_OK(cudaGetDeviceCount(&count));
  // With two GPUs, a thread that works on cuda:1 saves state of cuda:0.
  const int current = count >= 2 ? 1 : 0;
  ASSERT_CUDA_OK(cudaSetDevice(0));
  DeviceMemory on_zero(1 << 20);
  ASSERT_CUDA_OK(on_zero.error());
  ASSERT_CUDA_OK(cudaSetDevice(current));
  Result<PinnedBuffer> pinned = device_->allocate_pinned(1 << 20);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  ASSERT_TRUE(device_->copy_to_host(on_zero.get(), pinned->data(), 1 << 20).ok());
  ASSERT_TRUE(device_->copy_from_host(pinned->data(), on_zero.get(), 1 << 20).ok());
  int after = -1;
  ASSERT_CUDA_OK(cudaGetDevice(&after));
  EXPECT_EQ(after, current);
  ASSERT_CUDA_OK(cudaSetDevice(0));  // on_zero is freed on its own device
}

TEST_F(CudaDeviceTest, StreamOrderedSaveOfSeveralPiecesRestoresBitForBitIntoDeviceMemory) {
  // 300 MiB: the restore streams it through its bounce buffers in three pieces, each piece's copy
  // to the GPU overlapping the next one's reads; the save enqueues it as one region.
  constexpr size_t kBytes = 300u << 20;
  DeviceMemory memory(kBytes);
  ASSERT_CUDA_OK(memory.error());
  const std::vector<uint8_t> pattern = RandomBytes(kBytes, 5);
  ASSERT_CUDA_OK(cudaMemcpy(memory.get(), pattern.data(), kBytes, cudaMemcpyHostToDevice));
  ComputeStream compute;
  ASSERT_CUDA_OK(compute.error());
  ASSERT_TRUE(SetCudaComputeStream(*device_, compute.get()).ok());
  char dir[] = "/tmp/cuda_pieces_test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  TensorRegistry registry;
  ASSERT_TRUE(registry
                  .add({"big",
                        DType::kU8,
                        {static_cast<int64_t>(kBytes)},
                        memory.get(),
                        kBytes,
                        device_,
                        {},
                        {}})
                  .ok());
  SaverOptions options;
  options.checkpoint_dir = dir;
  options.save_steps = 1;
  options.cuda_stream_ordered = true;
  options.cuda_defer_compute_wait = true;
  auto checkpointer = Checkpointer::Create(options);
  ASSERT_TRUE(checkpointer.ok()) << checkpointer.status().ToString();
  ASSERT_TRUE((*checkpointer)->save(1, registry).ok());
  ASSERT_TRUE(WaitForCopiesOnComputeStream(*device_).ok());  // before the "update" below
  ASSERT_CUDA_OK(cudaMemsetAsync(memory.get(), 0, kBytes, compute.get()));
  ASSERT_TRUE((*checkpointer)->close().ok());
  ASSERT_CUDA_OK(cudaStreamSynchronize(compute.get()));
  auto reader = CheckpointReader::Open(std::string(dir) + "/model.ckpt-1");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Status restored = (*reader)->restore(registry);
  ASSERT_TRUE(restored.ok()) << restored.ToString();
  std::vector<uint8_t> back(kBytes);
  ASSERT_CUDA_OK(cudaMemcpy(back.data(), memory.get(), kBytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(back == pattern) << "the restore differs from the state saved";
  std::filesystem::remove_all(dir);
}

// Saving GPU state through both hooks, with and without stream-ordered mode, and restoring it
// into device memory.
struct SaverCase {
  const char* name;
  bool async;
  bool stream_ordered;
};

// Names the case in test listings (the default prints the struct's bytes, which change per build).
void PrintTo(const SaverCase& saver, std::ostream* os) { *os << saver.name; }

class CudaCheckpointTest : public CudaDeviceTest, public ::testing::WithParamInterface<SaverCase> {
 protected:
  static constexpr int kSteps = 5;
  static constexpr int64_t kRows = 1000;
  static constexpr int64_t kCols = 2500;
  static constexpr size_t kWeightBytes = kRows * kCols * sizeof(float);
  static constexpr size_t kBiasBytes = 1001 * 2;  // bf16

  void SetUp() override {
    CudaDeviceTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    char pattern[] = "/tmp/cuda_device_test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    // Step s's state is this pattern shifted by s * 4 bytes, so every checkpoint's content
    // names the step it came from.
    source_host_ = RandomBytes(kWeightBytes + kBiasBytes + 4 * (kSteps + 1), 11);
    source_ = std::make_unique<DeviceMemory>(source_host_.size());
    weights_ = std::make_unique<DeviceMemory>(kWeightBytes);
    bias_ = std::make_unique<DeviceMemory>(kBiasBytes);
    for (const DeviceMemory* m : {source_.get(), weights_.get(), bias_.get()}) {
      ASSERT_CUDA_OK(m->error());
    }
    ASSERT_CUDA_OK(cudaMemcpy(source_->get(), source_host_.data(), source_host_.size(),
                              cudaMemcpyHostToDevice));
    compute_ = std::make_unique<ComputeStream>();
    ASSERT_CUDA_OK(compute_->error());
    ASSERT_NO_FATAL_FAILURE(EnqueueStep(0));
    ASSERT_CUDA_OK(cudaStreamSynchronize(compute_->get()));
    ASSERT_TRUE(registry_
                    .add({"layer/weights",
                          DType::kF32,
                          {kRows, kCols},
                          weights_->get(),
                          kWeightBytes,
                          device_,
                          {},
                          {}})
                    .ok());
    ASSERT_TRUE(
        registry_
            .add({"layer/bias", DType::kBF16, {1001}, bias_->get(), kBiasBytes, device_, {}, {}})
            .ok());
  }
  void TearDown() override {
    CudaDeviceTest::TearDown();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // The state of step `step`, written on the compute stream as a training step would.
  void EnqueueStep(int64_t step) {
    const uint8_t* from = source_->get() + 4 * step;
    ASSERT_CUDA_OK(cudaMemcpyAsync(weights_->get(), from, kWeightBytes, cudaMemcpyDeviceToDevice,
                                   compute_->get()));
    ASSERT_CUDA_OK(cudaMemcpyAsync(bias_->get(), from + kWeightBytes, kBiasBytes,
                                   cudaMemcpyDeviceToDevice, compute_->get()));
  }
  std::vector<uint8_t> ExpectedWeights(int64_t step) const {
    return {source_host_.begin() + 4 * step, source_host_.begin() + 4 * step + kWeightBytes};
  }
  std::vector<uint8_t> ExpectedBias(int64_t step) const {
    auto begin = source_host_.begin() + 4 * step + kWeightBytes;
    return {begin, begin + kBiasBytes};
  }

  SaverOptions Options() const {
    SaverOptions options;
    options.checkpoint_dir = dir_;
    options.save_steps = 2;
    options.max_to_keep = 0;
    options.chunk_bytes = 1u << 20;  // ten chunks for the weights
    options.cuda_stream_ordered = GetParam().async && GetParam().stream_ordered;
    return options;
  }

  Result<std::unique_ptr<SessionRunHook>> MakeHook() {
    if (GetParam().async) {
      auto hook = AsyncCheckpointSaverHook::Create(Options(), &registry_);
      if (!hook.ok()) return hook.status();
      return std::unique_ptr<SessionRunHook>(std::move(hook).value());
    }
    auto hook = CheckpointSaverHook::Create(Options(), &registry_);
    if (!hook.ok()) return hook.status();
    return std::unique_ptr<SessionRunHook>(std::move(hook).value());
  }

  std::string dir_;
  std::vector<uint8_t> source_host_;
  std::unique_ptr<DeviceMemory> source_;
  std::unique_ptr<DeviceMemory> weights_;
  std::unique_ptr<DeviceMemory> bias_;
  std::unique_ptr<ComputeStream> compute_;
  TensorRegistry registry_;
};

TEST_P(CudaCheckpointTest, SavesEveryStepsStateAndRestoresIntoDeviceMemoryBitForBit) {
  const bool stream_ordered = GetParam().stream_ordered;
  if (stream_ordered) {
    ASSERT_TRUE(SetCudaComputeStream(*device_, compute_->get()).ok());
  }
  auto hook = MakeHook();
  ASSERT_TRUE(hook.ok()) << hook.status().ToString();
  auto session = SingularMonitoredSession::Create({hook->get()});
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  for (int i = 0; i < kSteps; ++i) {
    Status status = (*session)->run([&](StepContext& ctx) {
      EnqueueStep(ctx.step());
      if (HasFatalFailure())
        return Status::Internal("enqueueing step " + std::to_string(ctx.step()));
      // Without stream-ordered mode the job finishes its GPU work before the hooks run.
      if (!stream_ordered && cudaStreamSynchronize(compute_->get()) != cudaSuccess) {
        return Status::Internal("cudaStreamSynchronize");
      }
      return Status::OK();
    });
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
  Status closed = (*session)->close();
  ASSERT_TRUE(closed.ok()) << closed.ToString();
  ASSERT_CUDA_OK(cudaStreamSynchronize(compute_->get()));

  // At the start, every second step, and the last step.
  auto state = GetCheckpointState(dir_);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  const std::vector<std::string> expected_names = {"model.ckpt-0", "model.ckpt-2", "model.ckpt-4",
                                                   "model.ckpt-5"};
  EXPECT_EQ(state->all_model_checkpoint_paths, expected_names);
  for (const std::string& name : state->all_model_checkpoint_paths) {
    SCOPED_TRACE(name);
    auto reader = CheckpointReader::Open(dir_ + "/" + name);
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    const int64_t step = (*reader)->metadata().step;
    std::vector<uint8_t> weights(kWeightBytes);
    ASSERT_TRUE((*reader)->read("layer/weights", weights.data(), weights.size()).ok());
    EXPECT_TRUE(weights == ExpectedWeights(step)) << "weights of step " << step;
    std::vector<uint8_t> bias(kBiasBytes);
    ASSERT_TRUE((*reader)->read("layer/bias", bias.data(), bias.size()).ok());
    EXPECT_TRUE(bias == ExpectedBias(step)) << "bias of step " << step;
  }

  // Restore the latest into device memory that was wiped.
  ASSERT_CUDA_OK(cudaMemset(weights_->get(), 0, kWeightBytes));
  ASSERT_CUDA_OK(cudaMemset(bias_->get(), 0, kBiasBytes));
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  auto latest = CheckpointReader::OpenLatest(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  Status restored = (*latest)->restore(registry_);
  ASSERT_TRUE(restored.ok()) << restored.ToString();
  std::vector<uint8_t> weights(kWeightBytes);
  std::vector<uint8_t> bias(kBiasBytes);
  ASSERT_CUDA_OK(cudaMemcpy(weights.data(), weights_->get(), kWeightBytes, cudaMemcpyDeviceToHost));
  ASSERT_CUDA_OK(cudaMemcpy(bias.data(), bias_->get(), kBiasBytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(weights == ExpectedWeights(kSteps));
  EXPECT_TRUE(bias == ExpectedBias(kSteps));
}

INSTANTIATE_TEST_SUITE_P(Savers, CudaCheckpointTest,
                         ::testing::Values(SaverCase{"Sync", false, false},
                                           SaverCase{"SyncWithComputeStream", false, true},
                                           SaverCase{"Async", true, false},
                                           SaverCase{"AsyncStreamOrdered", true, true}),
                         [](const auto& info) { return std::string(info.param.name); });

#endif  // ASYNCCKPT_TEST_HAS_CUDA_RUNTIME

}  // namespace
}  // namespace asyncckpt
