#pragma once

// A checkpoint's tensors as safetensors files, the form inference servers and model hubs load,
// and back: ExportSafetensors writes the tensors a checkpoint holds (whole global tensors, also
// of a sharded one) into one file or several with Hugging Face's model.safetensors.index.json;
// ImportSafetensors makes a checkpoint a job can start from out of such files.
//
// Both check everything before they write anything: bad input (an unknown dtype, tensors whose
// bytes overlap or leave a gap, a selection that matches nothing, a name that two tensors
// would share) is InvalidArgument naming the file and the tensor, and no file is left behind.

#include <cstdint>
#include <string>
#include <vector>

#include "asyncckpt/compression.h"
#include "asyncckpt/status.h"

namespace asyncckpt {

/// How ExportSafetensors names, selects and splits.
struct SafetensorsExportOptions {
  /// The tensors to export, by their exported names: a glob ('*' any characters, '?' one) when
  /// it holds either, else a prefix. Empty: all.
  std::string select;
  /// A file holds at most this many bytes of tensor data (a larger tensor gets a file of its
  /// own); 0: one file, model.safetensors.
  uint64_t max_shard_bytes = 0;
  /// Keep the checkpoint's '/'-joined key paths as names ("model/fc.weight"); by default they
  /// are joined with '.' as Hugging Face names them ("model.fc.weight").
  bool keep_names = false;
  /// Most bytes of tensor data held in memory at once: the export reads and verifies the next
  /// slabs (a third of this each) while it writes the one before.
  uint64_t buffer_bytes = 192ull << 20;
};

/// What ExportSafetensors wrote.
struct SafetensorsExportReport {
  /// The files written, in order (model.safetensors, or model-0000N-of-0000M.safetensors and
  /// model.safetensors.index.json).
  std::vector<std::string> files;
  /// Tensors written.
  uint64_t tensors = 0;
  /// Bytes of tensor data written.
  uint64_t bytes = 0;
};

/// Writes the tensors of `checkpoint` (a checkpoint directory, or a directory whose state file
/// names its latest) into `out_dir` (created if missing), each file synced and renamed into
/// place; refuses to replace a file already there.
Result<SafetensorsExportReport> ExportSafetensors(const std::string& checkpoint,
                                                  const std::string& out_dir,
                                                  const SafetensorsExportOptions& options = {});

/// How ImportSafetensors names and stores.
struct SafetensorsImportOptions {
  /// The step of the checkpoint made.
  int64_t step = 0;
  /// Its basename: the checkpoint is "<checkpoint_dir>/<basename>-<step>".
  std::string basename = "model.ckpt";
  /// Put before every tensor name, e.g. "model/" so that a Python state {"model": module}
  /// restores them.
  std::string prefix;
  /// Codec and level of the checkpoint made.
  CompressionOptions compression;
};

/// Makes checkpoint `step` in `checkpoint_dir` (with its state file, as a save does) from
/// `input`: a .safetensors file, or a directory holding model.safetensors.index.json or one
/// model.safetensors. Returns the checkpoint's path. FailedPrecondition when checkpoint_dir
/// already holds that step.
Result<std::string> ImportSafetensors(const std::string& input, const std::string& checkpoint_dir,
                                      const SafetensorsImportOptions& options = {});

}  // namespace asyncckpt
