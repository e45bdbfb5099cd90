#include "core/compare/reference_spill.h"

#include "core/compare/compare.h"  // scatter_heads

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/util/error.h"

namespace kcp {

std::string reference_spill_folder() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? std::string(t) : std::string("/tmp");
}

ReferenceSpill::ReferenceSpill() : dir_(reference_spill_folder()) {
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

namespace {
// Every byte of [p, p + left) through io (pwrite or pread) at file offset `at`, retried on EINTR;
// an error or a short transfer raises ApiError with `why` (`end`: the errno of a short one).
template <class Io, class Ptr>
void transfer_all(Io io, const char* name, int end, int fd, Ptr p, size_t left, off_t at, const std::string& why) {
  while (left > 0) {
    const ssize_t n = io(fd, p, left, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) raise_api_error("I/O", name, n < 0 ? errno : end, why, __FILE__, __LINE__);
    p += n;
    left -= static_cast<size_t>(n);
    at += n;
  }
}
}  // namespace

void ReferenceSpill::write_at(const std::vector<double>& v, int64_t at) const {
  transfer_all(::pwrite, "pwrite", ENOSPC, fd_, reinterpret_cast<const char*>(v.data()), v.size() * sizeof(double),
               static_cast<off_t>(at),
               "cannot write the FP64 reference slice to a temporary file in " + dir_ +
                   " (set TMPDIR to a folder with room for it)");
}

void ReferenceSpill::read_at(double* dst, int64_t count, int64_t at) const {
  transfer_all(::pread, "pread", EIO, fd_, reinterpret_cast<char*>(dst), static_cast<size_t>(count) * sizeof(double),
               static_cast<off_t>(at), "cannot read the FP64 reference slice back from its temporary file in " + dir_);
}

void ReferenceSpill::put(ResultTensor t, std::vector<double>& v) {
  put_part(t, v, 1, 1, static_cast<int64_t>(v.size()), 0, 1);
}

void ReferenceSpill::put_part(ResultTensor t, std::vector<double>& v, int64_t rows, int64_t heads, int64_t width,
                              int64_t first, int64_t count) {
  KCP_CHECK(static_cast<int64_t>(v.size()) == rows * count * width && first >= 0 && first + count <= heads,
            "reference part of {} values for heads [{}, {}) of {} x {} x {}", v.size(), first, first + count, rows,
            heads, width);
  Layout& l = layout_[static_cast<size_t>(t)];
  if (l.parts.empty()) l = Layout{rows, heads, width, {}};
  KCP_CHECK(l.rows == rows && l.heads == heads && l.width == width, "reference parts of {} differ in shape",
            to_string(t));
  write_at(v, end_);
  l.parts.push_back(Part{first, count, end_});
  end_ += static_cast<int64_t>(v.size() * sizeof(double));
  std::vector<double>().swap(v);
}

std::vector<double> ReferenceSpill::load_tensor(ResultTensor t) const {
  const Layout& l = layout_[static_cast<size_t>(t)];
  std::vector<double> v(static_cast<size_t>(l.parts.empty() ? 0 : l.rows * l.heads * l.width));
  if (l.parts.size() == 1 && l.parts[0].count == l.heads) {  // whole: straight into place
    read_at(v.data(), static_cast<int64_t>(v.size()), l.parts[0].offset);
    return v;
  }
  int64_t heads = 0;
  for (const Part& p : l.parts) heads += p.count;
  KCP_CHECK(heads == l.heads || l.parts.empty(), "reference of {}: {} of {} heads were put", to_string(t), heads,
            l.heads);
  std::vector<double> part;
  for (const Part& p : l.parts) {
    const int64_t run = p.count * l.width;
    part.resize(static_cast<size_t>(l.rows * run));
    read_at(part.data(), l.rows * run, p.offset);
    scatter_heads(part, HeadPart{l.rows, l.heads, l.width, p.first, p.count}, v);
  }
  return v;
}

std::vector<double> ReferenceSpill::load_part(ResultTensor t, const HeadPart& at) const {
  Layout l = layout_[static_cast<size_t>(t)];
  if (l.parts.empty()) return {};
  const int64_t first = at.first, count = at.count;
  KCP_CHECK(l.rows * l.heads * l.width == at.rows * at.heads * at.width && first >= 0 && count > 0 &&
                first + count <= at.heads,
            "reference of {}: heads [{}, {}) of {} x {} x {} asked of a tensor of {} x {} x {}", to_string(t), first,
            first + count, at.rows, at.heads, at.width, l.rows, l.heads, l.width);
  if (l.heads != at.heads) {  // put whole (put): one part of every head, in the caller's shape
    KCP_CHECK(l.parts.size() == 1 && l.parts[0].count == l.heads, "reference of {}: {} parts of {} heads, asked {}",
              to_string(t), l.parts.size(), l.heads, at.heads);
    l = Layout{at.rows, at.heads, at.width, {Part{0, at.heads, l.parts[0].offset}}};
  }
  std::vector<double> v(static_cast<size_t>(l.rows * count * l.width));
  std::vector<double> block;
  for (const Part& p : l.parts) {
    const int64_t lo = std::max(first, p.first), hi = std::min(first + count, p.first + p.count);
    if (lo >= hi) continue;
    if (p.first == first && p.count == count) {  // the part is the range: straight into place
      read_at(v.data(), static_cast<int64_t>(v.size()), p.offset);
      continue;
    }
    // Blocks of whole rows of the part, then each row's heads of the range into place.
    const int64_t row_n = p.count * l.width, rows = std::max<int64_t>(1, kReadBlockBytes / (8 * row_n));
    for (int64_t r0 = 0; r0 < l.rows; r0 += rows) {
      const int64_t n = std::min(rows, l.rows - r0);
      block.resize(static_cast<size_t>(n * row_n));
      read_at(block.data(), n * row_n, p.offset + 8 * r0 * row_n);
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(block.begin() + r * row_n + (lo - p.first) * l.width, (hi - lo) * l.width,
                    v.begin() + ((r0 + r) * count + (lo - first)) * l.width);
    }
  }
  return v;
}

RankReference ReferenceSpill::load() const {
  RankReference r;
  for (int i = 0; i < kResultTensorCount; ++i) r.tensors[i] = load_tensor(result_tensor(i));
  return r;
}

}  // namespace kcp
