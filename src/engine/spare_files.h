#pragma once

// Data files kept between saves on an in-memory file system (tmpfs, ramfs), for the next save to
// write over instead of into new files (issue 33). A write into a page tmpfs already holds is a
// copy; a write into a new file first allocates and clears every page, and on a VM that returns
// freed memory to its host, faults it back in: 0.34 s against 0.75 s per GiB on the development
// VM, measured with pwrite of 1 GiB over and into a /dev/shm file. PostgreSQL recycles its WAL
// segments and RocksDB its logs for the same reason.
//
// A spare is a directory named "<checkpoint>.deleting-<hex>" that holds one file per data file
// of the saves (the same names): either the data files of a checkpoint retention dropped (Adopt,
// on the retention remover's thread) or, when retention dropped none, files of the last save's
// sizes, allocated there (Replenish, on the same thread, between saves). The next save moves
// them into its temporary directory (TakeInto), writes over them and trims them at its commit.
// Start-up removes a spare left by a crash as it removes any ".deleting-" directory, so a spare
// never looks like a checkpoint, and retention's rules are unchanged: a dropped checkpoint has
// left the committed names before its files become a spare. The cost is memory: between saves
// the file system holds one checkpoint's data beyond what retention keeps, which is what it
// holds anyway while a save is written.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "asyncckpt/file_system.h"
#include "src/state/checkpoint_state.h"

namespace asyncckpt {

/// The spare data files of one engine's saves on an in-memory file system. Thread-safe.
class SpareFiles {
 public:
  /// `fs` is borrowed and must outlive this.
  SpareFiles(io::FileSystem* fs, std::string checkpoint_dir);
  /// Removes the spare it holds.
  ~SpareFiles();
  SpareFiles(const SpareFiles&) = delete;
  SpareFiles& operator=(const SpareFiles&) = delete;

  /// Records the data files of a save committed as `final_name` on an in-memory file system
  /// (format::DataFileName(i, sizes.size()), sizes[i] bytes): what a spare must hold. Until
  /// this is called nothing is kept.
  void NoteSave(const std::string& final_name, std::vector<uint64_t> sizes);
  /// Takes over `tree` (a dropped checkpoint, renamed out of the committed names) as the spare
  /// when none is held and it holds every noted data file: removes its other files and returns
  /// true. False leaves it to the caller to remove.
  bool Adopt(const std::string& tree);
  /// Whether Replenish would make a spare: a save was noted and none is held.
  bool Wanted() const;
  /// Makes a spare of the noted sizes when none is held. A failure (no space) removes what it
  /// made, is logged once and ends replenishing for this engine: a spare is never worth a save.
  void Replenish();
  /// The retention remover's work: removes what `manager` renamed, adopting a tree as the
  /// spare where Adopt takes it, then replenishes.
  void RemoveOrKeep(CheckpointManager& manager);
  /// Moves the spare's `count` data files into `dir` (the save's temporary directory), then
  /// removes the spare. True when every one was moved: the caller opens them without truncating.
  bool TakeInto(const std::string& dir, uint32_t count);

 private:
  // Whether `tree` holds a file of every name in `names`.
  bool HoldsAll(const std::string& tree, const std::vector<std::string>& names) const;
  // Removes `tree`, logging a failure (the next start removes what is left).
  void Remove(const std::string& tree) const;

  io::FileSystem* const fs_;
  const std::string dir_;
  mutable std::mutex mu_;
  std::string noted_name_;  // the last noted save's final name
  std::vector<std::string> names_;
  std::vector<uint64_t> sizes_;
  std::optional<std::string> spare_;  // the spare directory's path, once complete
  bool making_ = false;               // Adopt or Replenish is preparing one, outside mu_
  bool replenish_failed_ = false;
};

}  // namespace asyncckpt
