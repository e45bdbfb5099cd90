// --dump DIR: writes inputs, the FP64 reference and the backend's outputs and gradients of the
// selected rows and forms as NumPy .npy files, plus manifest.json describing every file (row,
// form, rank, tensor, kind, shape, dtype, global token range), so a failure can be taken apart
// in Python: np.load(DIR + "/" + entry["file"]). The manifest also states, per row, the shape,
// scale, gate and loss, and how each verdict's metrics follow from the files, so every verdict
// can be recomputed outside kcpbench (tests/scripts/dump_recompute_test.py does).
//
// DIR must be empty or new, or hold only an earlier dump (its manifest.json and the files that
// manifest lists): those files are removed first. Anything else in DIR is refused (ConfigError,
// exit 2, naming DIR and the file), so no stale .npy file is mixed with a new dump.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kcp {

// Writes one little-endian .npy file (format 1.0, C order). Throws ApiError on I/O failure.
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void write_npy(const std::string& path, const double* data, const std::vector<int64_t>& shape);

// Collects files from every rank thread and writes the manifest once at the end.
class Dumper {
 public:
  explicit Dumper(std::string dir);
  bool enabled() const { return !dir_.empty(); }
  // kind: "input", "reference" or "backend"; tokens: the global token range ([-1, -1] for
  // tensors not indexed by token).
  template <class T>
  void add(const std::string& row, const std::string& form, int rank, const std::string& kind,
           const std::string& tensor, const std::vector<T>& data, const std::vector<int64_t>& shape, int64_t t_begin,
           int64_t t_end);
  // What the manifest says of a row (shape, scale, gate, loss; the same from every rank).
  void describe_row(const std::string& row, const nlohmann::json& info);
  void write_manifest(const nlohmann::json& context) const;

 private:
  std::string dir_;
  mutable std::mutex mutex_;
  nlohmann::json entries_ = nlohmann::json::array();
  nlohmann::json rows_ = nlohmann::json::object();
};

}  // namespace kcp
