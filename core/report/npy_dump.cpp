#include "core/report/npy_dump.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/report/report.h"
#include "core/util/error.h"

namespace kcp {

namespace {
template <class T>
void write_npy_impl(const std::string& path, const T* data, const std::vector<int64_t>& shape, const char* descr) {
  std::string dims;
  int64_t n = 1;
  for (auto d : shape) {
    dims += std::to_string(d) + ",";
    n *= d;
  }
  if (shape.size() > 1) dims.pop_back();  // (3,) for one dimension, (3,4) otherwise
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, dims);
  // magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, ending in \n
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) raise_api_error("I/O", "open", errno, std::strerror(errno) + (": " + path), __FILE__, __LINE__);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(reinterpret_cast<const char*>(magic), 8);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  const unsigned char hlb[2] = {static_cast<unsigned char>(hl & 0xff), static_cast<unsigned char>(hl >> 8)};
  f.write(reinterpret_cast<const char*>(hlb), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
  if (!f) raise_api_error("I/O", "write", errno, std::strerror(errno) + (": " + path), __FILE__, __LINE__);
}
}  // namespace

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_npy_impl(path, data, shape, "<f4");
}
void write_npy(const std::string& path, const double* data, const std::vector<int64_t>& shape) {
  write_npy_impl(path, data, shape, "<f8");
}

Dumper::Dumper(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) raise_api_error("I/O", "create_directories", ec.value(), ec.message() + ": " + dir_, __FILE__, __LINE__);
}

template <class T>
void Dumper::add(const std::string& row, const std::string& form, int rank, const std::string& kind,
                 const std::string& tensor, const std::vector<T>& data, const std::vector<int64_t>& shape,
                 int64_t t_begin, int64_t t_end) {
  if (!enabled() || data.empty()) return;
  std::string safe_form = form;
  for (char& c : safe_form)
    if (c == '/' || c == '=') c = '_';
  const std::string file = fmt::format("{}-{}-r{}-{}-{}.npy", row, safe_form, rank, kind, tensor);
  write_npy(dir_ + "/" + file, data.data(), shape);
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({{"row", row},
                      {"form", form},
                      {"rank", rank},
                      {"kind", kind},
                      {"tensor", tensor},
                      {"shape", shape},
                      {"dtype", sizeof(T) == 4 ? "float32" : "float64"},
                      {"tokens", {t_begin, t_end}},
                      {"file", file}});
}
template void Dumper::add<float>(const std::string&, const std::string&, int, const std::string&, const std::string&,
                                 const std::vector<float>&, const std::vector<int64_t>&, int64_t, int64_t);
template void Dumper::add<double>(const std::string&, const std::string&, int, const std::string&, const std::string&,
                                  const std::vector<double>&, const std::vector<int64_t>&, int64_t, int64_t);

void Dumper::write_manifest(const nlohmann::json& context) const {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  write_json_atomic(dir_ + "/manifest.json",
                    {{"schema", "kcpbench.dump/1"}, {"context", context}, {"files", entries_}});
}

}  // namespace kcp
