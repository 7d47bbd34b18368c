#pragma once

// Names and paths of the entries of a checkpoint directory: which names are allowed, the step in
// "<basename>-<step>", the ".tmp-" and ".deleting-" names a save or a deletion passes
// through, and the ".corrupt-" name of a quarantined checkpoint.
//
// Names are data, never paths: a checkpoint name ("model.ckpt-1000") is a single entry of the
// checkpoint directory. A name that is empty, contains '/', contains "..", or holds a byte that
// would need quoting in the text form ('"', '\\', control bytes) is refused everywhere.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "asyncckpt/file_system.h"
#include "asyncckpt/status.h"
#include "src/util/io_status.h"

namespace asyncckpt {

/// OK when `name` may name an entry of a checkpoint directory, else InvalidArgument saying why.
Status ValidateCheckpointName(std::string_view name);

/// `text` in single quotes for a message, each byte that is not printable ASCII (a control
/// byte, a terminal escape, a quote, a backslash, any byte >= 0x7f) written as \xNN and a long
/// text cut at 200 bytes: bytes read from a file or a directory never reach a terminal raw.
std::string QuoteForMessage(std::string_view text);

/// `dir` + "/" + `name` (no doubled separator; just `name` when dir is empty).
std::string JoinCheckpointPath(const std::string& dir, const std::string& name);

/// "<final_name>.tmp-<16 random hex digits>": where a checkpoint is written before its commit.
std::string TempDirName(const std::string& final_name);

/// "<name>.deleting-<16 random hex digits>": where a checkpoint directory is moved, out of the
/// committed namespace, before its files are removed.
std::string DeletingDirName(const std::string& name);

/// "<name>.corrupt-<16 random hex digits>": where start-up moves a committed checkpoint that
/// failed validation. Kept until a person deletes it; nothing in the library removes it.
std::string QuarantineDirName(const std::string& name);

/// True when `name` is "<basename>-<step>.corrupt-<hex>": a quarantined checkpoint of `basename`.
bool IsQuarantinedCheckpoint(std::string_view name, std::string_view basename);

/// The step of `name` when it is exactly "<basename>-<step>" as format::CheckpointDirName
/// writes it (decimal digits, no sign, no leading zero, fits int64); nullopt otherwise. The one
/// parser of checkpoint names: every reader of a directory or a state file uses it.
std::optional<int64_t> CheckpointStep(std::string_view name, std::string_view basename);

/// InvalidArgument for a negative step: "<basename>--1" is no name CheckpointStep reads back, so
/// a save of it could never be found again.
Status ValidateCheckpointStep(int64_t step);

// Shared with the state file's parser and the start-up pass (src/state); not for other callers.
namespace state_internal {

/// The infix of a temporary: "<name>.tmp-<hex>".
inline constexpr std::string_view kTmpInfix = ".tmp-";
/// The infix of a directory on its way out: "<name>.deleting-<hex>".
inline constexpr std::string_view kDeletingInfix = ".deleting-";
/// The infix of a quarantined checkpoint: "<name>.corrupt-<hex>".
inline constexpr std::string_view kCorruptInfix = ".corrupt-";

/// True for '0' to '9'.
bool IsDecimalDigit(char c);

/// True when `s` is not empty and `pred` holds for each of its bytes.
bool AllOf(std::string_view s, bool (*pred)(char));

/// True when `name` is "<prefix><infix><hex>".
bool IsMarkedOf(std::string_view name, std::string_view prefix, std::string_view infix);

/// Why a name cannot be a directory entry, or empty when it can.
std::string NameProblem(std::string_view name);

}  // namespace state_internal
}  // namespace asyncckpt
