// gpu_bench: asyncckpt with its state in GPU memory, beside the device's own limits, for
// scripts/gpu-check. A training loop on a compute stream (a read phase standing for forward and
// backward, then an update phase that writes every tensor) saves every few steps through
// Checkpointer in each mode: synchronous, asynchronous raw, stream-ordered (the wait placed right
// before the update) and asynchronous shuffle+zstd. It reports, per mode, the blocked time of the
// first and later saves, the start-up cost, the loop time a save costs against the device-to-
// host copy of the state, the time to durable, and the restore into GPU memory (bit-exact by a
// checksum kernel); and the limits: D2H and H2D copies of the state, and pinned allocation of it
// by one cudaHostAlloc and in parallel pieces.
//
//   gpu_bench --dir DIR [--gib 8] [--tensors 16] [--saves 3] [--steps_between 3]
//             [--read_passes 4] [--modes sync,async,stream_ordered,shuffle_zstd] [--json FILE]

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "asyncckpt/checkpointer.h"
#include "asyncckpt/device.h"
#include "asyncckpt/reader.h"
#include "device/cuda_device.h"
#include "src/cli/gpu_kernels.h"

namespace asyncckpt::gpu {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "gpu_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(err));
}

void Check(const Status& status, const char* what) {
  if (!status.ok()) Die(std::string(what) + ": " + status.ToString());
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Args {
  double gib = 8;
  int tensors = 16;
  int saves = 3;
  int steps_between = 3;
  int read_passes = 4;
  std::string dir;
  std::string modes = "sync,async,stream_ordered,shuffle_zstd";
  std::string json;
};

Args Parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--gib")
      args.gib = std::stod(value);
    else if (flag == "--tensors")
      args.tensors = std::stoi(value);
    else if (flag == "--saves")
      args.saves = std::stoi(value);
    else if (flag == "--steps_between")
      args.steps_between = std::stoi(value);
    else if (flag == "--read_passes")
      args.read_passes = std::stoi(value);
    else if (flag == "--dir")
      args.dir = value;
    else if (flag == "--modes")
      args.modes = value;
    else if (flag == "--json")
      args.json = value;
    else
      Die("unknown flag " + flag);
  }
  if (args.dir.empty()) Die("--dir is required");
  if (args.saves < 2) Die("--saves must be at least 2 (a first and a steady save)");
  return args;
}

// The training state: `tensors` float buffers in GPU memory, and the compute stream.
class GpuState {
 public:
  GpuState(std::shared_ptr<Device> device, size_t bytes, int tensors) : device_(std::move(device)) {
    elements_ = bytes / sizeof(float) / static_cast<size_t>(tensors) / 1024 * 1024;
    Check(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "compute stream");
    Check(cudaMalloc(&scratch_, 64), "scratch");
    for (int t = 0; t < tensors; ++t) {
      float* data = nullptr;
      Check(cudaMalloc(reinterpret_cast<void**>(&data), elements_ * sizeof(float)),
            "cudaMalloc of the state");
      Check(LaunchFill(data, elements_, static_cast<uint32_t>(t), compute_), "fill");
      data_.push_back(data);
      TensorRef ref;
      ref.name = "layer" + std::to_string(100 + t) + "/w";
      ref.dtype = DType::kF32;
      ref.shape = {static_cast<int64_t>(elements_)};
      ref.data = data;
      ref.bytes = elements_ * sizeof(float);
      ref.device = device_;
      Check(registry_.add(std::move(ref)), "registry");
    }
    Sync();
  }
  ~GpuState() {
    cudaStreamSynchronize(compute_);
    for (float* data : data_) cudaFree(data);
    cudaFree(scratch_);
    cudaStreamDestroy(compute_);
  }

  void Read(int passes) {
    for (float* data : data_) {
      Check(LaunchRead(data, elements_, passes, reinterpret_cast<float*>(scratch_), compute_),
            "read");
    }
  }
  void Update(uint32_t step) {
    for (float* data : data_) Check(LaunchUpdate(data, elements_, step, compute_), "update");
  }
  void Sync() { Check(cudaStreamSynchronize(compute_), "step sync"); }
  void Zero() {
    for (float* data : data_) Check(cudaMemsetAsync(data, 0, elements_ * 4, compute_), "zero");
    Sync();
  }
  unsigned long long Checksum() {
    auto* sum = reinterpret_cast<unsigned long long*>(static_cast<char*>(scratch_) + 32);
    Check(cudaMemsetAsync(sum, 0, 8, compute_), "checksum reset");
    for (float* data : data_) Check(LaunchChecksum(data, elements_, sum, compute_), "checksum");
    unsigned long long host = 0;
    Check(cudaMemcpyAsync(&host, sum, 8, cudaMemcpyDeviceToHost, compute_), "checksum copy");
    Sync();
    return host;
  }
  const TensorRegistry& registry() const { return registry_; }
  uint64_t bytes() const { return registry_.total_bytes(); }
  cudaStream_t compute() const { return compute_; }
  const std::vector<float*>& data() const { return data_; }
  size_t elements() const { return elements_; }

 private:
  std::shared_ptr<Device> device_;
  size_t elements_ = 0;
  cudaStream_t compute_ = nullptr;
  void* scratch_ = nullptr;
  std::vector<float*> data_;
  TensorRegistry registry_;
};

// A flat JSON object, written by hand: numbers and strings only, one level of nesting.
class Json {
 public:
  void Num(const std::string& key, double value) {
    Key(key);
    out_ << value;
  }
  void Str(const std::string& key, const std::string& value) {
    Key(key);
    out_ << '"' << value << '"';
  }
  void Open(const std::string& key) {
    Key(key);
    out_ << '{';
    first_ = true;
  }
  void Close() {
    out_ << '}';
    first_ = false;
  }
  std::string Text() const { return "{" + out_.str() + "}\n"; }

 private:
  void Key(const std::string& key) {
    if (!first_) out_ << ',';
    first_ = false;
    out_ << '"' << key << "\":";
  }
  std::ostringstream out_;
  bool first_ = true;
};

// The device's limits for the state: D2H and H2D copies into pinned memory, and pinning it.
double MeasureLimits(GpuState& state, CudaDeviceImpl& cuda, Json& json) {
  const uint64_t bytes = state.bytes();
  auto started = Clock::now();
  Result<PinnedBuffer> pinned =
      cuda.allocate_pinned_with(bytes, CudaDeviceImpl::PinnedAllocation::kHostAlloc);
  Check(pinned.status(), "cudaHostAlloc");
  const double host_alloc = Since(started);
  pinned->reset();
  started = Clock::now();
  pinned = cuda.allocate_pinned_with(bytes, CudaDeviceImpl::PinnedAllocation::kParallelRegister);
  Check(pinned.status(), "parallel pinning");
  const double parallel = Since(started);
  const size_t per = state.elements() * sizeof(float);
  auto copy = [&](cudaMemcpyKind kind) {
    double best = 1e9;
    for (int run = 0; run < 2; ++run) {
      const auto start = Clock::now();
      for (size_t t = 0; t < state.data().size(); ++t) {
        char* host = static_cast<char*>(pinned->data()) + t * per;
        void* dst = kind == cudaMemcpyDeviceToHost ? static_cast<void*>(host)
                                                   : static_cast<void*>(state.data()[t]);
        const void* src = kind == cudaMemcpyDeviceToHost ? static_cast<const void*>(state.data()[t])
                                                         : static_cast<const void*>(host);
        Check(cudaMemcpyAsync(dst, src, per, kind, state.compute()), "limit copy");
      }
      state.Sync();
      best = std::min(best, Since(start));
    }
    return best;
  };
  const double d2h = copy(cudaMemcpyDeviceToHost);
  const double h2d = copy(cudaMemcpyHostToDevice);
  json.Num("pinned_alloc_host_alloc_seconds", host_alloc);
  json.Num("pinned_alloc_parallel_seconds", parallel);
  json.Num("d2h_seconds", d2h);
  json.Num("d2h_gbps", bytes / d2h / 1e9);
  json.Num("h2d_seconds", h2d);
  json.Num("h2d_gbps", bytes / h2d / 1e9);
  std::printf(
      "limits: pinning %.2f GiB: cudaHostAlloc %.3f s, parallel %.3f s; D2H %.3f s "
      "(%.1f GB/s), H2D %.3f s (%.1f GB/s)\n",
      bytes / double(1 << 30), host_alloc, parallel, d2h, bytes / d2h / 1e9, h2d,
      bytes / h2d / 1e9);
  return d2h;
}

// Median time of a step without saves.
double BaselineStep(GpuState& state, const Args& args) {
  std::vector<double> steps;
  for (int s = 0; s < 2 * args.steps_between + 2; ++s) {
    const auto start = Clock::now();
    state.Read(args.read_passes);
    state.Update(static_cast<uint32_t>(1000 + s));
    state.Sync();
    steps.push_back(Since(start));
  }
  return Median(steps);
}

struct Mode {
  std::string name;
  SaveMode save_mode = SaveMode::kAsynchronous;
  CompressionKind compression = CompressionKind::kNone;
  bool stream_ordered = false;
  bool restore = false;
};

Mode ModeNamed(const std::string& name) {
  if (name == "sync") return {name, SaveMode::kSynchronous, CompressionKind::kNone, false, false};
  if (name == "async") return {name, SaveMode::kAsynchronous, CompressionKind::kNone, false, true};
  if (name == "stream_ordered") {
    return {name, SaveMode::kAsynchronous, CompressionKind::kNone, true, false};
  }
  if (name == "shuffle_zstd") {
    return {name, SaveMode::kAsynchronous, CompressionKind::kShuffleZstd, false, true};
  }
  Die("unknown mode " + name);
}

void RunMode(const Mode& mode, GpuState& state, Device& device, const Args& args,
             double baseline_step, double d2h, Json& json) {
  SaverOptions options;
  options.checkpoint_dir = args.dir + "/" + mode.name;
  std::filesystem::remove_all(options.checkpoint_dir);
  options.save_steps = 1;
  options.max_to_keep = 1;
  options.compression.kind = mode.compression;
  options.cuda_stream_ordered = mode.stream_ordered;
  options.cuda_defer_compute_wait = mode.stream_ordered;
  Check(SetCudaComputeStream(device, mode.stream_ordered ? state.compute() : nullptr),
        "compute stream");
  auto made = Checkpointer::Create(options, mode.save_mode);
  Check(made.status(), "Checkpointer::Create");
  std::unique_ptr<Checkpointer> checkpointer = std::move(made).value();
  Check(checkpointer->prepare(state.registry()), "prepare");
  double loop = 0;
  std::vector<double> walls;
  int64_t step = 0;
  unsigned long long saved_sum = 0;
  bool pending = false;
  for (int save = 0; save < args.saves; ++save) {
    for (int s = 0; s < args.steps_between; ++s) {
      const auto start = Clock::now();
      state.Read(args.read_passes);
      if (pending) Check(WaitForCopiesOnComputeStream(device), "wait before the update");
      pending = false;
      state.Update(static_cast<uint32_t>(++step));
      state.Sync();
      loop += Since(start);
    }
    Check(checkpointer->wait_until_finished(), "the previous save");  // outside the clock
    saved_sum = state.Checksum();
    const auto start = Clock::now();
    Check(checkpointer->save(step, state.registry()), "save");
    walls.push_back(Since(start));
    loop += walls.back();
    pending = mode.stream_ordered;
  }
  // One more step, so that the last save's copy overlaps a read phase as the others did.
  const auto start = Clock::now();
  state.Read(args.read_passes);
  if (pending) Check(WaitForCopiesOnComputeStream(device), "wait before the update");
  state.Update(static_cast<uint32_t>(step + 1));
  state.Sync();
  loop += Since(start);
  Check(checkpointer->wait_until_finished(), "wait");
  const SaverTotals totals = checkpointer->totals();
  Check(checkpointer->close(), "close");
  Check(SetCudaComputeStream(device, nullptr), "compute stream off");
  std::vector<double> blocked, durable;
  for (const SaveStats& stats : totals.saves) {
    blocked.push_back(stats.blocked_seconds);
    durable.push_back(stats.seconds_to_durable);
  }
  const double steady = Median(std::vector<double>(blocked.begin() + 1, blocked.end()));
  const int steps = args.saves * args.steps_between + 1;
  const double lost = (loop - baseline_step * steps) / args.saves;
  json.Open(mode.name);
  json.Num("blocked_first_seconds", blocked.front());
  json.Num("blocked_steady_median_seconds", steady);
  json.Num("first_over_steady", steady > 0 ? blocked.front() / steady : 0);
  json.Num("blocked_wall_steady_median_seconds",
           Median(std::vector<double>(walls.begin() + 1, walls.end())));
  json.Num("startup_seconds", totals.startup_seconds);
  json.Num("to_durable_median_seconds", Median(durable));
  json.Num("loop_lost_per_save_seconds", lost);
  json.Num("loop_lost_over_d2h", lost / d2h);
  std::printf(
      "%-15s blocked first %.4f s, steady %.4f s; start-up %.3f s; durable %.2f s; "
      "loop lost/save %.4f s (%.2f of D2H)",
      mode.name.c_str(), blocked.front(), steady, totals.startup_seconds, Median(durable), lost,
      lost / d2h);
  if (mode.restore) {
    state.Zero();
    auto reader =
        CheckpointReader::Open(options.checkpoint_dir + "/model.ckpt-" + std::to_string(step));
    Check(reader.status(), "open for restore");
    const auto restore_start = Clock::now();
    Check((*reader)->restore(state.registry()), "restore");
    const double seconds = Since(restore_start);
    const bool exact = state.Checksum() == saved_sum;
    json.Num("restore_seconds", seconds);
    json.Num("restore_gbps", state.bytes() / seconds / 1e9);
    json.Num("restore_bit_exact", exact ? 1 : 0);
    std::printf("; restore %.2f s (%.2f GB/s)%s", seconds, state.bytes() / seconds / 1e9,
                exact ? ", bit-exact" : ", NOT BIT-EXACT");
    if (!exact) Die("restore is not bit-exact");
  }
  std::printf("\n");
  json.Close();
  std::filesystem::remove_all(options.checkpoint_dir);  // the next mode's disk space
}

int Main(int argc, char** argv) {
  const Args args = Parse(argc, argv);
  Result<std::shared_ptr<Device>> device = NewCudaDevice(0);
  Check(device.status(), "gpu_bench needs a CUDA GPU");
  auto* cuda = dynamic_cast<CudaDeviceImpl*>(device->get());
  std::filesystem::create_directories(args.dir);
  GpuState state(*device, static_cast<size_t>(args.gib * (1ull << 30)), args.tensors);
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("gpu_bench: %s, %d tensors, %.2f GiB of fp32 state\n", prop.name, args.tensors,
              state.bytes() / double(1 << 30));
  Json json;
  json.Str("device", prop.name);
  json.Num("state_bytes", static_cast<double>(state.bytes()));
  json.Num("tensors", args.tensors);
  const double d2h = MeasureLimits(state, *cuda, json);
  const double baseline = BaselineStep(state, args);
  json.Num("baseline_step_seconds", baseline);
  std::printf("baseline step %.4f s (%d read passes + update)\n", baseline, args.read_passes);
  json.Open("modes");
  std::stringstream modes(args.modes);
  for (std::string name; std::getline(modes, name, ',');) {
    RunMode(ModeNamed(name), state, **device, args, baseline, d2h, json);
  }
  json.Close();
  if (!args.json.empty()) {
    std::ofstream(args.json) << json.Text();
  }
  return 0;
}

}  // namespace
}  // namespace asyncckpt::gpu

int main(int argc, char** argv) { return asyncckpt::gpu::Main(argc, argv); }
