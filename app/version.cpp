#include <fmt/format.h>

#include "app/commands.h"
#include "core/report/report.h"

namespace kcp::app {
std::string version_text() {
  const auto b = build_info();
  auto show = [](const nlohmann::json& v) { return v.is_null() ? std::string("not built") : v.get<std::string>(); };
  return fmt::format("kcpbench {} (git {}{})\nbuild: {} {}\nCUDA: {}\nNCCL: {}\nMPI: {} (standard version)\n", b["version"].get<std::string>(),
                     b["git_sha"].get<std::string>(), b["git_dirty"].get<bool>() ? ", dirty" : "",
                     b["build_type"].get<std::string>(), b["compiler"].get<std::string>(), show(b["cuda"]),
                     show(b["nccl"]), show(b["mpi"]));
}
}  // namespace kcp::app
