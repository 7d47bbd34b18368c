#pragma once

// The data files of a checkpoint retention dropped, kept on an in-memory file system (tmpfs,
// ramfs) for the next save to write over instead of into new files (issue 33). A write into a
// page tmpfs already holds is a copy; a write into a new file first allocates and clears every
// page, and on a VM that hands freed memory back to its host, faults it back in from there:
// `dd if=/dev/zero of=/dev/shm/x bs=64M count=16 conv=fdatasync` (a new file) took 0.69-0.79 s
// on the development VM, the same with conv=notrunc,fdatasync (over it) 0.35-0.36 s. PostgreSQL
// recycles its WAL segments and RocksDB its logs for the same reason.
//
// On the retention remover's thread, the tree of a dropped checkpoint (already renamed out of
// the committed names to "<checkpoint>.deleting-<hex>") loses its index and metadata and keeps
// its data files (Adopt). The next save moves them into its temporary directory (TakeInto),
// writes over them and trims them at its commit. One spare at most: the memory the file system
// holds is what it held before, the retained checkpoints and the one being written, only the
// dropped checkpoint's pages go to the next save instead of back to the allocator. Start-up
// removes a spare left by a crash as it removes any ".deleting-" directory, so a spare never
// looks like a checkpoint, and retention's rules are unchanged.
//
// Files allocated ahead of a save (fallocate between saves, while retention drops nothing yet)
// were tried and measured slower: they add a checkpoint's worth of memory, which on this VM is
// memory the host must give back, and the allocation competes with the save it was meant for.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "asyncckpt/file_system.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt {

/// The spare data files of one engine's saves on an in-memory file system. Thread-safe.
class SpareFiles {
 public:
  /// `fs` is borrowed and must outlive this.
  explicit SpareFiles(io::FileSystem* fs);
  /// Removes the spare it holds.
  ~SpareFiles();
  SpareFiles(const SpareFiles&) = delete;
  SpareFiles& operator=(const SpareFiles&) = delete;

  /// Records that a save of `count` data files (format::DataFileName(i, count)) was committed on
  /// an in-memory file system: what a spare must hold. Until this is called nothing is kept.
  void NoteSave(uint32_t count);
  /// Takes over `tree` (a dropped checkpoint, renamed out of the committed names) as the spare
  /// when none is held and it holds every noted data file: removes its other entries and returns
  /// true. False leaves it to the caller to remove.
  bool Adopt(const std::string& tree);
  /// The retention remover's work: removes what `manager` renamed, but a tree Adopt takes.
  void RemoveOrKeep(CheckpointManager& manager);
  /// Moves the spare's `count` data files into `dir` (the save's temporary directory), then
  /// removes the spare. True when every one was moved: the caller opens them without truncating.
  bool TakeInto(const std::string& dir, uint32_t count);
  /// The spare's directory, if one is held.
  std::optional<std::string> held() const;

 private:
  // Whether `tree` holds a regular file of every noted data file's name.
  bool HoldsAll(const std::string& tree, uint32_t count) const;
  // Removes `tree`, logging a failure (the next start removes what is left).
  void Remove(const std::string& tree) const;

  io::FileSystem* const fs_;
  mutable std::mutex mu_;
  uint32_t count_ = 0;                // data files per save; 0: no save noted yet
  std::optional<std::string> spare_;  // the spare directory's path, once complete
  bool adopting_ = false;             // Adopt is preparing one, outside mu_
};

}  // namespace asyncckpt
