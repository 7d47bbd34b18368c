#include "src/saver/coordination.h"

#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "asyncckpt/dtype.h"
#include "src/util/status_macros.h"

namespace asyncckpt {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

std::string BoxString(const TensorPlacement& p) {
  return "box at " + ShapeString(p.offset) + " of extent " + ShapeString(p.extent);
}

// Little-endian fields, as every target of ours is.
class Writer {
 public:
  void u8(uint8_t v) { bytes_.push_back(v); }
  void u32(uint32_t v) { raw(&v, sizeof(v)); }
  void i64(int64_t v) { raw(&v, sizeof(v)); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<uint8_t> bytes_;
};

// Reads what Writer wrote; every length is checked against what is left.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  bool u8(uint8_t* v) { return raw(v, sizeof(*v)); }
  bool u32(uint32_t* v) { return raw(v, sizeof(*v)); }
  bool i64(int64_t* v) { return raw(v, sizeof(*v)); }
  bool str(std::string* s) {
    uint32_t n = 0;
    if (!u32(&n) || n > bytes_.size() - at_) return false;
    s->assign(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return true;
  }
  bool done() const { return at_ == bytes_.size(); }
  size_t left() const { return bytes_.size() - at_; }

 private:
  bool raw(void* p, size_t n) {
    if (n > bytes_.size() - at_) return false;
    std::memcpy(p, bytes_.data() + at_, n);
    at_ += n;
    return true;
  }
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

std::vector<uint8_t> EncodeRankStart(const Status& status,
                                     const std::vector<TensorPlacement>& placements) {
  Writer w;
  w.u8(status.ok() ? 1 : 0);
  if (!status.ok()) {
    w.u32(static_cast<uint32_t>(status.code()));
    w.str(status.message());
    return w.take();
  }
  w.u32(static_cast<uint32_t>(placements.size()));
  for (const TensorPlacement& p : placements) {
    w.str(p.name);
    w.u8(static_cast<uint8_t>(p.dtype));
    w.u8(p.shard ? 1 : 0);
    w.u32(static_cast<uint32_t>(p.global_shape.size()));
    for (size_t d = 0; d < p.global_shape.size(); ++d) {
      w.i64(p.global_shape[d]);
      w.i64(p.offset[d]);
      w.i64(p.extent[d]);
    }
  }
  return w.take();
}

// A rank's start-up status (its error names the rank) and, when OK, its placements.
Status DecodeRankStart(std::span<const uint8_t> bytes, int rank,
                       std::vector<TensorPlacement>* placements) {
  const std::string from = "rank " + std::to_string(rank);
  const Status garbled = Status::Corruption("the start-up message of " + from + " does not parse");
  Reader r(bytes);
  uint8_t ok = 0;
  if (!r.u8(&ok)) return garbled;
  if (!ok) {
    uint32_t code = 0;
    std::string message;
    if (!r.u32(&code) || !r.str(&message)) return garbled;
    return Status(static_cast<StatusCode>(code), from + " could not start: " + message);
  }
  uint32_t count = 0;
  if (!r.u32(&count)) return garbled;
  for (uint32_t i = 0; i < count; ++i) {
    TensorPlacement p;
    uint8_t dtype = 0;
    uint8_t shard = 0;
    uint32_t dims = 0;
    if (!r.str(&p.name) || !r.u8(&dtype) || !r.u8(&shard) || !r.u32(&dims) ||
        dims > r.left() / (3 * sizeof(int64_t))) {
      return garbled;
    }
    const std::optional<DType> type = DTypeFromByte(dtype);
    if (!type) return garbled;
    p.dtype = *type;
    p.shard = shard != 0;
    p.global_shape.resize(dims);
    p.offset.resize(dims);
    p.extent.resize(dims);
    for (uint32_t d = 0; d < dims; ++d) {
      if (!r.i64(&p.global_shape[d]) || !r.i64(&p.offset[d]) || !r.i64(&p.extent[d])) {
        return garbled;
      }
    }
    placements->push_back(std::move(p));
  }
  return r.done() ? Status::OK() : garbled;
}

int64_t Volume(const std::vector<int64_t>& extent) {
  int64_t v = 1;
  for (int64_t e : extent) v *= e;  // bounded: each box lies inside a global shape that fits
  return v;
}

bool Overlap(const TensorPlacement& a, const TensorPlacement& b) {
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    if (lo >= hi) return false;
  }
  return true;
}

std::string RandomHex16() {
  std::random_device device;
  const uint64_t value = (static_cast<uint64_t>(device()) << 32) ^ device();
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text(16, '0');
  for (int i = 0; i < 16; ++i) text[i] = kHex[(value >> (60 - 4 * i)) & 0xf];
  return text;
}

}  // namespace

std::vector<TensorPlacement> PlacementsOf(const TensorRegistry& registry) {
  std::vector<TensorPlacement> placements;
  placements.reserve(registry.size());
  for (const TensorRef& t : registry.tensors()) {
    TensorPlacement p{
        .name = t.name,
        .dtype = t.dtype,
        .shard = IsShard(t),
        .global_shape = IsShard(t) ? t.global_shape : t.shape,
        .offset = IsShard(t) ? t.global_offset : std::vector<int64_t>(t.shape.size(), 0),
        .extent = t.shape};
    placements.push_back(std::move(p));
  }
  return placements;
}

Result<std::vector<bool>> WrittenByRank(const std::vector<std::vector<TensorPlacement>>& all,
                                        int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= all.size()) {
    return Status::InvalidArgument("WrittenByRank: rank " + std::to_string(rank) +
                                   " is not one of " + std::to_string(all.size()));
  }
  // Per name, every rank's placement, lowest rank first.
  std::map<std::string, std::vector<std::pair<int, const TensorPlacement*>>> by_name;
  for (size_t r = 0; r < all.size(); ++r) {
    for (const TensorPlacement& p : all[r]) by_name[p.name].emplace_back(static_cast<int>(r), &p);
  }
  using BoxKey = std::pair<std::vector<int64_t>, std::vector<int64_t>>;
  std::map<std::string, std::map<BoxKey, int>> writer;  // name -> box -> lowest rank holding it
  for (const auto& [name, held] : by_name) {
    const auto& [first_rank, first] = held.front();
    const std::string what = "tensor '" + name + "'";
    const auto on = [](int r) { return " on rank " + std::to_string(r); };
    std::map<BoxKey, std::pair<int, const TensorPlacement*>> boxes;
    for (const auto& [r, p] : held) {
      if (p->shard != first->shard) {
        return Status::InvalidArgument(
            what + " is " + (first->shard ? "a shard" : "whole") + on(first_rank) + " but " +
            (p->shard ? "a shard" : "whole") + on(r) +
            ": register it with a global_shape on every rank or on none");
      }
      if (p->dtype != first->dtype) {
        return Status::InvalidArgument(what + " is " + std::string(DTypeName(first->dtype)) +
                                       on(first_rank) + " but " + std::string(DTypeName(p->dtype)) +
                                       on(r));
      }
      if (p->global_shape != first->global_shape) {
        return Status::InvalidArgument(what + " has " + (p->shard ? "global shape " : "shape ") +
                                       ShapeString(first->global_shape) + on(first_rank) + " but " +
                                       ShapeString(p->global_shape) + on(r));
      }
      boxes.try_emplace(BoxKey{p->offset, p->extent}, r, p);  // the lowest rank stays
    }
    int64_t covered = 0;
    for (auto a = boxes.begin(); a != boxes.end(); ++a) {
      for (auto b = std::next(a); b != boxes.end(); ++b) {
        if (Overlap(*a->second.second, *b->second.second)) {
          return Status::InvalidArgument(what + ": the " + BoxString(*a->second.second) +
                                         on(a->second.first) + " overlaps the " +
                                         BoxString(*b->second.second) + on(b->second.first) +
                                         " (boxes of a tensor are equal, replicas, or disjoint)");
        }
      }
      covered += Volume(a->second.second->extent);
      writer[name][a->first] = a->second.first;
    }
    const int64_t total = Volume(first->global_shape);
    if (covered != total) {
      std::string ranks;
      for (const auto& [r, p] : held) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      return Status::InvalidArgument(what + ": the boxes of ranks " + ranks + " cover " +
                                     std::to_string(covered) + " of the " + std::to_string(total) +
                                     " elements of its global shape " +
                                     ShapeString(first->global_shape));
    }
  }
  std::vector<bool> mine;
  mine.reserve(all[rank].size());
  for (const TensorPlacement& p : all[rank]) {
    mine.push_back(writer[p.name][BoxKey{p.offset, p.extent}] == rank);
  }
  return mine;
}

Result<std::string> AgreeOnJobToken(Coordinator& coordinator,
                                    const std::function<Status()>& rank0_start) {
  std::vector<uint8_t> message;
  if (coordinator.rank() == 0) {
    const Status started = rank0_start();
    Writer w;
    w.u8(started.ok() ? 1 : 0);
    w.u32(static_cast<uint32_t>(started.code()));
    w.str(started.ok() ? RandomHex16() : started.message());
    message = w.take();
  }
  RETURN_IF_ERROR(coordinator.broadcast(message, 0).WithContext("agreeing on the job token"));
  Reader r(message);
  uint8_t ok = 0;
  uint32_t code = 0;
  std::string text;
  if (!r.u8(&ok) || !r.u32(&code) || !r.str(&text) || !r.done()) {
    return Status::Corruption("the job token broadcast by rank 0 does not parse");
  }
  if (!ok) return Status(static_cast<StatusCode>(code), "rank 0 could not start: " + text);
  return text;
}

Result<TensorRegistry> AgreeOnWriters(Coordinator& coordinator, const TensorRegistry& local,
                                      const Status& local_status) {
  const std::vector<uint8_t> mine = EncodeRankStart(local_status, PlacementsOf(local));
  ASSIGN_OR_RETURN(const std::vector<std::vector<uint8_t>> gathered, coordinator.all_gather(mine));
  if (gathered.size() != static_cast<size_t>(coordinator.size())) {
    return Status::Internal("all_gather returned " + std::to_string(gathered.size()) +
                            " messages for " + std::to_string(coordinator.size()) + " ranks");
  }
  std::vector<std::vector<TensorPlacement>> all(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    RETURN_IF_ERROR(DecodeRankStart(gathered[r], static_cast<int>(r), &all[r]));
  }
  ASSIGN_OR_RETURN(const std::vector<bool> writes, WrittenByRank(all, coordinator.rank()));
  TensorRegistry registry;
  for (size_t i = 0; i < writes.size(); ++i) {
    if (writes[i]) RETURN_IF_ERROR(registry.add(local.tensors()[i]));
  }
  return registry;
}

Status AgreeOnStatus(Coordinator& coordinator, const Status& local) {
  Writer w;
  w.u32(static_cast<uint32_t>(local.code()));
  w.str(local.message());
  ASSIGN_OR_RETURN(const std::vector<std::vector<uint8_t>> gathered,
                   coordinator.all_gather(w.take()));
  for (size_t r = 0; r < gathered.size(); ++r) {
    Reader reader(gathered[r]);
    uint32_t code = 0;
    std::string message;
    if (!reader.u32(&code) || !reader.str(&message) || !reader.done()) {
      return Status::Corruption("the status sent by rank " + std::to_string(r) + " does not parse");
    }
    if (code != static_cast<uint32_t>(StatusCode::kOk)) {
      return Status(static_cast<StatusCode>(code), "rank " + std::to_string(r) + ": " + message);
    }
  }
  return Status::OK();
}

namespace {

// Under save_secs every step's broadcast from rank 0 carries its save decision (one byte), or,
// once rank 0's training ended, its end: kEndTag and the step, 8 bytes in host order (every rank
// runs the same binary on machines of one byte order). A mismatch is FailedPrecondition, not
// Aborted, which a MonitoredSession would take for a pre-emption and recover from.
constexpr uint8_t kEndTag = 2;

std::vector<uint8_t> EndMessage(int64_t step) {
  std::vector<uint8_t> message(1 + sizeof(step));
  message[0] = kEndTag;
  std::memcpy(message.data() + 1, &step, sizeof(step));
  return message;
}

// Rank 0's end step when `message` is an EndMessage.
std::optional<int64_t> EndStepOf(const std::vector<uint8_t>& message) {
  if (message.size() != 1 + sizeof(int64_t) || message[0] != kEndTag) return std::nullopt;
  int64_t step = 0;
  std::memcpy(&step, message.data() + 1, sizeof(step));
  return step;
}

Status EndedAtAnotherStep(const Coordinator& coordinator, int64_t lead_end, int64_t step,
                          bool this_rank_ended) {
  return Status::FailedPrecondition(
      "rank 0 ended its training at step " + std::to_string(lead_end) + ", while rank " +
      std::to_string(coordinator.rank()) + (this_rank_ended ? " ended at step " : " is at step ") +
      std::to_string(step) + ": the ranks ran different numbers of steps");
}

}  // namespace

Result<bool> AgreeOnSaveDue(Coordinator& coordinator, bool due, int64_t step) {
  std::vector<uint8_t> decision{static_cast<uint8_t>(due ? 1 : 0)};
  RETURN_IF_ERROR(coordinator.broadcast(decision, 0).WithContext("agreeing on a save_secs save"));
  RETURN_IF_ERROR(CheckNotRankZerosEnd(coordinator, decision, step));
  if (decision.size() != 1) return Status::Corruption("rank 0's save decision does not parse");
  return decision[0] != 0;
}

Status AgreeOnEnd(Coordinator& coordinator, int64_t step) {
  std::vector<uint8_t> message =
      coordinator.rank() == 0 ? EndMessage(step) : std::vector<uint8_t>{};
  RETURN_IF_ERROR(coordinator.broadcast(message, 0).WithContext("agreeing on the end of training"));
  const std::optional<int64_t> lead_end = EndStepOf(message);
  if (!lead_end) {
    return Status::FailedPrecondition(
        "rank " + std::to_string(coordinator.rank()) + " ended its training at step " +
        std::to_string(step) +
        ", but rank 0 still trains (what it sent was not its end): the ranks ran "
        "different numbers of steps");
  }
  if (*lead_end != step) {
    return EndedAtAnotherStep(coordinator, *lead_end, step, /*this_rank_ended=*/true);
  }
  return Status::OK();
}

Status CheckNotRankZerosEnd(const Coordinator& coordinator, const std::vector<uint8_t>& message,
                            int64_t step) {
  const std::optional<int64_t> lead_end = EndStepOf(message);
  if (!lead_end) return Status::OK();
  return EndedAtAnotherStep(coordinator, *lead_end, step, /*this_rank_ended=*/false);
}

}  // namespace asyncckpt
