// `kcpbench merge A.json B.json ...` below the CLI (docs/design.md 8): one results file from
// several runs of the same code on the same device, e.g. a row set's nightly baseline assembled
// from runs that each fit a machine's time limit (one row or a few forms each).
//
// Refused (ConfigError naming both files and the field) unless every file has the same schema,
// build block, backend, backend_device, device_class, comm, launch_mode and row set (name and
// digest), and no two entries share a key (row digest, id, seed, fault): a merged file holds each
// form of each row once, from one run. The merged context is the first file's with the merge's own
// date and command line; world_size is the largest, seeds the union; context.merged_from lists
// every source file (its date, command line and seeds) and each entry's `source` indexes it, so
// replay finds the flags the entry ran with. A merged file merges again (its sources are listed,
// not nested). The summary is the sum of the sources' summaries (each must have one), and
// complete only when every source is.
#pragma once

#include <string>
#include <vector>

#include "core/report/results.h"

namespace kcp {

struct MergeInput {
  std::string file;  // for messages and merged_from
  Results results;
};

// `command_line` and `date` become the merged context's; throws ConfigError as above.
Results merge_results(const std::vector<MergeInput>& inputs, const std::vector<std::string>& command_line,
                      const std::string& date);

}  // namespace kcp
