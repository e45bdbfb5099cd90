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
    g["decay"] = "a = lower_bound * sigmoid(exp(A_log[j]) * (g + dt_bias)) (without A_log: sigmoid(g + dt_bias))";
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
  m["gva"] = "value head j uses q/k head j / (HV / H)";
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
      "every output listed is required; dg is the gradient w.r.t. the gate input g as given; dA_log, ddt_bias "
      "sum over all tokens; dh0 is dL/dh0; a missing or malformed file fails the entry";
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

// The value of `key` in a .npy header dict ("'descr': '<f4', ..."), up to the next ',' or ')'.
std::string header_field(const std::string& h, const std::string& key) {
  const size_t k = h.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t b = h.find(':', k) + 1;
  while (b < h.size() && h[b] == ' ') ++b;
  const size_t e = h[b] == '(' ? h.find(')', b) + 1 : h.find_first_of(",}", b);
  return h.substr(b, e - b);
}

std::vector<int64_t> parse_shape(const std::string& t) {
  std::vector<int64_t> s;
  std::string num;
  for (char c : t) {
    if (c >= '0' && c <= '9') {
      num += c;
    } else if (!num.empty()) {
      s.push_back(std::stoll(num));
      num.clear();
    }
  }
  return s;
}

// Reads a little-endian float32 / float64 .npy (format 1.0, 2.0 or 3.0).
NpyFile read_npy(const std::string& path) {
  NpyFile f;
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) {
    f.error = "is not a .npy file (no \\x93NUMPY magic)";
    return f;
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const size_t hl_bytes = major == 1 ? 2 : 4, head = 8 + hl_bytes;
  size_t hl = 0;
  for (size_t i = 0; i < hl_bytes && 8 + i < bytes.size(); ++i)
    hl |= size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  if (head + hl > bytes.size()) {
    f.error = "has a header longer than the file";
    return f;
  }
  const std::string h = bytes.substr(head, hl);
  f.descr = header_field(h, "descr");
  f.fortran = header_field(h, "fortran_order").find("True") != std::string::npos;
  f.shape = parse_shape(header_field(h, "shape"));
  const bool f4 = f.descr == "'<f4'", f8 = f.descr == "'<f8'";
  if (!f4 && !f8) {
    f.error = fmt::format("has dtype {}, expected float32 ('<f4') or float64 ('<f8')", f.descr);
    return f;
  }
  int64_t n = 1;
  for (int64_t d : f.shape) n *= d;
  const size_t item = f4 ? 4 : 8, have = bytes.size() - head - hl;
  if (have < size_t(n) * item) {
    f.error = fmt::format("holds {} bytes of data, its shape needs {}", have, size_t(n) * item);
    return f;
  }
  f.data.resize(size_t(n));
  const char* p = bytes.data() + head + hl;
  for (size_t i = 0; i < size_t(n); ++i) {
    if (f4) {
      float x;
      std::memcpy(&x, p + 4 * i, 4);
      f.data[i] = x;
    } else {
      std::memcpy(&f.data[i], p + 8 * i, 8);
    }
  }
  return f;
}

std::string shape_text(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

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
    if (!fs::exists(run.folder + "/" + file)) {
      run.not_provided.push_back(s.name);
      run.problems.push_back(fmt::format("{}: not provided (the adapter did not write {})", s.name, file));
      continue;
    }
    ++found;
    const NpyFile f = read_npy(run.folder + "/" + file);
    std::string bad = f.error;
    if (bad.empty() && f.fortran) bad = "is in Fortran order, expected C order";
    if (bad.empty() && f.shape != want)
      bad = fmt::format("has shape {}, expected {} ({})", shape_text(f.shape), shape_text(want), layout_of(s));
    if (!bad.empty()) {
      run.not_provided.push_back(s.name);
      run.problems.push_back(fmt::format("{}: {} {}", s.name, file, bad));
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
  run.log_tail = file_tail(run.log_file, kLogTailLines);
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
