#include <fmt/format.h>

#include "app/commands.h"
#include "core/report/report.h"

namespace kcp::app {
std::string version_text() {
  const auto b = build_info();
  auto show = [](const std::optional<std::string>& v) { return v ? *v : std::string("not built"); };
  return fmt::format(
      "kcpbench {} (git {}{})\nbuild: {} {}\nCUDA: {}\nNCCL: {}\nMPI: {} (standard version)\nFP64 reference: {}\n",
      b.version, b.git_sha, b.git_dirty ? ", dirty" : "", b.build_type, b.compiler, show(b.cuda), show(b.nccl),
      show(b.mpi), show(b.reference_simd));
}
}  // namespace kcp::app
