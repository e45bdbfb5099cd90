// What `kcpbench run` checks before any row runs (ConfigError, exit 2): an injected hang needs a
// finite deadline (and the run says how long it will hang), and every selected row must fit in the
// host and device memory at hand (core/plan/memory_estimate.h), unless --max-host-mem /
// --max-device-mem say how much there is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/kcp/row_runner.h"
#include "kernels/api/backend.h"

namespace kcp::app {

struct RunGuard {
  double deadline = 0;          // seconds; <= 0: none
  bool deadline_given = false;  // --deadline on the command line (else the default)
  std::string max_host_mem = "auto", max_device_mem = "auto";
  bool use_mpi = false;  // one rank per process (else every row's ranks are threads of this one)
  int threads = 0;       // --threads (0: default)
};

void check_before_run(const std::vector<SelectedRow>& rows, const RunOptions& opt, const kernels::Backend& backend,
                      const RunGuard& guard);

// "auto" -> -1; "123", "64G", "1.5GiB", "512MB" -> bytes (K/M/G/T/P are powers of 1024).
// Throws ConfigError naming the option.
int64_t parse_bytes(const std::string& text, const char* option);

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
int64_t host_memory_available();

}  // namespace kcp::app
