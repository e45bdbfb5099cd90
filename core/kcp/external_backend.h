// The external backend (`kcpbench run --backend exec:COMMAND`, docs/external.md): a kernel outside
// kcpbench, reached through files. Per row and seed, kcpbench writes the row's inputs (the same
// make_inputs values the built-in backends get, over the whole token range) as .npy files with a
// manifest.json into a fresh folder, runs COMMAND with the folder as its last argument
// (core/kcp/external_process.h: own process group, log file, the row deadline as time limit),
// then reads outputs/<tensor>.npy and checks each file's dtype and shape. The caller judges what
// was read with the built-in compare path (core/kcp/row_runner.cpp), so budgets, JSON and exit
// codes are those of every backend.
//
// An external kernel sees whole sequences: the row runs as one process (W = 1) with one segment
// per sequence (P = 1), so h_entry / dh_exit have no judged element (count 0). Every other tensor
// the row has (o, ht, dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0) is required: a missing or
// malformed file is listed in `problems` and fails the entry, never passes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config/row_config.h"
#include "core/inputs/inputs.h"
#include "core/kcp/rank_result.h"
#include "core/plan/segment_plan.h"

namespace kcp {

inline constexpr const char* kExternalProtocol = "kcpbench.external/1";

struct ExternalKernel {
  std::string command;      // run through /bin/sh -c, the folder appended as the last argument
  std::string root;         // each row's folder is made inside it: ROOT/<row>_seed<seed>
  double time_limit_s = 0;  // per command (the row deadline); <= 0: none
};

struct ExternalRun {
  std::string folder, log_file;
  // The command failed as a whole (could not start, non-zero exit, a signal, the time limit, or
  // no output file at all): why, with the log's tail. Nothing was read then.
  std::string failure;
  bool timed_out = false;
  double seconds = 0;
  int exit_status = -1;
  std::string log_tail;
  RankResult result;                                         // the tensors read, in the rank layout (others NaN)
  std::vector<std::string> not_provided;                     // tensors the row judges whose file is missing
  std::vector<std::string> problems;                         // per bad or missing tensor: file, expected, got
  nlohmann::json to_json(const std::string& command) const;  // the entry's "external" block
};

// Writes the inputs and the manifest, runs the command and reads the outputs. `rp` is the W = 1,
// P = 1 plan of the row (its pieces are the sequences with tokens).
ExternalRun run_external(const ExternalKernel& kernel, const RowConfig& row, const std::string& row_digest,
                         const RowInputs& in, const RankPlan& rp);

// The manifest.json of a row (exposed for tests and docs/external.md).
nlohmann::json external_manifest(const RowConfig& row, const std::string& row_digest, double time_limit_s);

}  // namespace kcp
