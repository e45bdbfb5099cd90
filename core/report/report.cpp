#include "core/report/report.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "core/util/error.h"
#include "kcp/config.h"
#include "kcp/git_info.h"
#include "reference/reference.h"

namespace kcp {

BuildInfo build_info() {
  BuildInfo b;
  b.version = KCP_VERSION;
  b.git_sha = KCP_GIT_SHA;
  b.git_dirty = KCP_GIT_DIRTY != 0;
  b.build_type = KCP_BUILD_TYPE;
  b.compiler = KCP_CXX_COMPILER;
  if (KCP_ENABLE_CUDA) b.cuda = KCP_CUDA_VERSION;
  if (KCP_ENABLE_NCCL) b.nccl = KCP_NCCL_VERSION;
  if (KCP_ENABLE_MPI) b.mpi = KCP_MPI_VERSION;
  b.reference_simd = ref::simd_description();
  return b;
}

std::string utc_now(const char* format) {
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  return std::string(buf, std::strftime(buf, sizeof(buf), format, &tm));
}

Context context_block(const RunContext& ctx) {
  Context c;
  c.schema_version = kResultsSchema;
  c.build = build_info();
  c.date = utc_now("%Y-%m-%dT%H:%M:%SZ");
  c.command_line = ctx.argv;
  c.world_size = ctx.world;
  c.launch_mode = ctx.launch_mode;
  c.comm = ctx.comm;
  c.backend = ctx.backend;
  c.backend_device = ctx.backend_device;
  c.device_class = ctx.device_class;
  c.devices = ctx.devices;
  c.seeds = ctx.seeds;
  c.row_set = {ctx.row_set, ctx.row_set_file, ctx.row_set_digest};
  return c;
}

void write_json_atomic(const std::string& path, const nlohmann::json& doc) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec)
      raise_api_error("I/O", "create_directories", ec.value(), ec.message() + ": " + target.parent_path().string(),
                      __FILE__, __LINE__);
  }
  const std::string tmp = path + ".tmp";
  // A failed write or rename removes the temp file (no stray .tmp is left beside the target).
  auto fail = [&](const char* what, int err, const std::string& file) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    raise_api_error("I/O", what, err, std::strerror(err) + std::string(": ") + file, __FILE__, __LINE__);
  };
  {
    std::ofstream out(tmp);
    if (!out) fail("open", errno, tmp);
    out << doc.dump(2) << "\n";
    out.flush();
    if (!out) fail("write", errno, tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("rename", errno, path);
}

}  // namespace kcp
