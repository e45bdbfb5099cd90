#include "core/kcp/external_backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "core/kcp/external_process.h"
#include "core/report/npy_dump.h"
#include "core/util/error.h"

namespace kcp {

namespace {

namespace fs = std::filesystem;

constexpr int kLogTailLines = 20;
constexpr size_t kLogTailBytes = 4096;  // of the tail kept in the entry (a progress bar can be one long line)

// A tensor of the protocol: its name and its dimensions by symbol (T, N, H, HV, K, V).
struct Spec {
  std::string name;
  std::vector<std::string> dims;
};

std::vector<int64_t> shape_of(const RowConfig& row, const Spec& s) {
  const std::map<std::string, int64_t> size = {
      {"T", row.total_tokens()}, {"N", row.sequences()}, {"H", row.H}, {"HV", row.HV}, {"K", row.K}, {"V", row.V}};
  std::vector<int64_t> out;
  for (const auto& d : s.dims) out.push_back(size.at(d));
  return out;
}

std::string layout_of(const Spec& s) { return fmt::format("[{}]", fmt::join(s.dims, ", ")); }

// The gate's per-token dims: GDN one value per value head, KDA one per key channel.
std::vector<std::string> gate_dims(const RowConfig& row, bool per_token) {
  std::vector<std::string> d = per_token ? std::vector<std::string>{"T", "HV"} : std::vector<std::string>{"HV"};
  if (row.op == Op::Kda) d.push_back("K");
  return d;
}

std::vector<Spec> input_specs(const RowConfig& row) {
  std::vector<Spec> s = {{"q", {"T", "H", "K"}},      {"k", {"T", "H", "K"}}, {"v", {"T", "HV", "V"}},
                         {"g", gate_dims(row, true)}, {"beta", {"T", "HV"}},  {"dO", {"T", "HV", "V"}}};
  if (row.initial_state) s.push_back({"h0", {"N", "HV", "K", "V"}});
  if (row.dht) s.push_back({"dht", {"N", "HV", "K", "V"}});
  if (row.A_log) s.push_back({"A_log", {"HV"}});
  if (row.dt_bias) s.push_back({"dt_bias", gate_dims(row, false)});
  return s;
}

const std::vector<float>& input_data(const RowInputs& in, const std::string& name) {
  const std::map<std::string, const std::vector<float>*> m = {
      {"q", &in.q},   {"k", &in.k},   {"v", &in.v},     {"g", &in.g},         {"beta", &in.beta},
      {"dO", &in.dO}, {"h0", &in.h0}, {"dht", &in.dht}, {"A_log", &in.A_log}, {"dt_bias", &in.dt_bias}};
  return *m.at(name);
}

// The outputs the row is judged on, in the protocol's shapes (h_entry / dh_exit are not asked).
std::vector<Spec> output_specs(const RowConfig& row) {
  std::vector<Spec> s;
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (!row_has(row, t) || place_of(t) == TensorPlace::Boundary) continue;
    const std::string n = to_string(t);
    if (place_of(t) == TensorPlace::State) s.push_back({n, {"N", "HV", "K", "V"}});
    if (t == ResultTensor::o || t == ResultTensor::dv) s.push_back({n, {"T", "HV", "V"}});
    if (t == ResultTensor::dq || t == ResultTensor::dk) s.push_back({n, {"T", "H", "K"}});
    if (t == ResultTensor::dg) s.push_back({n, gate_dims(row, true)});
    if (t == ResultTensor::dbeta) s.push_back({n, {"T", "HV"}});
    if (t == ResultTensor::dA_log) s.push_back({n, {"HV"}});
    if (t == ResultTensor::ddt_bias) s.push_back({n, gate_dims(row, false)});
  }
  return s;
}

nlohmann::json gate_json(const RowConfig& row) {
  nlohmann::json g;
  g["form"] = row.gate == GateForm::Direct ? "direct" : row.gate == GateForm::Softplus ? "softplus" : "lower_bound";
  g["A_log"] = row.A_log;
  g["dt_bias"] = row.dt_bias;
  if (row.gate == GateForm::Direct) g["decay"] = "a = g (natural-log decay per token)";
  if (row.gate == GateForm::Softplus)
    g["decay"] = "a = -exp(A_log[j]) * softplus(g + dt_bias), softplus(x) = max(x, 0) + log1p(exp(-|x|))";
  if (row.gate == GateForm::LowerBound) {
    g["lower_bound"] = row.lower_bound;
    g["decay"] =
        "a = lower_bound * sigmoid(exp(A_log[j]) * (g + dt_bias)) (without A_log: lower_bound * sigmoid(g + dt_bias))";
  }
  if (!row.A_log) g["decay_note"] = "without A_log, exp(A_log) is 1; without dt_bias, dt_bias is 0";
  return g;
}

}  // namespace

nlohmann::json external_manifest(const RowConfig& row, const std::string& row_digest, double time_limit_s) {
  nlohmann::json m;
  m["protocol"] = kExternalProtocol;
  m["op"] = row.op == Op::Kda ? "kda" : "gdn";
  m["row"] = row.name;
  m["row_digest"] = row_digest;
  m["seed"] = row.seed;
  std::vector<int64_t> cu = {0};
  for (int64_t L : row.seqlens) cu.push_back(cu.back() + L);
  m["shape"] = {
      {"T", row.total_tokens()}, {"N", row.sequences()}, {"H", row.H}, {"HV", row.HV}, {"K", row.K}, {"V", row.V}};
  m["cu_seqlens"] = cu;
  m["dtype"] = row.dtype == DType::FP16 ? "fp16" : "bf16";
  m["storage"] =
      "inputs are float32 .npy files (little-endian, C order); q, k, v, beta, dO and the gate input g hold values "
      "rounded once to dtype (exactly representable in it: a cast to dtype is lossless; kernels keep gates in "
      "float32); A_log, dt_bias, h0 and dht are float32 values";
  m["scale"] = row.scale > 0 ? row.scale : 1.0 / std::sqrt(double(row.K));
  m["qk_l2norm"] = row.qk_l2norm;
  m["qk_l2norm_formula"] = "x / sqrt(sum(x^2) + 1e-6) per (token, head) row of length K, before everything else";
  m["gva"] =
      "value head j uses q/k head floor(j / (HV / H)); dq and dk of a q/k head sum over the value heads that use it";
  m["gate"] = gate_json(row);
  m["initial_state"] = row.initial_state;
  m["final_state"] = row.final_state;
  m["dht"] = row.dht;
  m["recurrence"] =
      "per sequence and value head j: S_0 = h0 (or 0); S_t = (I - beta_t k_t k_t^T) Diag(exp(a_t)) S_{t-1} + "
      "beta_t k_t v_t^T; o_t = scale * S_t^T q_t; ht = S_T (docs/algorithm.md 1.1)";
  m["loss"] = row.dht ? "sum(o * dO) + sum(ht * dht)" : "sum(o * dO)";
  m["time_limit_s"] = time_limit_s;
  for (const Spec& s : input_specs(row))
    m["inputs"][s.name] = {{"file", "inputs/" + s.name + ".npy"},
                           {"shape", shape_of(row, s)},
                           {"layout", layout_of(s)},
                           {"dtype", "float32"}};
  for (const Spec& s : output_specs(row))
    m["outputs"][s.name] = {{"file", "outputs/" + s.name + ".npy"},
                            {"shape", shape_of(row, s)},
                            {"layout", layout_of(s)},
                            {"dtype", "float32 or float64"}};
  m["outputs_note"] =
      "every output listed is required; dq and dk are the gradients w.r.t. the q and k inputs as given (before "
      "the L2 norm when qk_l2norm is on); dg is the gradient w.r.t. the gate input g as given; dA_log and "
      "ddt_bias sum over all tokens (dA_log of KDA also over the K channels); dh0 is dL/dh0; a missing or "
      "malformed file fails the entry";
  return m;
}

}  // namespace kcp

namespace kcp {

namespace {

// A float .npy file as read: its dtype text, shape and values. error: why it cannot be used.
struct NpyFile {
  std::string descr, error;
  bool fortran = false;
  std::vector<int64_t> shape;
  std::vector<double> data;
};

// The value of `key` in a .npy header dict ("'descr': '<f4', ..."): a tuple or list up to its
// closing bracket, else up to the next ',' or '}'.
std::string header_field(const std::string& h, const std::string& key) {
  const size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t b = h.find(':', k) + 1;
  while (b < h.size() && h[b] == ' ') ++b;
  if (b >= h.size()) return "";
  const size_t e = h[b] == '(' ? h.find(')', b) : h[b] == '[' ? h.rfind(']') : h.find_first_of(",}", b) - 1;
  return e == std::string::npos || e < b ? h.substr(b) : h.substr(b, e - b + 1);
}

// The dimensions of a shape tuple "(512, 4, 64)"; false when a number is too long to be one.
bool parse_shape(const std::string& t, std::vector<int64_t>& s) {
  std::string num;
  for (char c : t + ")") {
    if (c >= '0' && c <= '9') {
      num += c;
    } else if (!num.empty()) {
      if (num.size() > 15) return false;
      s.push_back(std::stoll(num));
      num.clear();
    }
  }
  return true;
}

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Reads the first n bytes of `in` into out; false when the file is shorter.
bool read_exactly(std::ifstream& in, size_t n, std::string& out) {
  out.resize(n);
  in.read(out.data(), std::streamsize(n));
  return size_t(in.gcount()) == n;
}

// The header of a .npy file: dtype text, order, shape, and where the data starts; f.error says
// why the file cannot be used.
size_t read_npy_header(std::ifstream& in, NpyFile& f) {
  std::string lead, h;
  if (!read_exactly(in, 10, lead) || lead.compare(0, 6, "\x93NUMPY") != 0) {
    f.error = "is not a .npy file (no \\x93NUMPY magic)";
    return 0;
  }
  const int major = static_cast<unsigned char>(lead[6]);
  size_t hl = static_cast<unsigned char>(lead[8]) | size_t(static_cast<unsigned char>(lead[9])) << 8, head = 10;
  std::string more;
  if (major >= 2) {  // a 4-byte header length
    if (!read_exactly(in, 2, more)) more.assign(2, '\xff');
    hl |= size_t(static_cast<unsigned char>(more[0])) << 16 | size_t(static_cast<unsigned char>(more[1])) << 24;
    head = 12;
  }
  if (hl > (size_t(1) << 20) || !read_exactly(in, hl, h)) {
    f.error = "has a header longer than the file";
    return 0;
  }
  f.descr = header_field(h, "descr");
  f.fortran = header_field(h, "fortran_order").find("True") != std::string::npos;
  if (!parse_shape(header_field(h, "shape"), f.shape)) f.error = "has a shape with a dimension too large to read";
  return head + hl;
}

// Reads a little-endian float32 / float64 .npy (format 1.0, 2.0 or 3.0) of shape `want`: the
// header first, the data (exactly the bytes the shape needs) only when the file is a regular
// file of the expected dtype, order and shape, so a wrong file costs no more than its header and
// a directory, FIFO or device at the path is refused without being opened.
NpyFile read_npy(const std::string& path, const std::vector<int64_t>& want, const std::string& layout) {
  NpyFile f;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::is_regular_file(st)) {
    f.error = ec ? "cannot be read: " + ec.message() : "is not a regular file (a directory, FIFO or device)";
    return f;
  }
  const uintmax_t size = fs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) {
    f.error = "cannot be opened";
    return f;
  }
  const size_t data_at = read_npy_header(in, f);
  const bool f4 = f.descr == "'<f4'", f8 = f.descr == "'<f8'";
  if (f.error.empty() && !f4 && !f8)
    f.error = fmt::format("has dtype {}, expected float32 ('<f4') or float64 ('<f8')", f.descr);
  if (f.error.empty() && f.fortran) f.error = "is in Fortran order, expected C order";
  if (f.error.empty() && f.shape != want)
    f.error = fmt::format("has shape {}, expected {} ({})", shape_text(f.shape), shape_text(want), layout);
  if (!f.error.empty()) return f;
  size_t n = 1;
  for (int64_t d : want) n *= size_t(d);
  const size_t item = f4 ? 4 : 8, have = size - data_at;
  std::string bytes;
  if (have < n * item || !read_exactly(in, n * item, bytes)) {
    f.error = fmt::format("holds {} bytes of data, its shape needs {}", have, n * item);
    return f;
  }
  f.data.resize(n);
  size_t beyond = 0;  // finite float64 values that float32 cannot hold
  for (size_t i = 0; i < n; ++i) {
    if (f4) {
      float x;
      std::memcpy(&x, bytes.data() + 4 * i, 4);
      f.data[i] = x;
    } else {
      std::memcpy(&f.data[i], bytes.data() + 8 * i, 8);
      beyond += std::isfinite(f.data[i]) && std::fabs(f.data[i]) > std::numeric_limits<float>::max();
    }
  }
  if (beyond > 0)
    f.error =
        fmt::format("holds {} finite value(s) beyond the float32 range (the results are judged in float32)", beyond);
  return f;
}

// The protocol's values of a tensor in the rank layout (State tensors: the sequences of the plan's
// pieces, [pieces, HV, K, V]; the others as they are).
std::vector<float> to_rank_layout(const RowConfig& row, ResultTensor t, const std::vector<double>& v,
                                  const RankPlan& rp) {
  if (place_of(t) != TensorPlace::State) return std::vector<float>(v.begin(), v.end());
  const size_t state = size_t(row.HV) * size_t(row.K) * size_t(row.V);
  std::vector<float> out;
  for (const Piece& pc : rp.pieces)
    out.insert(out.end(), v.begin() + long(size_t(pc.seq) * state), v.begin() + long(size_t(pc.seq + 1) * state));
  return out;
}

// Reads every output the row judges into run.result; missing or malformed ones are listed.
void read_outputs(const RowConfig& row, const RankPlan& rp, ExternalRun& run) {
  const int64_t T = rp.tokens(), N = int64_t(rp.pieces.size()), S = int64_t(rp.segments.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  int found = 0;
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (row_has(row, t)) run.result[t].assign(size_t(result_elements(row, t, T, N, S)), float(nan));
  }
  for (const Spec& s : output_specs(row)) {
    const std::string file = "outputs/" + s.name + ".npy";
    const std::vector<int64_t> want = shape_of(row, s);
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(run.folder + "/" + file, ec))) {
      run.not_provided.push_back(s.name);
      run.problems.push_back(fmt::format("{}: not provided (the adapter did not write {})", s.name, file));
      continue;
    }
    ++found;
    const NpyFile f = read_npy(run.folder + "/" + file, want, layout_of(s));
    if (!f.error.empty()) {
      run.not_provided.push_back(s.name);
      run.problems.push_back(fmt::format("{}: {} {}", s.name, file, f.error));
      continue;
    }
    for (int i = 0; i < kResultTensorCount; ++i)
      if (s.name == kResultTensors[i]) run.result[result_tensor(i)] = to_rank_layout(row, result_tensor(i), f.data, rp);
  }
  if (found == 0) run.failure = "the adapter exited with status 0 but wrote no output file (outputs/*.npy)";
}

// A fresh folder for the row: ROOT/<row>_seed<seed>, emptied if an earlier run left it.
std::string fresh_folder(const ExternalKernel& k, const RowConfig& row) {
  const std::string dir = fmt::format("{}/{}_seed{}", k.root, row.name, row.seed);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir + "/inputs", ec);
  if (!ec) fs::create_directories(dir + "/outputs", ec);
  if (ec) KCP_THROW(ApiError, "external backend: cannot create the folder {}: {}", dir, ec.message());
  return dir;
}

void write_inputs(const std::string& dir, const RowConfig& row, const std::string& digest, const RowInputs& in,
                  double limit_s) {
  for (const Spec& s : input_specs(row)) {
    const std::vector<float>& v = input_data(in, s.name);
    const std::vector<int64_t> shape = shape_of(row, s);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    KCP_CHECK(int64_t(v.size()) == n, "input {}: {} values, shape {} needs {}", s.name, v.size(), shape_text(shape), n);
    write_npy(dir + "/inputs/" + s.name + ".npy", v.data(), shape);
  }
  std::ofstream m(dir + "/manifest.json");
  m << external_manifest(row, digest, limit_s).dump(1) << "\n";
  if (!m) KCP_THROW(ApiError, "external backend: cannot write {}/manifest.json", dir);
}

}  // namespace

ExternalRun run_external(const ExternalKernel& kernel, const RowConfig& row, const std::string& row_digest,
                         const RowInputs& in, const RankPlan& rp) {
  KCP_CHECK(in.t_begin == 0 && in.t_end == row.total_tokens(), "external inputs must cover every token, got [{}, {})",
            in.t_begin, in.t_end);
  ExternalRun run;
  run.folder = fresh_folder(kernel, row);
  run.log_file = run.folder + "/adapter.log";
  write_inputs(run.folder, row, row_digest, in, kernel.time_limit_s);
  const ProcessOutcome p = run_process(kernel.command, run.folder, run.log_file, kernel.time_limit_s);
  run.seconds = p.seconds;
  run.exit_status = p.exit_status;
  run.timed_out = p.timed_out;
  run.log_tail = file_tail(run.log_file, kLogTailLines, kLogTailBytes);
  const bool ok = p.started && !p.timed_out && !p.signaled && p.error.empty() && p.exit_status == 0;
  if (!ok) {
    run.failure = fmt::format("the adapter failed: {} (log: {})", describe(p, kernel.time_limit_s), run.log_file);
    if (p.timed_out) run.failure = "deadline passed: " + run.failure;
  } else {
    read_outputs(row, rp, run);
  }
  if (!run.failure.empty() && !run.log_tail.empty()) run.failure += "; log tail:\n" + run.log_tail;
  return run;
}

nlohmann::json ExternalRun::to_json(const std::string& command) const {
  nlohmann::json j;
  j["protocol"] = kExternalProtocol;
  j["command"] = command;
  j["folder"] = folder;
  j["log"] = log_file;
  j["exit_status"] = exit_status;
  j["timed_out"] = timed_out;
  j["seconds"] = seconds;
  j["not_provided"] = not_provided;
  j["problems"] = problems;
  j["log_tail"] = log_tail;
  return j;
}

}  // namespace kcp
