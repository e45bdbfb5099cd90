// `kcpbench merge A.json B.json ...` below the CLI (docs/design.md 8): one results file from
// several runs of the same code on the same device, e.g. a row set's nightly baseline assembled
// from runs that each fit a machine's time limit (one row or a few forms each).
//
// Refused (ConfigError naming the file and the field) unless every file has the same schema,
// build block, backend, backend_device, device_class, comm, launch_mode and row set (name and
// digest); unless every file was built from a clean tree (context.build.git_dirty false; or
// allow_dirty); and when two entries share an id and seed (replay finds entries by id). A row's
// launch skip (an mpirun of another world size: a skip entry without a form) is dropped when
// another file ran the row, and kept once otherwise. The merged context is the first file's with
// the merge's own date and command line; world_size is the largest, seeds the union;
// context.merged_from lists every source file (its date, command line and seeds) and each entry's
// `source` indexes it, so replay reads the flags the entry ran with (--inject-rank) from its own
// run. A merged file merges again (its sources are listed, not nested). The summary counts the
// merged entries as `run` does, complete only when every source is.
#pragma once

#include <string>
#include <vector>

#include "core/report/results.h"

namespace kcp {

struct MergeInput {
  std::string file;  // for messages and merged_from
  Results results;
};

struct MergeResult {
  Results results;
  int superseded_skips = 0;  // launch skips dropped (another file ran the row, or one is kept)
};

// `command_line` and `date` become the merged context's; throws ConfigError as above.
MergeResult merge_results(const std::vector<MergeInput>& inputs, const std::vector<std::string>& command_line,
                          const std::string& date, bool allow_dirty = false);

}  // namespace kcp
