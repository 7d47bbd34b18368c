// The single-process Coordinator: today's behaviour, a job of one.

#include "asyncckpt/coordinator.h"

namespace asyncckpt {
namespace {

class SingleProcessCoordinator final : public Coordinator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

  Status broadcast(std::vector<uint8_t>& bytes, int root) override {
    (void)bytes;  // the root's bytes are already this rank's
    if (root != 0) {
      return Status::InvalidArgument("broadcast: root " + std::to_string(root) +
                                     " is not a rank of a job of 1 process");
    }
    return Status::OK();
  }

  Result<std::vector<std::vector<uint8_t>>> all_gather(std::span<const uint8_t> bytes) override {
    return std::vector<std::vector<uint8_t>>{std::vector<uint8_t>(bytes.begin(), bytes.end())};
  }
};

}  // namespace

std::unique_ptr<Coordinator> NewSingleProcessCoordinator() {
  return std::make_unique<SingleProcessCoordinator>();
}

}  // namespace asyncckpt
