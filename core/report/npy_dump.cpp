#include "core/report/npy_dump.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

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

namespace {
// Removes an earlier dump from dir (its manifest and the files it lists), or refuses a folder
// that holds anything else.
void clear_earlier_dump(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  KCP_REQUIRE(fs::is_directory(dir, ec), "--dump {}: not a folder", dir);
  std::set<std::string> listed;
  std::ifstream mf(dir + "/manifest.json");
  if (mf) {
    const nlohmann::json m = nlohmann::json::parse(mf, nullptr, false);
    if (m.is_object() && m.value("schema", "") == "kcpbench.dump/1" && m.contains("files") && m["files"].is_array()) {
      listed.insert("manifest.json");
      for (const auto& f : m["files"])
        if (f.is_object() && f.contains("file") && f["file"].is_string()) listed.insert(f["file"].get<std::string>());
    }
  }
  std::vector<fs::path> old;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    KCP_REQUIRE(listed.count(name) && de.is_regular_file(),
                "--dump {}: the folder is not empty and {} is not a file of an earlier dump's manifest.json; "
                "give an empty or new folder (only an earlier dump's listed files are cleared)",
                dir, name);
    old.push_back(de.path());
  }
  if (ec) raise_api_error("I/O", "directory_iterator", ec.value(), ec.message() + ": " + dir, __FILE__, __LINE__);
  for (const auto& p : old) {
    fs::remove(p, ec);
    if (ec) raise_api_error("I/O", "remove", ec.value(), ec.message() + ": " + p.string(), __FILE__, __LINE__);
  }
}
}  // namespace

Dumper::Dumper(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  clear_earlier_dump(dir_);
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

void Dumper::describe_row(const std::string& row, const nlohmann::json& info) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  rows_[row] = info;
}

void Dumper::write_manifest(const nlohmann::json& context) const {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const nlohmann::json verdicts = {
      {"loss",
       "L = sum over sequences of sum(o * dO) + sum(ht * dht) (the ht term only where the row has dht); "
       "every gradient is dL/d(input) of that L (docs/algorithm.md 1.1)"},
      {"max_abs",
       "max |backend - reference| over the elements whose reference is finite, over every rank "
       "(core/compare/compare.h)"},
      {"rel_rms", "sqrt(sum (backend - reference)^2 / sum reference^2) over the same elements"},
      {"states",
       "ht / dh0 are [local pieces, HV, K, V]; a reference NaN marks a piece without a final / initial "
       "state (it continues on the next / previous rank) and is not judged"},
      {"boundary",
       "h_entry / dh_exit are [local segments, HV, K, V] of the form's segments (the reference is per form); "
       "a reference NaN marks a segment boundary that carries no state (a sequence's start / end) and is not "
       "judged"},
      {"params",
       "dA_log / ddt_bias: the backend's file holds the total over all sequences (the same on every "
       "rank); each rank's reference file holds the sum over the sequences that start on that rank, "
       "so the reference total is the sum of the reference files over ranks"},
      {"inputs",
       "q, k, v, g, beta, dO per rank over its tokens; h0, dht [sequences, HV, K, V], A_log [HV] and "
       "dt_bias [HV, gate width] once (rank 0), the same for every rank"}};
  // Token-major layouts of docs/algorithm.md 0 (T: the rank's tokens, the file's "tokens" range).
  const nlohmann::json layouts = {{"q, k, dq, dk", "[T, H, K]"},
                                  {"v, dO, o, dv", "[T, HV, V]"},
                                  {"g, dg", "[T, HV, gate width] (gate width: 1 for GDN, K for KDA)"},
                                  {"beta, dbeta", "[T, HV]"},
                                  {"ht, dh0", "[local pieces, HV, K, V], the state key-major"},
                                  {"h_entry, dh_exit", "[local segments, HV, K, V], the state key-major"},
                                  {"h0, dht", "[sequences, HV, K, V]"},
                                  {"A_log, dA_log", "[HV]"},
                                  {"dt_bias", "[HV, gate width]"},
                                  {"ddt_bias", "[HV * gate width]"}};
  write_json_atomic(dir_ + "/manifest.json", {{"schema", "kcpbench.dump/1"},
                                              {"context", context},
                                              {"layouts", layouts},
                                              {"verdicts", verdicts},
                                              {"rows", rows_},
                                              {"files", entries_}});
}

}  // namespace kcp
