// The JSON report (`kcpbench.results/1`, docs/design.md 8): a context block that makes every result
// reproducible (build, devices, world, command line, seeds, row-set digest), then one entry per
// (row, form). Rank 0 writes it to a temporary file beside the target and renames it, so a
// reader never sees half a report.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/report/results.h"

namespace kcp {

inline constexpr const char* kResultsSchema = "kcpbench.results/1";

struct RunContext {
  std::vector<std::string> argv;  // the full command line
  int world = 1;
  std::string launch_mode;           // "threads" or "mpirun"
  std::string comm;                  // "local", "mpi", "nccl"
  std::string backend;               // "cpu", "cuda"
  std::string backend_device;        // the backend's device description
  std::string device_class;          // planning class
  std::vector<std::string> devices;  // one per rank: "cpu" or "NVIDIA H200 (132 SMs)"
  std::string row_set, row_set_file, row_set_digest;
  std::vector<uint64_t> seeds;  // the seeds of the rows run
};

// Build facts: version, git sha (+ dirty), build type, compiler, CUDA/NCCL/MPI availability.
BuildInfo build_info();
// The current UTC time through strftime's `format` (e.g. "%Y-%m-%dT%H:%M:%SZ").
std::string utc_now(const char* format);
// The context of a results document: the run's facts, the build, the schema and the date (now).
Context context_block(const RunContext& ctx);

// Writes `doc` to `path` atomically (temp file + rename). Throws ApiError naming the path.
void write_json_atomic(const std::string& path, const nlohmann::json& doc);

}  // namespace kcp
