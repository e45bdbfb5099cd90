#include "core/compare/reference_spill.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/util/error.h"

namespace kcp {

namespace {
std::string temp_folder() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? std::string(t) : std::string("/tmp");
}
}  // namespace

ReferenceSpill::ReferenceSpill() : dir_(temp_folder()) {
#ifdef O_TMPFILE
  fd_ = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
  if (fd_ < 0) {  // a file system without O_TMPFILE: make a file and remove its name at once
    std::string path = dir_ + "/kcpbench-reference-XXXXXX";
    fd_ = ::mkstemp(path.data());
    if (fd_ >= 0) ::unlink(path.c_str());
  }
  if (fd_ < 0)
    raise_api_error("I/O", "open", errno,
                    "cannot make a temporary file in " + dir_ +
                        " for the FP64 reference slice (set TMPDIR to a writable folder with room for it)",
                    __FILE__, __LINE__);
}

ReferenceSpill::~ReferenceSpill() {
  if (fd_ >= 0) ::close(fd_);
}

void ReferenceSpill::put(ResultTensor t, std::vector<double>& v) {
  const int i = static_cast<int>(t);
  const char* p = reinterpret_cast<const char*>(v.data());
  size_t left = v.size() * sizeof(double);
  off_t at = static_cast<off_t>(end_);
  while (left > 0) {
    const ssize_t n = ::pwrite(fd_, p, left, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      raise_api_error("I/O", "pwrite", n < 0 ? errno : ENOSPC,
                      "cannot write the FP64 reference slice to a temporary file in " + dir_ +
                          " (set TMPDIR to a folder with room for it)",
                      __FILE__, __LINE__);
    p += n;
    left -= static_cast<size_t>(n);
    at += n;
  }
  offset_[i] = end_;
  count_[i] = static_cast<int64_t>(v.size());
  has_[i] = true;
  end_ += count_[i] * int64_t(sizeof(double));
  std::vector<double>().swap(v);
}

RankReference ReferenceSpill::load() const {
  RankReference r;
  for (int i = 0; i < kResultTensorCount; ++i) {
    if (!has_[i]) continue;
    std::vector<double>& v = r.tensors[i];
    v.resize(static_cast<size_t>(count_[i]));
    char* p = reinterpret_cast<char*>(v.data());
    size_t left = v.size() * sizeof(double);
    off_t at = static_cast<off_t>(offset_[i]);
    while (left > 0) {
      const ssize_t n = ::pread(fd_, p, left, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        raise_api_error("I/O", "pread", n < 0 ? errno : EIO,
                        "cannot read the FP64 reference slice back from its temporary file in " + dir_, __FILE__,
                        __LINE__);
      p += n;
      left -= static_cast<size_t>(n);
      at += n;
    }
  }
  return r;
}

}  // namespace kcp
