// What `kcpbench run` checks before any row runs (ConfigError, exit 2): an injected hang needs a
// finite deadline (and the run says how long it will hang), and every selected row must fit in the
// host and device memory at hand (core/plan/memory_estimate.h), unless --max-host-mem /
// --max-device-mem say how much there is. --json and --dump must be writable before any row runs.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "core/kcp/row_runner.h"
#include "core/plan/memory_estimate.h"
#include "kernels/api/backend.h"

namespace kcp::app {

struct RunGuard {
  double deadline = 0;          // seconds; <= 0: none
  bool deadline_given = false;  // --deadline on the command line (else the default)
  std::string max_host_mem = "auto", max_device_mem = "auto";
  bool use_mpi = false;                 // one rank per process (else every row's ranks are threads of this one)
  int threads = 0;                      // --threads (0: default)
  std::string json;                     // --json ("" none; checked on rank 0, the one that writes it)
  std::string dump;                     // --dump ("" none)
  std::string max_spill_disk = "auto";  // --max-spill-disk (max_spill_disk_help())
};

void check_before_run(std::vector<SelectedRow>& rows, const RunOptions& opt, const kernels::Backend& backend,
                      const RunGuard& guard);

// Chooses each row's groups of heads (SelectedRow::head_groups, from RunOptions::head_group_bytes:
// core/plan/head_groups.h; one group with --dump) and refuses (ConfigError, exit 2) a row whose
// estimated host or device memory (core/plan/memory_estimate.h) with them is more than there is;
// `run` calls it through check_before_run, `calibrate` directly (its twins need what `run` needs
// for the same forms).
void check_memory(std::vector<SelectedRow>& rows, const RunOptions& opt, const kernels::Backend& backend,
                  const RunGuard& guard);

// Refuses (ConfigError, exit 2) an output that cannot be written, naming the flag, the path and
// why: a file path that is a folder (folder = false) or a folder path that is a file, a parent
// that cannot be made (a part of it is a file), or a folder this process cannot write in (a
// probe file is created and removed there). A missing parent that can be made is fine.
void check_output_path(const std::string& path, const char* flag, bool folder);

// "auto" -> -1; "123", "64G", "1.5GiB", "512MB" -> bytes (K/M/G/T/P are powers of 1024).
// Throws ConfigError naming the option.
int64_t parse_bytes(const std::string& text, const char* option);

// --head-group of run, calibrate and plan: "auto" -> kHeadGroupAuto, "never" -> kHeadGroupNever,
// else a byte count (parse_bytes). head_group_help() is its --help text.
int64_t parse_head_group(const std::string& text);
std::string head_group_help();

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
int64_t host_memory_available();

// Bytes an unprivileged process may still write in `folder` (statvfs); 0 when it cannot be read.
int64_t free_disk_bytes(const std::string& folder);

// --reference-spill of run, calibrate and plan: "auto" -> kReferenceSpillAuto, "never" -> -1, else
// a byte count (parse_bytes); reference_spill_help() is its --help text.
int64_t parse_reference_spill(const std::string& text);
std::string reference_spill_help();

// --reference-group of run, calibrate and plan: "auto" -> kReferenceGroupAuto, "never" ->
// kReferenceGroupNever,
// else a byte count (parse_bytes); reference_group_help() is its --help text.
int64_t parse_reference_group(const std::string& text);
std::string reference_group_help();

// --keep-inputs of run, calibrate and plan ("auto" or "never"): its --help text.
std::string keep_inputs_help();

// The FP64 reference's and the inputs' memory flags that run, calibrate and plan share, in this
// order: --reference-spill, --max-spill-disk, --reference-group, --keep-inputs.
struct MemoryFlags {
  std::string reference_spill = "auto", max_spill_disk = "auto", reference_group = "auto", keep_inputs = "auto";
};
// Registers them on `sub`; `as_run` is appended to their help texts (calibrate and plan: " (as run ...)").
void add_memory_flags(CLI::App* sub, MemoryFlags& f, bool as_run);
// Sets opt's reference_spill_bytes, reference_group_bytes and keep_inputs from them.
void apply_memory_flags(const MemoryFlags& f, RunOptions& opt);

// --max-spill-disk of run, calibrate and plan: the room for spilled reference slices (BYTES, auto:
// the free space of the spill folder, shared by `procs` processes of this host; 0: no check) and
// where that number comes from (for messages). max_spill_disk_help() is its --help text.
struct SpillRoom {
  int64_t bytes = 0;
  std::string source;
};
SpillRoom spill_room(const std::string& max_spill_disk, int procs);
std::string max_spill_disk_help();

}  // namespace kcp::app
