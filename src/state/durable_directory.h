#pragma once

// The two directory operations that a crash never leaves half done: committing a fully written
// checkpoint directory under its final name (CommitDirectory, with its crash-consistency
// contract), deleting one (RemoveDirectoryDurably), and quarantining a damaged one
// (QuarantineDirectory), and the size of one (DirectoryBytes).

#include <cstdint>
#include <string>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// Removes the directory `parent`/`name` so that a crash never leaves it half deleted under
/// `name`: renames it to DeletingDirName(name) (atomic), syncs `parent` (the new name is
/// durable), and only then removes the renamed tree. A crash at any point leaves `name` whole,
/// or a ".deleting-" directory that CheckpointManager::Start removes. The caller has checked
/// that `name` is a real directory it may delete. A failure to rename or sync leaves `name`
/// whole; a failure of the removal leaves the ".deleting-" name. Returns the first failure.
Status RemoveDirectoryDurably(io::FileSystem& fs, const std::string& parent,
                              const std::string& name);
/// The crash-safe half of RemoveDirectoryDurably: renames `parent`/`name` to
/// DeletingDirName(name) and syncs `parent`. Returns the renamed path, whose tree the caller
/// removes (or the next CheckpointManager::Start does); on failure `name` is left whole.
Result<std::string> RenameForDeletion(io::FileSystem& fs, const std::string& parent,
                                      const std::string& name);

/// Moves the damaged checkpoint `parent`/`name` out of the committed namespace, keeping every
/// byte: renames it to QuarantineDirName(name) (atomic) and syncs `parent`. Returns the new
/// name; on failure `name` is left as it was.
Result<std::string> QuarantineDirectory(io::FileSystem& fs, const std::string& parent,
                                        const std::string& name);

/// Makes `parent`/`tmp_name` (a fully written and synced checkpoint directory) visible as
/// `parent`/`final_name`, durably.
///
/// Crash consistency. The contract is: at every instant, `final_name` is either absent, the old
/// complete checkpoint, or the new complete checkpoint, and once this returns OK the new one
/// survives a crash. It rests on three facts: rename(2) and renameat2(RENAME_EXCHANGE) are
/// atomic with respect to crashes for the names they touch; a directory's entries are durable
/// only after fsync of that directory; and the data files inside the new checkpoint were already
/// synced by the writer. The steps:
///
///  1. sync_dir(tmp): the entries of the new directory (its data files and index) are durable,
///     so after the rename below nobody can see the name with missing files.
///  2a. `final_name` absent (the normal case): rename(tmp, final). A crash before it leaves only
///      the temporary, which CheckpointManager::Start deletes at the next start; a crash after
///      it leaves the complete new checkpoint (or, before step 3, possibly the temporary again).
///  2b. `final_name` present (a re-save of the same step after a resume): exchange(tmp, final)
///      swaps the two names in one atomic step, so `final_name` is never missing. The old copy
///      is now at the temporary name; it is renamed on to DeletingDirName(final) (a failure of
///      that rename leaves it at the temporary name, just as disposable).
///  2c. exchange unsupported (ENOSYS, EINVAL, EOPNOTSUPP: old kernel, or a file system without
///      RENAME_EXCHANGE): rename(final, DeletingDirName(final)), then rename(tmp, final).
///      Between the two renames `final_name` is missing; a crash there leaves a ".deleting-" and
///      a ".tmp-" directory (both deleted at the next start) and a state file naming a missing
///      directory, which CheckpointManager::Start drops and LatestCheckpoint reports as NotFound.
///      Earlier checkpoints are untouched. If the second rename fails the old copy is renamed
///      back.
///  3. sync_dir(parent): the new name is durable, and so is the old copy's ".deleting-" name.
///     Only then is the old copy (2b, 2c) removed: removing its files before the swap is durable
///     could, after a crash, leave `final_name` pointing at the old directory with its files
///     already gone.
///  4. remove_tree(old copy). A failure here is logged, not returned: the new checkpoint is
///     committed, and the leftover is out of the committed namespace; start-up deletes it.
///
/// InvalidArgument for a bad name; otherwise the first failing step's error (with the paths).
Status CommitDirectory(io::FileSystem& fs, const std::string& parent, const std::string& tmp_name,
                       const std::string& final_name);

/// The bytes of the regular files directly in the directory `path` (a checkpoint is flat: an
/// index and data files); what cannot be listed or sized counts 0. For reports, never a decision.
uint64_t DirectoryBytes(io::FileSystem& fs, const std::string& path);

}  // namespace asyncckpt
