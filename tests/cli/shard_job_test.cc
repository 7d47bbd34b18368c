// train-sim --shard's pieces without MPI: the dimension-0 split, a sharded SimModel whose global
// state does not depend on the number of ranks, and the collectives (global digest, rank 0's
// value, a fresh start agreed by every rank) over a coordinator whose ranks are threads.

#include "src/cli/shard_job.h"

#include <gtest/gtest.h>

#include <barrier>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "src/cli/sim_model.h"

namespace asyncckpt::cli {
namespace {

// The ranks of one job as threads of this process: every collective meets at a barrier.
class ThreadJob {
 public:
  explicit ThreadJob(int size) : size_(size), barrier_(size), slots_(size) {}

  class Rank final : public Coordinator {
   public:
    Rank(ThreadJob* job, int rank) : job_(job), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return job_->size_; }
    Status broadcast(std::vector<uint8_t>& bytes, int root) override {
      if (rank_ == root) job_->slots_[root] = bytes;
      job_->barrier_.arrive_and_wait();
      bytes = job_->slots_[root];
      job_->barrier_.arrive_and_wait();
      return Status::OK();
    }
    Result<std::vector<std::vector<uint8_t>>> all_gather(std::span<const uint8_t> bytes) override {
      job_->slots_[rank_].assign(bytes.begin(), bytes.end());
      job_->barrier_.arrive_and_wait();
      std::vector<std::vector<uint8_t>> all = job_->slots_;
      job_->barrier_.arrive_and_wait();
      return all;
    }

   private:
    ThreadJob* job_;
    int rank_;
  };

  // Runs `body(coordinator)` on one thread per rank and waits for all.
  void Run(const std::function<void(Coordinator&)>& body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([this, r, &body] {
        Rank rank(this, r);
        body(rank);
      });
    }
    for (auto& thread : threads) thread.join();
  }

 private:
  int size_;
  std::barrier<> barrier_;
  std::vector<std::vector<uint8_t>> slots_;
};

SimConfig SmallConfig(DType dtype) {
  SimConfig config;
  // 3 tensors x 3 slots x 1001 elements: no world size from 2 to 4 divides 1001 evenly but 1.
  config.num_tensors = 3;
  config.dtype = dtype;
  config.state_bytes = 9 * 1001 * DTypeSize(dtype);
  return config;
}

TEST(SplitDim0Test, UnevenSplitsTileTheExtentInRankOrder) {
  for (uint64_t extent : {1ull, 7ull, 1001ull, 4096ull}) {
    for (int world = 1; world <= 5; ++world) {
      if (extent < static_cast<uint64_t>(world)) continue;
      uint64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const DimRange range = SplitDim0(extent, r, world);
        EXPECT_EQ(range.begin, next) << extent << " over " << world;
        EXPECT_GE(range.size(), extent / world);
        EXPECT_LE(range.size(), extent / world + 1);
        next = range.end;
      }
      EXPECT_EQ(next, extent);
    }
  }
  EXPECT_EQ(SplitDim0(10, 0, 4).size(), 3u);  // 3 3 2 2
  EXPECT_EQ(SplitDim0(10, 3, 4).size(), 2u);
}

TEST(ShardedSimModelTest, RegistersSlicesWithGlobalShapeAndOffset) {
  SimConfig config = SmallConfig(DType::kF32);
  config.shard = true;
  config.rank = 1;
  config.world_size = 3;
  auto model = SimModel::Create(config);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (const TensorRef& tensor : (*model)->registry().tensors()) {
    EXPECT_EQ(tensor.global_shape, std::vector<int64_t>{1001});
    EXPECT_EQ(tensor.global_offset, std::vector<int64_t>{334});
    EXPECT_EQ(tensor.shape, std::vector<int64_t>{334});
  }
}

TEST(ShardedSimModelTest, FewerElementsThanRanksIsAnErrorNamingModelBytes) {
  SimConfig config = SmallConfig(DType::kF32);
  config.state_bytes = 9 * 3 * 4;  // 3 elements per tensor
  config.shard = true;
  config.world_size = 4;
  auto model = SimModel::Create(config);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("--model_bytes"), std::string::npos);
}

// The global state after K steps is the same for 1 to 4 ranks and equals the unsharded model's.
TEST(ShardedSimModelTest, GlobalDigestAfterStepsDoesNotDependOnWorldSize) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
    auto whole = SimModel::Create(SmallConfig(dtype));
    ASSERT_TRUE(whole.ok());
    for (int64_t step = 1; step <= 3; ++step) (*whole)->Step(step, 1234 + step);
    const uint64_t expected = (*whole)->Digest();
    for (int world = 1; world <= 4; ++world) {
      ThreadJob job(world);
      std::vector<uint64_t> digests(world);
      job.Run([&](Coordinator& coordinator) {
        SimConfig config = SmallConfig(dtype);
        config.shard = true;
        config.rank = coordinator.rank();
        config.world_size = world;
        auto model = SimModel::Create(config);
        ASSERT_TRUE(model.ok());
        for (int64_t step = 1; step <= 3; ++step) (*model)->Step(step, 1234 + step);
        auto digest = GlobalDigest(coordinator, (*model)->registry());
        ASSERT_TRUE(digest.ok()) << digest.status().ToString();
        digests[coordinator.rank()] = *digest;
      });
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(digests[r], expected) << DTypeName(dtype) << ", rank " << r << " of " << world;
      }
    }
  }
}

TEST(GlobalDigestTest, UnshardedTensorIsAClearError) {
  auto whole = SimModel::Create(SmallConfig(DType::kF32));
  ASSERT_TRUE(whole.ok());
  ThreadJob job(1);
  job.Run([&](Coordinator& coordinator) {
    auto digest = GlobalDigest(coordinator, (*whole)->registry());
    ASSERT_FALSE(digest.ok());
    EXPECT_NE(digest.status().message().find("layer_000/"), std::string::npos);
  });
}

TEST(CollectivesTest, RankZeroValueAndGatherValues) {
  ThreadJob job(3);
  job.Run([&](Coordinator& coordinator) {
    auto value = RankZeroValue(coordinator, 10.5 + coordinator.rank());
    ASSERT_TRUE(value.ok());
    EXPECT_EQ(*value, 10.5);
    auto values = GatherValues(coordinator, 100 + static_cast<uint64_t>(coordinator.rank()));
    ASSERT_TRUE(values.ok());
    EXPECT_EQ(*values, (std::vector<uint64_t>{100, 101, 102}));
  });
}

TEST(ShardedSessionCreatorTest, EmptyDirectoryStartsAfreshOnEveryRank) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "shard_job_test_empty").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ThreadJob job(3);
  std::vector<int> inits(3, 0);
  job.Run([&](Coordinator& coordinator) {
    TensorRegistry registry;
    ShardedSessionCreatorOptions options;
    options.checkpoint_dir = dir;
    options.input_basename = "input_worker_" + std::to_string(coordinator.rank()) + ".ckpt";
    options.init_fn = [&inits, &coordinator] {
      ++inits[coordinator.rank()];
      return Status::OK();
    };
    auto creator = ShardedSessionCreator::Create(options, &coordinator, &registry);
    ASSERT_TRUE(creator.ok());
    auto step = (*creator)->create_session();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, 0);
    EXPECT_TRUE((*creator)->restored_from().empty());
  });
  EXPECT_EQ(inits, (std::vector<int>{1, 1, 1}));
  std::filesystem::remove_all(dir);
}

TEST(ShardedSessionCreatorTest, MissingDirectoryOrCoordinatorIsInvalidArgument) {
  TensorRegistry registry;
  auto creator = ShardedSessionCreator::Create({}, nullptr, &registry);
  EXPECT_EQ(creator.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace asyncckpt::cli
