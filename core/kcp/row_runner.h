// `kcpbench run` below the CLI: every selected row, in every selected form, on every rank
// (docs/design.md 3). run_rows() is called once per rank (a thread of the local world, or an MPI
// process) with the same arguments; rank 0 returns the report entries and prints progress.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/compare/compare.h"
#include "core/compare/reference_data.h"
#include "core/compare/reference_spill.h"
#include "core/config/row_config.h"
#include "core/kcp/kcp_engine.h"
#include "core/plan/memory_estimate.h"
#include "core/report/results.h"
#include "kernels/api/backend.h"

namespace kcp {

class Dumper;
struct ExternalKernel;

struct RunOutcome;

struct RunOptions {
  std::vector<Package> packages;  // empty = the row's
  std::vector<SavedKind> saved;   // empty = the row's
  bool run_planned = true;
  std::vector<int> forced_P;          // empty and !use_row_forced = none
  bool use_row_forced = true;         // also run the row's forms.forced_P
  bool sweep = false;                 // --sweep-P: forced P values are an explicit request, so the row's
                                      // forms.forced_rule does not apply; a P a rank cannot take is a skip
  bool sweep_auto = false;            // --sweep-P auto: forced_P per row = auto_sweep_P(its planned plan)
  std::string device_class = "h200";  // planning class when a row names none
  int sm_count = 0;                   // > 0 overrides the class's SM count
  int threads = 1;                    // CPU twin threads per rank
  int ref_threads = 0;                // FP64 reference threads (0 = hardware)
  std::string cache_dir;              // reference cache ("" = none)
  bool determinism_checks = true;
  int warmup = 0;            // untimed runs per form before the timed ones
  int repeats = 1;           // timed runs per form
  bool phase_times = false;  // then `repeats` runs with every backend phase timed (per-phase stats)
  Fault fault;
  bool calibrating = false;  // calibrate: table lines say what was measured, not a verdict
  Dumper* dumper = nullptr;  // --dump: inputs, reference and backend tensors as .npy
  int progress_offset = 0;   // rows before these in the whole run (for "[i/n]" lines)
  int progress_total = 0;    // rows in the whole run (0 = these rows)
  // Rank 0, after every form of a long row (one whose steps are announced): the outcome of these
  // rows so far, so a results file can keep a row's finished forms when the run is cut short.
  std::function<void(const RunOutcome&)> after_long_form;
  // --backend exec: every row runs once through the external command (core/kcp/external_backend.h)
  // as one form "external" on the W = 1, P = 1 plan; `backend` is then not called.
  const ExternalKernel* external = nullptr;
  // A rank's FP64 reference slice of at least this many bytes is put away in a temporary file
  // while the forms run (core/plan/memory_estimate.h kReferenceSpillBytes; 0 = always, -1 = never;
  // kReferenceSpillAuto: as each row's SelectedRow says, else kReferenceSpillBytes).
  int64_t reference_spill_bytes = kReferenceSpillBytes;
  // The FP64 reference runs one group of heads at a time when the row's results pass this many
  // bytes (core/plan/memory_estimate.h reference_head_groups; kReferenceGroupNever: every head at
  // once; kReferenceGroupAuto: auto, as each row's SelectedRow says).
  int64_t reference_group_bytes = kReferenceGroupAuto;
  // Whether a row's input shard may stay across its forms (drawn once a row, not once a form)
  // where the app's memory estimate allows it (SelectedRow::keep_inputs); false: never.
  bool keep_inputs = true;
  // How the forms run by groups of heads (core/plan/memory_estimate.h kHeadGroupAuto / Never / a
  // byte count): the app turns it into each row's SelectedRow::head_groups (core/plan/head_groups.h).
  int64_t head_group_bytes = kHeadGroupAuto;
};

// What one rank keeps of a row's FP64 reference once the row is prepared: its slice (in memory,
// or put away in a temporary file while the forms run when it is large: core/plan/
// memory_estimate.h reference_spills), per piece the Param gradients and probes, and the
// cancellation-aware scales.
struct RankPrepared {
  std::shared_ptr<const RankReference> ref;                          // Token and State tensors; null when spilled
  std::shared_ptr<const ReferenceSpill> spill;                       // null when in memory
  std::vector<std::shared_ptr<const SequenceReference>> piece_refs;  // piece_slice per piece
  ParamScales param_scales;
};

// Shared by the rank threads of one process: one ReferenceCache per row (the first rank to ask
// creates it with the row's probe positions; every rank asks with the same ones).
class ReferenceStore {
 public:
  // keep: the ranks' prepared slices (RankPrepared) are kept until the store ends, so a second run
  // of the same rows with another backend (calibrate's exact-storage twin) reuses them instead of
  // recomputing; the whole sequences' FP64 results still go at release().
  ReferenceStore(std::string cache_dir, int threads, bool keep = false)
      : dir_(std::move(cache_dir)), threads_(threads), keep_(keep) {}
  // The row's references; the first caller's probe positions hold for the store's life (a later
  // run may ask for a subset, never for more).
  ReferenceCache& for_row(const RowConfig& row, const std::string& digest, const ProbePositions& probes);
  // Frees a row's whole-sequence references once every rank of this process has taken its slice
  // (idempotent): a run of many rows then holds one row's FP64 results at a time, not all of them.
  void release(const std::string& digest);
  // With keep: a rank's prepared slice of the row, from an earlier run (null when none).
  std::shared_ptr<const RankPrepared> kept(const std::string& digest, int rank);
  void keep(const std::string& digest, int rank, std::shared_ptr<const RankPrepared> prepared);

 private:
  std::string dir_;
  int threads_;
  bool keep_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<ReferenceCache>> caches_;
  std::map<std::pair<std::string, int>, std::shared_ptr<const RankPrepared>> prepared_;
};

struct RunOutcome {
  std::vector<Entry> entries;  // rank 0 only
  int passed = 0, failed = 0, skipped = 0, contract_broken = 0, refused = 0;
  int timed_out = 0;  // failed entries whose external command passed the row deadline (exit code 5)
};

struct SelectedRow {
  const RowConfig* row;
  std::string digest;
  std::string json;         // the row as loaded, echoed into every entry (replay reads it back)
  bool other_seed = false;  // run at a seed other than the row's own (--seeds): entry ids say it
  // Groups of q/k heads each form runs in (core/kcp/head_group_run.h; a divisor of H; 1: every
  // head at once). The app chooses it from the memory estimate (core/plan/head_groups.h); the
  // ranks take the largest any of them was given.
  int head_groups = 1;
  // Where the rank's FP64 reference slice waits (as RunOptions::reference_spill_bytes), chosen by
  // the app from the memory estimate when --reference-spill is auto (choose_head_groups);
  // kReferenceSpillAuto: not chosen, the run's option holds (auto then spills as kReferenceSpillBytes).
  int64_t reference_spill_bytes = kReferenceSpillAuto;
  // The FP64 reference's groups of heads (as RunOptions::reference_group_bytes), chosen by the app
  // when --reference-group is auto and the host has room for groups wide enough for the
  // reference's threads (choose_head_groups); kReferenceGroupAuto: the run's option holds.
  int64_t reference_group_bytes = kReferenceGroupAuto;
  // The rank's input shard stays across the row's forms (one group of heads; chosen by the app
  // from the memory estimate, choose_head_groups): the inputs are drawn once a row.
  bool keep_inputs = false;
};

RunOutcome run_rows(const std::vector<SelectedRow>& rows, const RunOptions& opt, Communicator& comm,
                    const kernels::Backend& backend, ReferenceStore& refs);

// The header line of the table run_rows prints (one line per entry).
std::string table_header();

// The forms of a row under the options, in run order: for each schedule (planned, then each
// forced P), det before nondet, full before light.
std::vector<Form> expand_forms(const RowConfig& row, const RunOptions& opt);

// --sweep-P auto: the powers of two from 1 up to the largest P any rank of the plan can take (the
// chunks of its longest piece, at most 64), plus every rank's planned P; ascending, no duplicates.
std::vector<int> auto_sweep_P(const SegmentPlan& planned);

}  // namespace kcp
