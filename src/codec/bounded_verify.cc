// VerifyStreaming: a chunk's checks with its frame decoded through small windows (see
// bounded_verify.h).

#include "src/codec/bounded_verify.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "src/util/status_macros.h"

namespace asyncckpt::codec {
namespace {

constexpr size_t kPieceBytes = 64 * 1024;

struct DCtxDeleter {
  void operator()(ZSTD_DCtx* ctx) const { ZSTD_freeDCtx(ctx); }
};
struct XxhDeleter {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};

std::string Hex(uint64_t value) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[static_cast<size_t>(i)] = kDigits[value & 0xf];
  return out;
}

// One pass over the frame: decoded bytes in order, through the frame's window only.
class FrameCursor {
 public:
  Status Open(std::span<const uint8_t> stored) {
    ctx_.reset(ZSTD_createDCtx());
    if (!ctx_) return Status::ResourceExhausted("cannot create a zstd decompression context");
    const size_t rc =
        ZSTD_DCtx_setParameter(ctx_.get(), ZSTD_d_windowLogMax, kStreamingVerifyMaxWindowLog);
    if (ZSTD_isError(rc)) return Status::Internal(ZSTD_getErrorName(rc));
    in_ = {stored.data(), stored.size(), 0};
    return Status::OK();
  }

  // The next n decoded bytes into dst (null: dropped). Corruption when the frame ends first.
  Status Read(uint8_t* dst, uint64_t n) {
    uint8_t piece[kPieceBytes];
    while (n > 0) {
      const size_t want = static_cast<size_t>(dst ? n : std::min<uint64_t>(n, kPieceBytes));
      ZSTD_outBuffer out = {dst ? dst : piece, want, 0};
      RETURN_IF_ERROR(Step(&out));
      if (out.pos == 0 && ended_) {
        return Status::Corruption("the stored bytes decode to fewer bytes than the index says");
      }
      n -= out.pos;
      if (dst) dst += out.pos;
    }
    return Status::OK();
  }

  // OK when the frame ends here and fills the stored bytes.
  Status ExpectEnd() {
    uint8_t extra = 0;
    while (!ended_) {
      ZSTD_outBuffer out = {&extra, 1, 0};
      RETURN_IF_ERROR(Step(&out));
      if (out.pos != 0) {
        return Status::Corruption("the stored bytes decode to more bytes than the index says");
      }
    }
    if (in_.pos != in_.size) {
      return Status::Corruption("the zstd frame ends after " + std::to_string(in_.pos) + " of " +
                                std::to_string(in_.size) + " stored bytes");
    }
    return Status::OK();
  }

 private:
  // One call of the decoder; out->pos == 0 afterwards means it could make no progress.
  Status Step(ZSTD_outBuffer* out) {
    if (ended_) return Status::OK();
    const size_t before_in = in_.pos;
    const size_t rc = ZSTD_decompressStream(ctx_.get(), out, &in_);
    if (ZSTD_isError(rc)) {
      return Status::Corruption(std::string("zstd cannot decode the stored bytes: ") +
                                ZSTD_getErrorName(rc));
    }
    if (rc == 0) ended_ = true;
    if (out->pos == 0 && !ended_ && in_.pos == before_in) {
      return Status::Corruption("the zstd frame is truncated");
    }
    return Status::OK();
  }

  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx_;
  ZSTD_inBuffer in_{};
  bool ended_ = false;
};

Status CheckDeclaredSize(std::span<const uint8_t> stored, uint64_t raw_bytes) {
  const unsigned long long declared = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR) {
    return Status::Corruption("the stored bytes are not a zstd frame");
  }
  if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared != raw_bytes) {
    return Status::Corruption("the zstd frame declares " + std::to_string(declared) +
                              " decoded bytes, the index says " + std::to_string(raw_bytes));
  }
  return Status::OK();
}

// The planes of a shuffled chunk read side by side, re-interleaved into raw order piece by
// piece: plane k (byte k of every element) starts at k * count in the decoded stream.
Status HashShuffled(std::span<const uint8_t> stored, size_t elem_size, uint64_t raw_bytes,
                    XXH3_state_t* hash) {
  const uint64_t count = raw_bytes / elem_size;
  std::vector<FrameCursor> planes(elem_size);
  for (size_t k = 0; k < elem_size; ++k) {
    RETURN_IF_ERROR(planes[k].Open(stored));
    RETURN_IF_ERROR(planes[k].Read(nullptr, k * count));
  }
  std::vector<uint8_t> bytes(kPieceBytes * elem_size), raw(kPieceBytes * elem_size);
  for (uint64_t done = 0; done < count;) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, count - done));
    for (size_t k = 0; k < elem_size; ++k) {
      RETURN_IF_ERROR(planes[k].Read(bytes.data() + k * kPieceBytes, m));
    }
    for (size_t i = 0; i < m; ++i) {
      for (size_t k = 0; k < elem_size; ++k) raw[i * elem_size + k] = bytes[k * kPieceBytes + i];
    }
    XXH3_64bits_update(hash, raw.data(), m * elem_size);
    done += m;
  }
  // The tail (raw_bytes % elem_size bytes) follows the last plane, unshuffled.
  const size_t tail = static_cast<size_t>(raw_bytes - count * elem_size);
  RETURN_IF_ERROR(planes.back().Read(raw.data(), tail));
  XXH3_64bits_update(hash, raw.data(), tail);
  return planes.back().ExpectEnd();
}

Status HashInOrder(std::span<const uint8_t> stored, uint64_t raw_bytes, XXH3_state_t* hash) {
  FrameCursor cursor;
  RETURN_IF_ERROR(cursor.Open(stored));
  std::vector<uint8_t> piece(kPieceBytes);
  for (uint64_t done = 0; done < raw_bytes;) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, raw_bytes - done));
    RETURN_IF_ERROR(cursor.Read(piece.data(), m));
    XXH3_64bits_update(hash, piece.data(), m);
    done += m;
  }
  return cursor.ExpectEnd();
}

}  // namespace

Status VerifyStreaming(Codec codec, std::span<const uint8_t> stored, size_t elem_size,
                       uint64_t raw_bytes, uint64_t expected_xxh3) {
  if (codec != Codec::kZstd && codec != Codec::kShuffleZstd) {
    return Status::InvalidArgument("VerifyStreaming decodes zstd frames only");
  }
  RETURN_IF_ERROR(CheckDeclaredSize(stored, raw_bytes));
  std::unique_ptr<XXH3_state_t, XxhDeleter> hash(XXH3_createState());
  if (!hash || XXH3_64bits_reset(hash.get()) != XXH_OK) {
    return Status::ResourceExhausted("cannot create an XXH3 state");
  }
  const bool shuffled = codec == Codec::kShuffleZstd && elem_size > 1 && raw_bytes >= elem_size;
  RETURN_IF_ERROR(shuffled ? HashShuffled(stored, elem_size, raw_bytes, hash.get())
                           : HashInOrder(stored, raw_bytes, hash.get()));
  const uint64_t actual = XXH3_64bits_digest(hash.get());
  if (actual != expected_xxh3) {
    return Status::Corruption("checksum mismatch: XXH3 of the decoded bytes is " + Hex(actual) +
                              ", the index says " + Hex(expected_xxh3));
  }
  return Status::OK();
}

}  // namespace asyncckpt::codec
